"""A surrogate added through the registry alone (algorithms/surrogates.py, docs/extending.md "Add a loss"): a
REINFORCE-style pg_t = −r_t·Â_t with no ratio clip (dual-clipped where `algorithm.dual_clip` is set), registered here
and removed at teardown, with no edit of tokenrl. It must (a) give `policy_loss` the loss and gradient of a float64
loop of its formula on random ragged inputs (fractional weights, per-token advantages, KL, both normalisers, the
three aggregations), and (b) be accepted by `AlgorithmConfig.from_node` and the start-up check and train a real
(tiny) model for a step; a name nobody registered is refused naming `algorithm.policy_loss`."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tokenrl.algorithms.config import AlgorithmConfig, LossSettings
from tokenrl.algorithms.grpo import LossNormalizer, policy_loss
from tokenrl.algorithms.surrogates import (
    BUILT_IN_SURROGATES,
    REFUSES_DUAL_CLIP,
    SURROGATES,
    SurrogateTerms,
    dual_clip,
    register_surrogate,
)
from tokenrl.config.check import ConfigError, check_config
from tokenrl.records.loss_inputs import LossInputs
from tokenrl.records.selection import Selection
from tokenrl.run.training import build_components
from tokenrl.step.update import UpdateLoss, loss_terms

NAME = "reinforce_test"
CALLS: list[int] = []


@contextmanager
def restored_registry() -> Iterator[None]:
    """The registry (`SURROGATES`, `REFUSES_DUAL_CLIP`) as it was before, restored in place (the modules that
    imported the dicts keep them) whatever was registered meanwhile."""
    saved = [(names, dict(names)) for names in (SURROGATES, REFUSES_DUAL_CLIP)]
    try:
        yield
    finally:
        for names, before in saved:
            names.clear()
            names.update(before)


@pytest.fixture
def reinforce():
    """`reinforce_test`, registered for the test (the registry restored at teardown, whatever happened)."""

    def reinforce_surrogate(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
        """pg_t = −r_t·Â_t, r_t = exp(clamped log-ratio), no clip; the dual clip caps it where Â_t < 0."""
        CALLS.append(inputs.logp.shape[0])
        pg = -torch.exp(inputs.log_ratio) * inputs.advantages
        pg, capped = dual_clip(pg, inputs.advantages, settings.dual_clip)
        return SurrogateTerms(pg, torch.zeros_like(pg), capped)

    CALLS.clear()
    with restored_registry():
        yield register_surrogate(NAME)(reinforce_surrogate)
    assert NAME not in SURROGATES


def test_the_shipped_surrogates_are_registered_in_order():
    assert BUILT_IN_SURROGATES == ("ppo", "gspo", "gspo_seq", "cispo", "dppo", "sapo")
    assert tuple(SURROGATES)[: len(BUILT_IN_SURROGATES)] == BUILT_IN_SURROGATES


def ragged(seed: int, B: int = 6, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 1, 0, 4, T - 2, 3])
    resp = (torch.arange(T)[None] < lengths[:, None]).float()
    weights = torch.tensor([0.0, 0.5, 1.0, 1.5])[torch.randint(0, 4, (B, T), generator=g)] * resp
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 * resp
    old = (logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)) * resp
    ref = (logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)) * resp
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    return logp, old, ref, adv, resp, weights


def brute_force(logp, old, ref, adv, resp, weights, *, aggregation, normalizer, beta, dual, budget):
    """docs/algorithms.md §1.4 / §11.1 with pg_t = −r_t·Â_t, as loops over python floats."""
    B, T = resp.shape
    pg = [[0.0] * T for _ in range(B)]
    kl = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            r = math.exp(max(-20.0, min(20.0, float(logp[i, t] - old[i, t]))))
            a = float(adv[i, t])
            pg[i][t] = -r * a
            if dual is not None and a < 0:
                pg[i][t] = min(pg[i][t], -dual * a)
            d = float(ref[i, t] - logp[i, t])
            kl[i][t] = math.exp(d) - d - 1
    w = [[float(resp[i, t] * weights[i, t]) for t in range(T)] for i in range(B)]
    chosen = [[float(resp[i, t]) if weights[i, t] != 0 else 0.0 for t in range(T)] for i in range(B)]
    den = chosen if normalizer == "selected" else [[float(resp[i, t]) for t in range(T)] for i in range(B)]
    if aggregation == "token-mean":
        pg_sum = sum(pg[i][t] * w[i][t] for i in range(B) for t in range(T))
        kl_sum = sum(kl[i][t] * chosen[i][t] for i in range(B) for t in range(T))
        return pg_sum / max(sum(map(sum, den)), 1) + beta * kl_sum / max(sum(map(sum, chosen)), 1)
    if aggregation == "seq-mean-token-sum-norm":
        total = sum(pg[i][t] * w[i][t] + beta * kl[i][t] * chosen[i][t] for i in range(B) for t in range(T))
        return total / (B * budget)
    rows = []
    for i in range(B):
        if sum(den[i]) == 0:
            continue
        value = sum(pg[i][t] * w[i][t] for t in range(T)) / sum(den[i])
        value += beta * sum(kl[i][t] * chosen[i][t] for t in range(T)) / max(sum(chosen[i]), 1)
        rows.append(value)
    return sum(rows) / max(len(rows), 1)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("normalizer", ["selected", "all"])
@pytest.mark.parametrize("dual", [None, 1.5])
@pytest.mark.parametrize("seed", range(3))
def test_a_registered_surrogate_matches_its_float64_loop(reinforce, aggregation, normalizer, dual, seed):
    logp, old, ref, adv, resp, weights = ragged(seed)
    settings = LossSettings(
        aggregation=aggregation,
        clip_low=0.2,
        clip_high=0.2,
        policy_loss=NAME,
        dual_clip=dual,
        kl_coef=0.04,
        response_budget=9,
    )
    count = LossNormalizer.count(resp, Selection(weights, normalizer), settings)
    leaf = logp.clone().requires_grad_(True)
    inputs = LossInputs(leaf, old, adv, resp, weights, normalizer=normalizer, ref_logp=ref)
    out = policy_loss(inputs, count, settings)
    out.loss.backward()

    def loop(values):
        return brute_force(
            values,
            old,
            ref,
            adv,
            resp,
            weights,
            aggregation=aggregation,
            normalizer=normalizer,
            beta=0.04,
            dual=dual,
            budget=9,
        )

    expected = loop(logp)
    assert float(out.loss.detach()) == pytest.approx(expected, abs=1e-12, rel=1e-10)
    assert CALLS, "policy_loss did not call the registered surrogate"
    # the gradient of the loop, by central differences in float64, token by token
    step = 1e-6
    for i, t in [(0, 0), (0, 6), (1, 0), (3, 2), (4, 4), (5, 1)]:
        shifted = []
        for sign in (1.0, -1.0):
            moved = logp.clone()
            moved[i, t] += sign * step
            shifted.append(loop(moved))
        numeric = (shifted[0] - shifted[1]) / (2 * step)
        assert float(leaf.grad[i, t]) == pytest.approx(numeric, abs=1e-7, rel=1e-6), (i, t)
    # micro-batches of rows with the mini-batch's normaliser add up to it
    parts = sum(
        float(
            policy_loss(
                LossInputs(logp[r], old[r], adv[r], resp[r], weights[r], normalizer, ref_logp=ref[r]), count, settings
            ).loss
        )
        for r in (torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4]))
    )
    assert parts == pytest.approx(expected, abs=1e-12)


def algorithm_node(**changes) -> dict:
    node = OmegaConf.to_container(compose_config([]).algorithm, resolve=True)
    return {**node, **changes}


def test_the_registry_decides_which_names_the_config_accepts(reinforce):
    cfg = AlgorithmConfig.from_node(algorithm_node(policy_loss=NAME, dual_clip=3.0), max_new_tokens=64)
    assert cfg.loss.policy_loss == NAME and cfg.loss.dual_clip == 3.0
    with pytest.raises(
        ValueError, match=r"algorithm.policy_loss='reinforce_nobody' is not one of \(.*'reinforce_test'\)"
    ):
        AlgorithmConfig.from_node(algorithm_node(policy_loss="reinforce_nobody"), max_new_tokens=64)
    unknown = LossSettings("token-mean", 0.2, 0.2, policy_loss="reinforce_nobody")
    logp, old, ref, adv, resp, weights = ragged(0)
    with pytest.raises(ValueError, match=r"algorithm.policy_loss='reinforce_nobody' is not one of"):
        policy_loss(LossInputs(logp, old, adv, resp, weights), LossNormalizer(1.0, 1.0), unknown)
    with pytest.raises(ValueError, match="already registered"):
        register_surrogate(NAME)(reinforce)


def test_a_surrogate_that_refuses_the_dual_clip_says_why():
    with restored_registry():

        @register_surrogate("no_dual_test", refuses_dual_clip="it is bounded already")
        def bounded(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
            pg = -torch.tanh(inputs.advantages * torch.exp(inputs.log_ratio))
            return SurrogateTerms(pg, torch.zeros_like(pg), torch.zeros_like(pg))

        assert AlgorithmConfig.from_node(algorithm_node(policy_loss="no_dual_test"), 64).loss.policy_loss
        with pytest.raises(ValueError, match=r"algorithm.dual_clip=3.0 does not apply to algorithm.policy_loss="):
            AlgorithmConfig.from_node(algorithm_node(policy_loss="no_dual_test", dual_clip=3.0), 64)
    assert bounded not in REFUSES_DUAL_CLIP
    with pytest.raises(ValueError, match=r"algorithm.policy_loss='no_dual_test' is not one of"):
        AlgorithmConfig.from_node(algorithm_node(policy_loss="no_dual_test"), 64)


def test_a_registered_surrogate_trains_the_tiny_model(reinforce, tiny_cfg):
    """The start-up check accepts the new name, one real rollout step updates with it and moves the weights; a name
    nobody registered is refused by the same check."""
    cfg = tiny_cfg(
        f"algorithm.policy_loss={NAME}",
        "algorithm.dual_clip=3",
        "total_steps=1",
        "selector=uniform",
        "task.verifier=tests.helpers.rewards:length_reward",
    )
    check_config(cfg)
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    assert module.cfg.loss.policy_loss == NAME
    before = {}

    class Before(L.Callback):
        def on_train_start(self, trainer, module) -> None:
            before.update({name: weight.detach().clone() for name, weight in module.policy.state_dict().items()})

    trainer.callbacks.append(Before())
    trainer.fit(module, datamodule=datamodule)
    assert module.run_state.optimizer_steps == 1 and CALLS  # the update went through the registered surrogate
    moved = max(float((weight - before[name]).abs().max()) for name, weight in module.policy.state_dict().items())
    assert moved > 0.0
    with pytest.raises(ConfigError, match=r"algorithm.policy_loss='reinforce_nobody' is not one of"):
        check_config(tiny_cfg("algorithm.policy_loss=reinforce_nobody"))


# ---------------------------------------------------------------------------------------------------------------------
# The door for user code: `algorithm.policy_loss=package.module:function`, and a surrogate's own metrics.
# ---------------------------------------------------------------------------------------------------------------------

HERE = "tests.algorithms.test_surrogate_registry"
ROOT = Path(__file__).resolve().parents[2]
UNIT = LossNormalizer(1.0, 1.0, 1.0)


def ratio_logged(inputs: LossInputs, settings: LossSettings) -> SurrogateTerms:
    """PPO's surrogate, logging r_t (per token) and 7 (a scalar) as its own metrics."""
    ratio = torch.exp(inputs.log_ratio)
    pg = -ratio * inputs.advantages
    return SurrogateTerms(pg, torch.zeros_like(pg), torch.zeros_like(pg), metrics={"ratio": ratio, "seven": 7.0})


