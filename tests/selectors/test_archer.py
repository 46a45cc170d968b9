"""Archer (selectors/archer.py) against an independent float64 brute force: per response, the linear-interpolation
q-quantile of its valid tokens' entropies by hand (sort, position q·(n−1), interpolate), high = H > quantile (ties at
the quantile are low); clip ranges, KL weights and weights token by token. Ragged batches with empty and one-token
responses, ties, q = 0 and q = 1, garbage on padding; invalid settings name their field."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from tests.conftest import compose_config
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors import ArcherSelector, SelectionBatch


# ---------------------------------------------------------------------------------------- brute force
def ref_quantile(values, q):
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lo = math.floor(position)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (position - lo) * (ordered[hi] - ordered[lo])


def ref_high(entropy, lengths, q):
    """(B, T) bool: the valid tokens whose entropy exceeds their response's q-quantile."""
    high = torch.zeros(entropy.shape, dtype=torch.bool)
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        values = [float(entropy[i, t]) for t in range(n)]
        threshold = ref_quantile(values, q)
        for t in range(n):
            high[i, t] = values[t] > threshold
    return high


def ref_selection(entropy, lengths, q, low_clip, high_clip, high_kl):
    """Per-token weights, clip (valid tokens; NaN on padding: not checked) and KL weights, Python loops."""
    B, T = entropy.shape
    high = ref_high(entropy, lengths, q)
    weights = [[0.0] * T for _ in range(B)]
    clip = [[math.nan] * T for _ in range(B)]
    kl = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(lengths[i]):
            weights[i][t] = 1.0
            clip[i][t] = high_clip if high[i, t] else low_clip
            kl[i][t] = high_kl if high[i, t] else 1.0

    def as_tensor(rows):
        return torch.tensor(rows, dtype=torch.float32)

    return high, as_tensor(weights), as_tensor(clip), as_tensor(kl)


# ----------------------------------------------------------------------------------------- fixtures
def make_case(seed, B=8, T=9, ties=False, one_token=False):
    """(entropy, resp, lengths); entropy carries garbage on padding; some responses are empty."""
    g = torch.Generator().manual_seed(seed)
    lengths = [1] * B if one_token else torch.randint(0, T + 1, (B,), generator=g).tolist()
    if not one_token:
        lengths[0], lengths[1] = T, 1
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    if ties:  # few distinct values, and a duplicated row
        entropy = torch.round(entropy * 2) / 2
        entropy[2], lengths[2] = entropy[0], lengths[0]
    resp = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    entropy = torch.where(resp.bool(), entropy, 50.0 + torch.rand(B, T, generator=g, dtype=torch.float64))
    return entropy, resp, lengths


def batch_of(entropy, resp, step=0):
    stats = TokenStats(torch.zeros_like(entropy), entropy, torch.zeros_like(entropy))
    return SelectionBatch(
        stats=stats,
        advantages=torch.zeros(resp.shape[0], dtype=torch.float64),
        response_mask=resp,
        group_ids=torch.arange(resp.shape[0]) // 2,
        row_ids=torch.arange(resp.shape[0]),
        step=step,
    )


def check(entropy, resp, lengths, q, low_clip=0.2, high_clip=0.5, high_kl=0.0, normalizer="selected"):
    selector = ArcherSelector(
        quantile=q,
        low_entropy_clip=low_clip,
        high_entropy_clip=high_clip,
        high_entropy_kl_weight=high_kl,
        normalizer=normalizer,
    )
    got = selector.select(batch_of(entropy, resp))
    high, weights, clip, kl = ref_selection(entropy, lengths, q, low_clip, high_clip, high_kl)
    valid = resp.bool()
    assert torch.equal(selector.high_entropy(batch_of(entropy, resp)), high)
    assert torch.equal(got.weights, weights) and torch.equal(got.weights, resp.float())
    assert torch.equal(got.clip_low[valid], clip[valid]) and torch.equal(got.clip_high[valid], clip[valid])
    assert torch.equal(got.kl_weights, kl)
    assert got.normalizer == normalizer and got.advantages is None and got.drift_coef is None
    return high


