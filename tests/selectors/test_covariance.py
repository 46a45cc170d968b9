"""Clip-Cov and KL-Cov (selectors/covariance.py) against an independent float64 brute force: Cov_t computed token by
token with Python floats and loop-accumulated means over the valid tokens; KL-Cov's top ⌊k·N⌋ by a Python sort with
row-major tie-breaking; Clip-Cov's random draw checked by its contract (how many, which candidates, seeded, every
candidate reachable). Ragged batches, ties (duplicated rows, quantised values), one-token responses, groups of one,
all-equal rewards, empty candidate sets; garbage on padding (a selector must not read it)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from tests.conftest import compose_config
from tests.helpers.references import grpo_advantages
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors import ClipCovSelector, KLCovSelector, SelectionBatch


# ---------------------------------------------------------------------------------------- brute force
def ref_count(fraction, n):
    """⌊fraction·n⌋ with the fraction read as the decimal it is written as, at least 1."""
    return max(1, math.floor(Fraction(str(fraction)) * n))


def ref_cov(logprobs, adv, lengths):
    """{(i, t): Cov_t} over the valid tokens, Python floats."""
    valid = [(i, t) for i in range(len(lengths)) for t in range(lengths[i])]
    if not valid:
        return {}
    adv_sum, logp_sum = 0.0, 0.0
    for i, t in valid:
        adv_sum += float(adv[i])
        logp_sum += float(logprobs[i, t])
    adv_mean, logp_mean = adv_sum / len(valid), logp_sum / len(valid)
    return {(i, t): (float(adv[i]) - adv_mean) * (float(logprobs[i, t]) - logp_mean) for i, t in valid}


def ref_kl_cov(logprobs, adv, lengths, ratio):
    """(B, T) bool: the top ⌊k·N⌋ (≥ 1) valid tokens by Cov, ties to the earlier row-major position."""
    cov = ref_cov(logprobs, adv, lengths)
    order = sorted(cov, key=lambda pos: (-cov[pos], pos))  # (i, t) tuples sort row-major
    chosen = torch.zeros(logprobs.shape, dtype=torch.bool)
    if order:
        for pos in order[: ref_count(ratio, len(order))]:
            chosen[pos] = True
    return chosen


def ref_candidates(logprobs, adv, lengths, low, high):
    return {pos for pos, c in ref_cov(logprobs, adv, lengths).items() if low < c < high}


# ----------------------------------------------------------------------------------------- fixtures
def make_case(seed, group_size=4, groups=3, T=8, ties=False, one_token=False, advantages="randn", min_len=0):
    """(logprobs, adv, resp, lengths, group_ids); logprobs carry garbage on padding."""
    g = torch.Generator().manual_seed(seed)
    B = group_size * groups
    lengths = [1] * B if one_token else torch.randint(min_len, T + 1, (B,), generator=g).tolist()
    lengths[0] = max(lengths[0], 1)
    logprobs = -torch.rand(B, T, generator=g, dtype=torch.float64) * 4
    group_ids = torch.arange(groups).repeat_interleave(group_size)
    if advantages == "randn":
        adv = torch.randn(B, generator=g, dtype=torch.float64)
    elif advantages == "binary":
        adv = grpo_advantages(torch.randint(0, 2, (B,), generator=g).double().tolist(), group_ids.tolist())
    else:  # all rewards equal: 1 (any group of two or more gets Â = 0) or 0 (every group, a group of one too)
        adv = grpo_advantages([1.0 if advantages == "equal" else 0.0] * B, group_ids.tolist())
    if ties:  # quantised values (exact sums) and a duplicated row in the same group
        logprobs = torch.round(logprobs * 4) / 4
        adv = torch.round(adv * 2) / 2
        logprobs[1], adv[1], lengths[1] = logprobs[0], adv[0], lengths[0]
    resp = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    logprobs = torch.where(resp.bool(), logprobs, 3.0 + torch.rand(B, T, generator=g, dtype=torch.float64))
    return logprobs, adv, resp, lengths, group_ids


def batch_of(logprobs, adv, resp, group_ids, step=3, first_row=0):
    stats = TokenStats(logprobs, torch.zeros_like(logprobs), torch.zeros_like(logprobs))
    return SelectionBatch(
        stats=stats,
        advantages=adv,
        response_mask=resp,
        group_ids=group_ids,
        row_ids=torch.arange(resp.shape[0]) + first_row,
        step=step,
    )


CASES = [dict(seed=s) for s in range(4)] + [
    dict(seed=10, ties=True),
    dict(seed=11, ties=True, advantages="binary"),
    dict(seed=12, one_token=True),
    dict(seed=13, group_size=1, groups=6, advantages="randn"),
    dict(seed=14, advantages="binary", min_len=1),
    dict(seed=15, group_size=8, groups=1, T=5),
    dict(seed=16, group_size=1, groups=7, advantages="binary"),
]
RATIOS = [1e-4, 0.1, 0.29, 0.5, 1.0]


# ------------------------------------------------------------------------------------------- KL-Cov
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ratio", RATIOS)
def test_kl_cov_penalises_the_top_tokens_by_covariance(case, ratio):
    logprobs, adv, resp, lengths, groups = make_case(**case)
    batch = batch_of(logprobs, adv, resp, groups)
    expected = ref_kl_cov(logprobs, adv, lengths, ratio)
    assert int(expected.sum()) == min(ref_count(ratio, sum(lengths)), sum(lengths))
    got = KLCovSelector(ratio=ratio, coef=0.7).select(batch)
    assert torch.equal(got.drift_coef, 0.7 * expected.float())
    assert torch.equal(got.weights, resp.float()) and got.normalizer == "all"
    assert torch.equal(got.clip_low, torch.ones(resp.shape)) and torch.equal(
        got.clip_high, torch.full(resp.shape, math.inf)
    )
    assert got.kl_weights is None and got.advantages is None


def test_kl_cov_counts_the_decimal_fraction():
    """⌊0.29·100⌋ = 29 although 0.29 * 100 == 28.999999999999996 in floats."""
    logprobs, adv, resp, lengths, groups = make_case(0, group_size=10, groups=1, T=10)
    resp = torch.ones_like(resp)
    got = KLCovSelector(ratio=0.29).select(batch_of(logprobs, adv, resp, groups)).drift_coef
    assert int((got != 0).sum()) == 29


def test_kl_cov_ties_go_to_the_earlier_position():
    # rows 0 and 1 identical and holding the largest Cov (largest advantage × largest log-prob): k = 1 picks row 0
    logprobs = torch.tensor(
        [[-0.1, -2.0, -3.0], [-0.1, -2.0, -3.0], [-1.0, -1.5, -2.5], [-2.0, -0.5, -1.0]], dtype=torch.float64
    )
    adv = torch.tensor([2.0, 2.0, -1.0, -1.0], dtype=torch.float64)
    resp = torch.ones(4, 3, dtype=torch.long)
    groups = torch.tensor([0, 0, 0, 0])
    got = KLCovSelector(ratio=1e-3, coef=1.0).select(batch_of(logprobs, adv, resp, groups)).drift_coef
    expected = torch.zeros(4, 3)
    expected[0, 0] = 1.0
    assert torch.equal(got, expected)
    # two of three tied tokens: the first two in row-major order
    got = KLCovSelector(ratio=2 / 12 + 1e-9).select(batch_of(logprobs, adv, resp, groups)).drift_coef
    expected[1, 0] = 1.0
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "case", [dict(seed=20, advantages="equal"), dict(seed=21, group_size=1, groups=7, advantages="zero")]
)
def test_kl_cov_with_zero_covariance_takes_the_first_tokens(case):
    """All advantages 0 → every Cov is 0 → a full tie: the first ⌊k·N⌋ valid tokens in row-major order."""
    logprobs, adv, resp, lengths, groups = make_case(**case)
    assert torch.equal(adv, torch.zeros_like(adv))
    n = sum(lengths)
    k = ref_count(0.3, n)
    flat = [(i, t) for i in range(len(lengths)) for t in range(lengths[i])]
    expected = torch.zeros(resp.shape)
    for pos in flat[:k]:
        expected[pos] = 1.0
    assert torch.equal(
        KLCovSelector(ratio=0.3, coef=1.0).select(batch_of(logprobs, adv, resp, groups)).drift_coef, expected
    )


def test_kl_cov_clipped_keeps_the_algorithm_clip():
    logprobs, adv, resp, lengths, groups = make_case(1)
    got = KLCovSelector(ratio=0.2, coef=2.0, unclipped=False).select(batch_of(logprobs, adv, resp, groups))
    assert got.clip_low is None and got.clip_high is None
    assert torch.equal(got.drift_coef, 2.0 * ref_kl_cov(logprobs, adv, lengths, 0.2).float())


def test_kl_cov_empty_batch():
    resp = torch.zeros(3, 4, dtype=torch.long)
    logprobs = torch.full((3, 4), 5.0, dtype=torch.float64)
    got = KLCovSelector(ratio=0.5).select(
        batch_of(logprobs, torch.randn(3, dtype=torch.float64), resp, torch.arange(3))
    )
    assert torch.equal(got.drift_coef, torch.zeros(3, 4)) and torch.equal(got.weights, torch.zeros(3, 4))


# ----------------------------------------------------------------------------------------- Clip-Cov
def detached(selection, resp):
    """The response tokens a Clip-Cov selection gives weight 0, as a set of (i, t)."""
    assert torch.equal(selection.weights * (1 - resp), torch.zeros(resp.shape))  # nothing outside the response
    zero = (resp.bool() & (selection.weights == 0)).nonzero().tolist()
    return {(i, t) for i, t in zero}


def check_clip_cov(selection, logprobs, adv, resp, lengths, ratio, low, high):
    candidates = ref_candidates(logprobs, adv, lengths, low, high)
    chosen = detached(selection, resp)
    assert len(chosen) == min(ref_count(ratio, sum(lengths)), len(candidates))
    assert chosen <= candidates
    others = resp.bool().clone()
    for pos in chosen:
        others[pos] = False
    assert torch.equal(selection.weights[others], torch.ones(int(others.sum())))
    assert selection.normalizer == "all"
    assert selection.clip_low is None and selection.clip_high is None and selection.drift_coef is None
    return candidates, chosen


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("bounds", [(0.2, 2.0), (-1.0, 0.5), (1.0, 5.0)])
def test_clip_cov_detaches_candidates_only(case, ratio, bounds):
    logprobs, adv, resp, lengths, groups = make_case(**case)
    selector = ClipCovSelector(ratio=ratio, cov_low=bounds[0], cov_high=bounds[1], seed=5)
    selection = selector.select(batch_of(logprobs, adv, resp, groups))
    check_clip_cov(selection, logprobs, adv, resp, lengths, ratio, *bounds)


@pytest.mark.parametrize(
    "case", [dict(seed=30, advantages="equal"), dict(seed=31, group_size=1, groups=6, advantages="zero")]
)
def test_clip_cov_with_all_equal_rewards_detaches_nothing(case):
    logprobs, adv, resp, lengths, groups = make_case(**case)
    assert torch.equal(adv, torch.zeros_like(adv))
    for ratio in (1e-4, 0.5, 1.0):
        selection = ClipCovSelector(ratio=ratio, cov_low=1.0, cov_high=5.0).select(
            batch_of(logprobs, adv, resp, groups)
        )
        assert torch.equal(selection.weights, resp.float())


def test_clip_cov_with_empty_candidate_set_detaches_nothing():
    logprobs, adv, resp, lengths, groups = make_case(2)
    assert not ref_candidates(logprobs, adv, lengths, 50.0, 60.0)
    selection = ClipCovSelector(ratio=1.0, cov_low=50.0, cov_high=60.0).select(batch_of(logprobs, adv, resp, groups))
    assert torch.equal(selection.weights, resp.float())
    # bounds are strict: a Cov exactly at a bound is no candidate (all Cov are 0 here)
    zero_adv = torch.zeros_like(adv)
    selection = ClipCovSelector(ratio=1.0, cov_low=0.0, cov_high=1.0).select(batch_of(logprobs, zero_adv, resp, groups))
    assert torch.equal(selection.weights, resp.float())


def test_clip_cov_empty_batch():
    resp = torch.zeros(2, 3, dtype=torch.long)
    selection = ClipCovSelector(ratio=0.5, cov_low=-1.0, cov_high=1.0).select(
        batch_of(torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, dtype=torch.float64), resp, torch.arange(2))
    )
    assert torch.equal(selection.weights, torch.zeros(2, 3))


def clip_cov_choice(seed, step=3, first_row=0, case=None, ratio=0.1, bounds=(0.1, 3.0)):
    logprobs, adv, resp, lengths, groups = make_case(**(case if case is not None else dict(seed=1)))
    selection = ClipCovSelector(ratio=ratio, cov_low=bounds[0], cov_high=bounds[1], seed=seed).select(
        batch_of(logprobs, adv, resp, groups, step=step, first_row=first_row)
    )
    return frozenset(check_clip_cov(selection, logprobs, adv, resp, lengths, ratio, *bounds)[1])


def test_clip_cov_draw_is_seeded():
    logprobs, adv, resp, lengths, groups = make_case(1)
    candidates = ref_candidates(logprobs, adv, lengths, 0.1, 3.0)
    k = ref_count(0.1, sum(lengths))
    assert len(candidates) > k >= 1  # a real draw
    first = clip_cov_choice(7)
    assert all(clip_cov_choice(7) == first for _ in range(3))  # same seed, step, rows: same choice
    assert len({clip_cov_choice(seed) for seed in range(8)}) > 1  # the seed moves it
    assert len({clip_cov_choice(7, step=step) for step in range(8)}) > 1  # the step moves it
    assert len({clip_cov_choice(7, first_row=row) for row in (0, 12, 24, 36, 48)}) > 1  # and the first row


def test_clip_cov_reaches_every_candidate_and_nothing_else():
    logprobs, adv, resp, lengths, groups = make_case(1)
    candidates = ref_candidates(logprobs, adv, lengths, 0.1, 3.0)
    seen = set()
    for seed in range(150):
        seen |= clip_cov_choice(seed)
    assert seen == candidates


# ----------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: ClipCovSelector(ratio=0.0), "selector.ratio=0.0"),
        (lambda: ClipCovSelector(ratio=1.5), "selector.ratio=1.5"),
        (lambda: ClipCovSelector(cov_low=2.0, cov_high=2.0), "selector.cov_low=2.0"),
        (lambda: ClipCovSelector(normalizer="tokens"), "selector.normalizer='tokens'"),
        (lambda: KLCovSelector(ratio=-0.1), "selector.ratio=-0.1"),
        (lambda: KLCovSelector(coef=-1.0), "selector.coef=-1.0"),
        (lambda: KLCovSelector(stats_policy="new"), "selector.stats_policy='new'"),
    ],
)
def test_bad_settings_name_the_field(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        make()


def test_configs_instantiate_with_their_defaults():
    clip = instantiate(compose_config(["selector=clip_cov", "seed=9"]).selector)
    assert isinstance(clip, ClipCovSelector)
    assert (clip.ratio, clip.cov_low, clip.cov_high, clip.seed, clip.normalizer, clip.stats_policy) == (
        2e-4,
        1.0,
        5.0,
        9,
        "all",
        "current",
    )
    kl = instantiate(compose_config(["selector=kl_cov"]).selector)
    assert isinstance(kl, KLCovSelector)
    assert (kl.ratio, kl.coef, kl.unclipped, kl.normalizer, kl.stats_policy) == (2e-3, 1.0, True, "all", "current")
    with pytest.raises(InstantiationException, match="selector.ratio=2"):
        instantiate(compose_config(["selector=kl_cov", "selector.ratio=2"]).selector)