def test_a_path_names_a_function_of_user_code_and_a_bad_path_says_how_to_fix_it():
    cfg = AlgorithmConfig.from_node(algorithm_node(policy_loss=f"{HERE}:ratio_logged"), max_new_tokens=64)
    assert cfg.loss.policy_loss == f"{HERE}:ratio_logged"
    fix = r": name a function of a module on PYTHONPATH, or one of \('ppo', "
    for path, problem in [
        ("no_such_module:reinforce", r"cannot be imported \(No module named 'no_such_module'\)"),
        (f"{HERE}:nothing", rf"cannot be imported \(module '{HERE}' has no attribute 'nothing'\)"),
        (":reinforce", r"cannot be imported \(Empty module name\)"),
        (f"{HERE}:NAME", "is not a function"),
    ]:
        with pytest.raises(ValueError, match=rf"^algorithm.policy_loss='{path}' {problem}{fix}"):
            AlgorithmConfig.from_node(algorithm_node(policy_loss=path), max_new_tokens=64)


def test_a_registered_surrogate_named_by_its_path_keeps_its_refusal_of_the_dual_clip():
    with restored_registry():
        register_surrogate("ratio_logged_test", refuses_dual_clip="it is bounded already")(ratio_logged)
        with pytest.raises(ValueError, match=rf"algorithm.policy_loss={HERE}:ratio_logged \(it is bounded already\)"):
            AlgorithmConfig.from_node(algorithm_node(policy_loss=f"{HERE}:ratio_logged", dual_clip=3.0), 64)