CASES = [dict(seed=s) for s in range(4)] + [
    dict(seed=10, ties=True),
    dict(seed=11, ties=True, T=4),
    dict(seed=12, one_token=True),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("q", [0.0, 0.2, 0.5, 0.75, 0.8, 1.0])
def test_archer_equals_brute_force(case, q):
    entropy, resp, lengths = make_case(**case)
    high = check(entropy, resp, lengths, q)
    for i, n in enumerate(lengths):
        if n == 1:
            assert not high[i].any()  # a one-token response has no high-entropy token
    if q == 1.0:
        assert not high.any()  # nothing exceeds the maximum
    if q == 0.0:  # everything above the minimum
        for i, n in enumerate(lengths):
            if n:
                low = min(float(entropy[i, t]) for t in range(n))
                assert [bool(high[i, t]) for t in range(n)] == [float(entropy[i, t]) > low for t in range(n)]


@pytest.mark.parametrize(
    "low_clip,high_clip,high_kl,normalizer",
    [(0.1, 0.3, 0.25, "all"), (0.2, 0.2, 1.0, "selected"), (0.0, 1.0, 0.0, "selected")],
)
def test_archer_settings(low_clip, high_clip, high_kl, normalizer):
    entropy, resp, lengths = make_case(3)
    high = check(entropy, resp, lengths, 0.6, low_clip, high_clip, high_kl, normalizer)
    assert high.any() and (resp.bool() & ~high).any()


def test_ties_at_the_quantile_are_low():
    entropy = torch.tensor(
        [
            [1.0, 2.0, 2.0, 0.5, 2.0, 3.0],  # q=0.5 → 2.0: only 3.0 is high
            [0.1, 0.7, 0.4, 0.7, 0.9, 0.2],  # q=0.5, n=6: position 2.5, between 0.4 and 0.7
            [1.5, 1.5, 1.5, 1.5, 0.0, 0.0],
        ],  # all equal (4 tokens): none high
        dtype=torch.float64,
    )
    resp = torch.tensor([[1] * 6, [1] * 6, [1] * 4 + [0] * 2])
    high = check(entropy, resp, [6, 6, 4], 0.5)
    assert high.tolist() == [
        [False, False, False, False, False, True],
        [False, True, False, True, True, False],
        [False] * 6,
    ]
    # q·(n−1) an integer: the quantile is a token's own entropy, which stays low
    entropy = torch.tensor([[0.3, 0.1, 0.5, 0.2, 0.4, 0.6]], dtype=torch.float64)
    high = check(entropy, torch.ones(1, 6, dtype=torch.long), [6], 0.8)  # position 4: 0.5
    assert high.tolist() == [[False, False, False, False, False, True]]


def test_archer_is_row_local():
    entropy, resp, lengths = make_case(2)
    selector = ArcherSelector(quantile=0.7)
    assert selector.row_local and selector.weighs_kl
    full = selector.select(batch_of(entropy, resp))
    index = torch.tensor([5, 0, 3])
    part = selector.select(batch_of(entropy[index], resp[index]))
    for name in ("weights", "clip_low", "clip_high", "kl_weights"):
        assert torch.equal(getattr(part, name), getattr(full, name)[index]), name


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(quantile=-0.1), "selector.quantile=-0.1"),
        (dict(quantile=1.5), "selector.quantile=1.5"),
        (dict(low_entropy_clip=-0.2), "selector.low_entropy_clip=-0.2"),
        (dict(high_entropy_clip=-1.0), "selector.high_entropy_clip=-1.0"),
        (dict(high_entropy_kl_weight=-0.5), "selector.high_entropy_kl_weight=-0.5"),
        (dict(normalizer="tokens"), "selector.normalizer='tokens'"),
        (dict(stats_policy="new"), "selector.stats_policy='new'"),
    ],
)
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        ArcherSelector(**kwargs)


def test_config_instantiates_with_the_official_defaults():
    archer = instantiate(compose_config(["selector=archer"]).selector)
    assert isinstance(archer, ArcherSelector)
    assert (
        archer.quantile,
        archer.low_clip,
        archer.high_clip,
        archer.high_kl_weight,
        archer.normalizer,
        archer.stats_policy,
    ) == (0.8, 0.2, 0.5, 0.0, "selected", "current")
    with pytest.raises(InstantiationException, match=r"selector\.quantile=1\.5"):
        instantiate(compose_config(["selector=archer", "selector.quantile=1.5"]).selector)
