"""EntropyControl (step/entropy_control.py) against a hand-written loop of Skywork-OR1's rule:
c_{k+1} = clip(c_k ± Δ, 0, c_max) (+ when e_k < target), on_{k+1} = [e_k < target], α_k = c_k·on_k, on_0 = 1;
a fixed coefficient (target None) never moves; state_dict/load_state_dict resumes the same sequence."""

from __future__ import annotations

import io

import pytest
import torch

from tokenrl.step.entropy_control import EntropyControl


def entropies(seed, n, target, spread=0.3):
    """n mean entropies around `target`, some exactly at it (not below: the coefficient falls)."""
    g = torch.Generator().manual_seed(seed)
    values = (target + (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * 2 * spread).tolist()
    for k in range(0, n, 7):
        values[k] = target
    return values


def ref_alphas(coef, target, delta, max_coef, observed):
    """α applied at steps 0..n (before each observation, and after the last), Skywork's loop."""
    c, on = coef, True
    alphas = []
    for e in observed:
        alphas.append(c if on else 0.0)
        if e < target:
            c = c + delta
            on = True
        else:
            c = c - delta
            on = False
        if c < 0.0:
            c = 0.0
        if c > max_coef:
            c = max_coef
    alphas.append(c if on else 0.0)
    return alphas


def run(control, observed):
    alphas = []
    for e in observed:
        alphas.append(control.alpha)
        control.observe(e)
    alphas.append(control.alpha)
    return alphas


@pytest.mark.parametrize("coef", [0.0, 1e-3, 0.05])
def test_fixed_coefficient_never_moves(coef):
    control = EntropyControl(coef, target=None, delta=0.01, max_coef=0.1)
    alphas = run(control, entropies(0, 40, 0.5, spread=1.0))
    assert alphas == [coef] * 41 and control.coef == coef


@pytest.mark.parametrize(
    "seed,coef,target,delta,max_coef,spread",
    [
        (0, 0.005, 0.2, 0.0005, 0.005, 0.1),  # Skywork-OR1's values: starts at the cap
        (1, 0.0, 0.5, 0.01, 0.03, 0.3),  # starts at 0: the floor binds
        (2, 0.01, 1.0, 0.004, 0.02, 0.2),
        (3, 0.02, 0.3, 0.05, 0.1, 0.05),  # Δ larger than c: clipped at 0 at once
    ],
)
def test_adaptive_coefficient_follows_skywork_rule(seed, coef, target, delta, max_coef, spread):
    observed = entropies(seed, 60, target, spread)
    expected = ref_alphas(coef, target, delta, max_coef, observed)
    assert run(EntropyControl(coef, target, delta, max_coef), observed) == pytest.approx(expected, abs=1e-15)
    # the sequence does exercise both branches and a bound
    assert 0.0 in expected[1:] and any(a > 0 for a in expected[1:])


def test_on_flag_and_coefficient_by_hand():
    control = EntropyControl(0.02, target=0.5, delta=0.01, max_coef=0.03)
    assert control.alpha == 0.02  # on_0 = 1
    control.observe(0.6)  # above target: c ↓, off
    assert control.coef == pytest.approx(0.01) and control.alpha == 0.0
    control.observe(0.5)  # at the target is not below
    assert control.coef == pytest.approx(0.0) and control.alpha == 0.0
    control.observe(0.7)  # floor
    assert control.coef == 0.0 and control.alpha == 0.0
    control.observe(0.1)  # below: c ↑, on
    assert control.coef == pytest.approx(0.01) and control.alpha == pytest.approx(0.01)
    for _ in range(5):
        control.observe(0.1)  # cap
    assert control.coef == pytest.approx(0.03) and control.alpha == pytest.approx(0.03)


@pytest.mark.parametrize("cut", [0, 1, 17, 39])
def test_state_dict_resumes_the_same_sequence(cut):
    settings = (0.01, 0.5, 0.004, 0.02)
    observed = entropies(5, 40, 0.5, 0.2)
    straight = run(EntropyControl(*settings), observed)
    first = EntropyControl(*settings)
    head = run(first, observed[:cut])[:-1]
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # through a checkpoint's serialisation
    buffer.seek(0)
    resumed = EntropyControl(0.0, 0.5, 0.004, 0.02)  # a fresh run's start, overwritten by the state
    resumed.load_state_dict(torch.load(buffer))
    assert resumed.alpha == first.alpha and resumed.on == first.on and resumed.coef == first.coef
    assert head + run(resumed, observed[cut:]) == straight