def test_a_surrogates_metrics_are_its_means_over_the_selected_tokens_of_the_step():
    """Two micro-batches of rows: `train/surrogate/ratio` is the mean r_t over every selected token of both, however
    the rows were cut; a scalar is itself."""
    logp, old, ref, adv, resp, weights = ragged(1)
    settings = LossSettings("token-mean", 0.2, 0.2, policy_loss=f"{HERE}:ratio_logged")
    cfg = AlgorithmConfig.from_node(algorithm_node(policy_loss=f"{HERE}:ratio_logged"), 64)
    terms = [
        loss_terms(policy_loss(LossInputs(logp[r], old[r], adv[r], resp[r], weights[r]), UNIT, settings))
        for r in (torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4]))
    ]
    metrics = UpdateLoss(None, cfg.loss, None).metrics(terms, 1)
    selected = (resp * (weights != 0)).bool()
    expected = float(torch.exp((logp - old).clamp(-20, 20))[selected].mean())
    assert metrics["surrogate/ratio"] == pytest.approx(expected, rel=1e-12)
    assert metrics["surrogate/seven"] == pytest.approx(7.0, rel=1e-12)


USER_LOSS = """
import torch
from tokenrl.algorithms.surrogates import SurrogateTerms, register_surrogate


@register_surrogate("user_reinforce")
def reinforce(inputs, settings):
    ratio = torch.exp(inputs.log_ratio)
    pg = -ratio * inputs.advantages
    none = torch.zeros_like(pg)
    return SurrogateTerms(pg, none, none, metrics={"ratio": ratio, "user_code": 1.0})
"""


@pytest.mark.slow  # `python train.py -m` in a fresh interpreter: its own PYTHONPATH
def test_a_surrogate_in_a_file_outside_tokenrl_trains_a_step_of_a_sweep_from_the_command_line(tmp_path):
    """A sweep's job runs in a fresh process (hydra_plugins/tokenrl_launcher/fresh_process.py), which imports the
    user's file by the path on the command line; the surrogate's metrics reach the job's metrics.csv."""
    (tmp_path / "user_loss.py").write_text(USER_LOSS)
    sweep_dir = tmp_path / "sweep"
    python_path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "debug=default",
            "total_steps=1",
            "validation.every_n_steps=0",
            "task.verifier=tests.helpers.rewards:length_reward",
            "algorithm.policy_loss=user_loss:reinforce",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(sweep_dir / "0" / "csv" / "metrics.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("train/rollout_step")]
    assert [float(row["train/surrogate/user_code"]) for row in rows] == [1.0]  # the user's surrogate ran
    assert float(rows[0]["train/surrogate/ratio"]) == pytest.approx(1.0, abs=1e-6)  # one optimizer step: r = 1
