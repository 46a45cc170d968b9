"""GTPO (selectors/gtpo.py) against an independent float64 brute force: per group and per position, explicit loops
over the active rows of O+ (Â > 0) and O− (Â < 0) for the shaped rewards r̃, then the standardisation (unbiased std
+ ε) over the group's scored tokens (`joint`) or each set's (`separate`); a part with one token gets 0, rows with
Â = 0 and padding get 0. Ragged groups (empty responses, interleaved group ids), ties, one-token responses, groups of
one, all-equal rewards, zero entropies; garbage on padding."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from tests.conftest import compose_config
from tests.helpers.references import grpo_advantages
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors import GTPOSelector, SelectionBatch


# ---------------------------------------------------------------------------------------- brute force
def ref_gtpo(entropy, adv, lengths, group_ids, alpha1, alpha2, eps, normalize):
    B, T = entropy.shape
    out = [[0.0] * T for _ in range(B)]
    for g in sorted(set(group_ids)):
        members = [i for i in range(B) if group_ids[i] == g]
        good = [i for i in members if float(adv[i]) > 0]
        bad = [i for i in members if float(adv[i]) < 0]
        shaped = {}
        for t in range(T):
            active = [i for i in good if lengths[i] > t]
            if active:
                d = len(active)
                total = 0.0
                for k in active:
                    total += float(entropy[k, t])
                for i in active:
                    share = float(entropy[i, t]) / total if total > 0 else 1.0 / d
                    shaped[i, t] = alpha1 + alpha2 * d * share
            active = [j for j in bad if lengths[j] > t]
            if active:
                h = len(active)
                total = 0.0
                for k in active:
                    total += 1.0 / (float(entropy[k, t]) + eps)
                for j in active:
                    shaped[j, t] = -alpha1 - alpha2 * h * (1.0 / (float(entropy[j, t]) + eps)) / total
        if normalize == "joint":
            parts = [list(shaped)]
        else:
            parts = [[pos for pos in shaped if pos[0] in good], [pos for pos in shaped if pos[0] in bad]]
        for part in parts:
            if len(part) == 1:
                out[part[0][0]][part[0][1]] = 0.0
            elif len(part) > 1:
                mean = 0.0
                for pos in part:
                    mean += shaped[pos]
                mean /= len(part)
                square = 0.0
                for pos in part:
                    square += (shaped[pos] - mean) ** 2
                std = math.sqrt(square / (len(part) - 1))
                for pos in part:
                    out[pos[0]][pos[1]] = (shaped[pos] - mean) / (std + eps)
    return torch.tensor(out, dtype=torch.float64)


# ----------------------------------------------------------------------------------------- fixtures
def make_case(
    seed,
    group_size=4,
    groups=3,
    T=7,
    rewards="ternary",
    ties=False,
    one_token=False,
    zero_entropy=False,
    interleave=False,
):
    """(entropy, adv, resp, lengths, group_ids); entropy carries garbage on padding."""
    g = torch.Generator().manual_seed(seed)
    B = group_size * groups
    lengths = [1] * B if one_token else torch.randint(0, T + 1, (B,), generator=g).tolist()
    group_ids = (torch.arange(B) % groups) if interleave else torch.arange(groups).repeat_interleave(group_size)
    if rewards == "ternary":  # {0, 0.5, 1}: mixed groups, and rows with Â = 0 where the reward is the group's mean
        values = (torch.randint(0, 3, (B,), generator=g).double() / 2).tolist()
        adv = grpo_advantages(values, group_ids.tolist())
    elif rewards == "binary":
        adv = grpo_advantages(torch.randint(0, 2, (B,), generator=g).double().tolist(), group_ids.tolist())
    elif rewards in ("equal", "zero"):  # 1: Â = 0 in groups of two or more; 0: Â = 0 in every group
        adv = grpo_advantages([1.0 if rewards == "equal" else 0.0] * B, group_ids.tolist())
    else:
        adv = torch.randn(B, generator=g, dtype=torch.float64)
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    entropy[entropy < 0.15] = 0.0  # some zero entropies
    if ties:
        entropy = torch.round(entropy * 2) / 2
        entropy[1], adv[1], lengths[1] = entropy[0], adv[0], lengths[0]
    if zero_entropy:
        entropy = torch.zeros_like(entropy)
    resp = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    entropy = torch.where(resp.bool(), entropy, 9.0 + torch.rand(B, T, generator=g, dtype=torch.float64))
    return entropy, adv, resp, lengths, group_ids


def batch_of(entropy, adv, resp, group_ids):
    stats = TokenStats(torch.zeros_like(entropy), entropy, torch.zeros_like(entropy))
    return SelectionBatch(
        stats=stats,
        advantages=adv,
        response_mask=resp,
        group_ids=group_ids,
        row_ids=torch.arange(resp.shape[0]),
        step=0,
    )


CASES = [dict(seed=s) for s in range(4)] + [
    dict(seed=10, rewards="randn"),
    dict(seed=11, rewards="binary", interleave=True),
    dict(seed=12, ties=True),
    dict(seed=13, ties=True, rewards="randn", T=4),
    dict(seed=14, one_token=True, group_size=5, groups=2),
    dict(seed=15, zero_entropy=True),
    dict(seed=16, rewards="randn", group_size=1, groups=5),
    dict(seed=17, rewards="binary", group_size=1, groups=5),
]
SETTINGS = [(1.0, 0.1, 1e-6), (0.5, 2.0, 1e-6), (0.0, 1.0, 0.1), (1.0, 0.0, 1e-6)]


def check(case, alpha1, alpha2, eps, normalize):
    entropy, adv, resp, lengths, groups = make_case(**case)
    selector = GTPOSelector(alpha1=alpha1, alpha2=alpha2, normalize=normalize, eps=eps)
    got = selector.token_advantages(batch_of(entropy, adv, resp, groups))
    expected = ref_gtpo(entropy, adv, lengths, groups.tolist(), alpha1, alpha2, eps, normalize)
    assert got.shape == expected.shape
    assert torch.allclose(got.double(), expected, atol=1e-6, rtol=0), (got.double() - expected).abs().max()
    unscored = ~resp.bool() | (adv == 0)[:, None]
    assert torch.equal(got[unscored], torch.zeros(int(unscored.sum())))  # padding and Â = 0 rows: exactly 0
    return entropy, adv, resp, lengths, groups, got


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("alpha1,alpha2,eps", SETTINGS)
@pytest.mark.parametrize("normalize", ["joint", "separate"])
def test_token_advantages_equal_brute_force(case, alpha1, alpha2, eps, normalize):
    check(case, alpha1, alpha2, eps, normalize)


def test_cases_cover_the_edge_cases():
    """The random cases above do hold what they are meant to: Â = 0 rows next to scored ones, empty responses,
    zero entropies, and sets whose positions have a single active row."""
    entropy, adv, resp, lengths, groups = make_case(0)
    assert (adv == 0).any() and (adv > 0).any() and (adv < 0).any() and 0 in lengths
    assert ((entropy == 0) & resp.bool()).any()


@pytest.mark.parametrize(
    "case", [dict(seed=20, rewards="equal"), dict(seed=21, rewards="zero", group_size=1, groups=6)]
)
@pytest.mark.parametrize("normalize", ["joint", "separate"])
def test_groups_without_a_signal_get_zero(case, normalize):
    entropy, adv, resp, lengths, groups = make_case(**case)
    assert torch.equal(adv, torch.zeros_like(adv))
    got = GTPOSelector(normalize=normalize).select(batch_of(entropy, adv, resp, groups))
    assert torch.equal(got.advantages, torch.zeros(resp.shape))
    assert torch.equal(got.weights, resp.float()) and got.normalizer == "selected"


@pytest.mark.parametrize(
    "case", [dict(seed=s) for s in range(4)] + [dict(seed=12, ties=True), dict(seed=15, zero_entropy=True)]
)
@pytest.mark.parametrize("alpha1,alpha2,eps", SETTINGS[:3])
def test_joint_keeps_every_good_token_above_every_bad_token(case, alpha1, alpha2, eps):
    """Joint standardisation is one increasing affine map per group, and r̃ ≥ α1 on O+, r̃ < −α1 ≤ 0 on O−."""
    entropy, adv, resp, lengths, groups, got = check(case, alpha1, alpha2, eps, "joint")
    checked = 0
    for g in groups.unique():
        good = (groups == g) & (adv > 0)
        bad = (groups == g) & (adv < 0)
        good_tokens = got[good[:, None] & resp.bool()]
        bad_tokens = got[bad[:, None] & resp.bool()]
        if len(good_tokens) and len(bad_tokens):
            assert good_tokens.min() > bad_tokens.max()
            checked += 1
    assert checked


@pytest.mark.parametrize("normalize", ["joint", "separate"])
def test_a_group_of_one_gets_no_token_advantage(normalize):
    """A lone rollout (Â = R by verl's rule) is alone at every position: share 1, r̃ = ±(α1 + α2) on every token,
    which standardise to 0."""
    entropy, adv, resp, lengths, groups = make_case(17, rewards="binary", group_size=1, groups=5)
    assert (adv != 0).any()
    got = GTPOSelector(alpha2=0.5, normalize=normalize).token_advantages(batch_of(entropy, adv, resp, groups))
    assert got.abs().max() < 1e-6


def test_hand_computed_group():
    """One group, two good rows and one bad row, by hand: position 0 has d = 2, h = 1; position 1 has d = 1."""
    entropy = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.5, 0.0]], dtype=torch.float64)
    resp = torch.tensor([[1, 1], [1, 0], [1, 0]])
    adv = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64)
    got = GTPOSelector(alpha1=1.0, alpha2=1.0, eps=1e-6, normalize="separate").token_advantages(
        batch_of(entropy, adv, resp, torch.zeros(3, dtype=torch.long))
    )
    # O+: r = 1 + 2·1/4 = 1.5, 1 + 2·3/4 = 2.5 (t = 0); 1 + 1·2/2 = 2 (t = 1): mean 2, std 0.5
    expected = torch.tensor([[-0.5, 0.0], [0.5, 0.0], [0.0, 0.0]], dtype=torch.float64) / (0.5 + 1e-6)
    assert torch.allclose(got.double(), expected, atol=1e-6)  # O− has one token: 0


def test_gtpo_is_row_local_over_whole_groups():
    entropy, adv, resp, lengths, groups = make_case(3, interleave=True)
    selector = GTPOSelector(alpha2=0.5)
    assert selector.row_local and selector.reads_groups
    full = selector.token_advantages(batch_of(entropy, adv, resp, groups))
    index = (groups != 1).nonzero().squeeze(1)  # whole groups 0 and 2
    part = selector.token_advantages(batch_of(entropy[index], adv[index], resp[index], groups[index]))
    assert torch.allclose(part, full[index], atol=1e-6)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(normalize="both"), "selector.normalize='both'"),
        (dict(alpha1=-1.0), "selector.alpha1=-1.0"),
        (dict(alpha2=-0.1), "alpha2=-0.1"),
        (dict(eps=0.0), "selector.eps=0.0"),
        (dict(normalizer="tokens"), "selector.normalizer='tokens'"),
    ],
)
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        GTPOSelector(**kwargs)


def test_config_instantiates_with_its_defaults():
    gtpo = instantiate(compose_config(["selector=gtpo"]).selector)
    assert isinstance(gtpo, GTPOSelector)
    assert (gtpo.alpha1, gtpo.alpha2, gtpo.normalize, gtpo.eps, gtpo.normalizer, gtpo.stats_policy) == (
        1.0,
        0.1,
        "joint",
        1e-6,
        "selected",
        "old",
    )
    with pytest.raises(InstantiationException, match=r"selector\.normalize='x'"):
        instantiate(compose_config(["selector=gtpo", "selector.normalize=x"]).selector)
