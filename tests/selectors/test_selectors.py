"""Every selector against an independent float64 brute force: explicit loops over groups and positions,
JS from full distributions via KL to the midpoint; ragged lengths, ties, empty candidate sets, positions with
a single active rollout, G = 1."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from tests.conftest import compose_config
from tests.helpers.readme import recipe_files
from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.logit_statistics import LogitStatistics
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors import (
    Entropy20Selector,
    ICTComplementSelector,
    ICTSelector,
    RandomSelector,
    SelectionBatch,
    STAPOSelector,
    TokenSelector,
    UniformSelector,
)
from tokenrl.step.fast_path import fused_blocker


# ---------------------------------------------------------------------------------------- brute force
def k_of(fraction, n):
    return 0 if n == 0 else max(1, math.ceil(round(fraction * n, 9)))


def reference_stats(logits, response_ids, lengths, groups, temperature, js_peers="all"):
    """float64, loops over groups, positions and vocabulary entries; `others` averages the peers j ≠ i."""
    B, T, V = logits.shape
    out = {k: [[0.0] * T for _ in range(B)] for k in ("logprobs", "entropy", "renyi2", "js")}
    probs = {}
    for i in range(B):
        for t in range(lengths[i]):
            z = [float(x) / temperature for x in logits[i, t].double()]
            top = max(z)
            e = [math.exp(x - top) for x in z]
            s = sum(e)
            p = [x / s for x in e]
            probs[i, t] = p
            out["logprobs"][i][t] = math.log(p[int(response_ids[i, t])])
            out["entropy"][i][t] = -sum(x * math.log(x) for x in p if x > 0)
            out["renyi2"][i][t] = -math.log(sum(x * x for x in p))
    for g in set(groups):
        members = [i for i in range(B) if groups[i] == g]
        for t in range(T):
            active = [i for i in members if lengths[i] > t]
            if len(active) < 2:
                continue
            for i in active:
                peers = active if js_peers == "all" else [j for j in active if j != i]
                mean = [sum(probs[j, t][v] for j in peers) / len(peers) for v in range(V)]
                p = probs[i, t]
                mid = [(p[v] + mean[v]) / 2 for v in range(V)]
                kl_p = sum(p[v] * math.log(p[v] / mid[v]) for v in range(V) if p[v] > 0)
                kl_m = sum(mean[v] * math.log(mean[v] / mid[v]) for v in range(V) if mean[v] > 0)
                out["js"][i][t] = 0.5 * kl_p + 0.5 * kl_m
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}


def ref_top_sequence(scores, lengths, fraction):
    mask = torch.zeros(scores.shape, dtype=torch.bool)
    for i, n in enumerate(lengths):
        ranked = sorted(range(n), key=lambda t: (-float(scores[i, t]), t))
        for t in ranked[: k_of(fraction, n)]:
            mask[i, t] = True
    return mask


def ref_top_batch(scores, lengths, fraction):
    flat = [(i, t) for i in range(len(lengths)) for t in range(lengths[i])]
    ranked = sorted(range(len(flat)), key=lambda j: (-float(scores[flat[j]]), j))
    mask = torch.zeros(scores.shape, dtype=torch.bool)
    for j in ranked[: k_of(fraction, len(flat))]:
        mask[flat[j]] = True
    return mask


def ref_stapo(logprobs, entropy, adv, lengths, tau_p, q, scope):
    valid = [(i, t) for i in range(len(lengths)) for t in range(lengths[i])]
    cands = [(i, t) for (i, t) in valid if adv[i] > 0 and math.exp(float(logprobs[i, t])) < tau_p]
    keep = torch.zeros(logprobs.shape, dtype=torch.bool)
    for pos in valid:
        keep[pos] = True
    if cands:
        pool = sorted(float(entropy[pos]) for pos in (cands if scope == "candidates" else valid))
        threshold = pool[max(1, math.ceil(round(q * len(pool), 9))) - 1]
        for pos in cands:
            if float(entropy[pos]) <= threshold:
                keep[pos] = False
    return keep


# ----------------------------------------------------------------------------------------- fixtures
def make_case(seed, group_size=4, groups=3, T=9, V=13, ties=True):
    g = torch.Generator().manual_seed(seed)
    B = group_size * groups
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2.5
    if ties:  # identical rollouts (same prefix → same distributions) and quantised logits
        logits[1] = logits[0]
        logits = torch.round(logits * 2) / 2
    lengths = torch.randint(0, T + 1, (B,), generator=g).tolist()
    lengths[0] = lengths[1] = T
    response_ids = torch.randint(0, V, (B, T), generator=g)
    resp = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    group_ids = torch.arange(groups).repeat_interleave(group_size)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logits, response_ids, resp, lengths, group_ids, adv


def batch_of(stats, adv, resp, group_ids, step=100):
    return SelectionBatch(
        stats=stats,
        advantages=adv,
        response_mask=resp,
        group_ids=group_ids,
        row_ids=torch.arange(resp.shape[0]),
        step=step,
    )


CASES = [dict(seed=s) for s in range(3)] + [dict(seed=7, group_size=1, groups=5), dict(seed=8, ties=False)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 5, 1000])
@pytest.mark.parametrize("js_peers", ["all", "others"])
def test_statistics_equal_brute_force(case, temperature, chunk, js_peers):
    logits, ids, resp, lengths, groups, _ = make_case(**case)
    stats = LogitStatistics(temperature, chunk_size=chunk, js_peers=js_peers).of_logits(
        logits.float(), ids, resp, groups, with_js=True
    )
    ref = reference_stats(logits, ids, lengths, groups.tolist(), temperature, js_peers)
    for name in ("logprobs", "entropy", "renyi2", "js"):
        # float32 accumulation: 1e-6 absolute, plus 1e-6 relative for large |log π|
        assert torch.allclose(getattr(stats, name).double(), ref[name], atol=1e-6, rtol=1e-6), name
    if case.get("group_size") == 1:
        assert torch.equal(stats.js, torch.zeros_like(stats.js))


def test_leave_one_out_js_differs_and_is_symmetric_for_two_rollouts():
    logits, ids, resp, lengths, groups, _ = make_case(1, group_size=2, groups=2, T=6, ties=False)
    both = LogitStatistics(1.0, chunk_size=8, js_peers="all").of_logits(logits.float(), ids, resp, groups).js
    others = LogitStatistics(1.0, chunk_size=8, js_peers="others").of_logits(logits.float(), ids, resp, groups).js
    active = (resp[0::2] * resp[1::2]).bool()
    assert torch.allclose(others[0::2][active], others[1::2][active], atol=1e-6)  # JS(p_a ‖ p_b) = JS(p_b ‖ p_a)
    paired = torch.stack([active, active], 1).reshape(resp.shape)  # rows whose partner is active
    assert (others[paired] > both[paired]).all()  # p is farther from the others


def test_single_active_rollout_has_zero_js():
    logits, ids, resp, lengths, groups, _ = make_case(0, group_size=2, groups=1, T=6, ties=False)
    resp[1, 3:] = 0
    stats = LogitStatistics(1.0, chunk_size=4).of_logits(logits.float(), ids, resp, groups)
    assert torch.equal(stats.js[0, 3:], torch.zeros(3)) and (stats.js[:, :3] > 0).all()


def shared_stats(case):
    """Reference float64 stats given to both sides, so the test isolates the selection logic."""
    logits, ids, resp, lengths, groups, adv = make_case(**case)
    ref = reference_stats(logits, ids, lengths, groups.tolist(), 1.0)
    stats = TokenStats(ref["logprobs"], ref["entropy"], ref["renyi2"], ref["js"])
    return stats, resp, lengths, groups, adv


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ratio", [0.05, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("scope", ["sequence", "batch"])
def test_ict_and_complement(case, ratio, scope):
    stats, resp, lengths, groups, adv = shared_stats(case)
    batch = batch_of(stats, adv, resp, groups)
    expected = (ref_top_sequence if scope == "sequence" else ref_top_batch)(stats.js, lengths, ratio)
    got = ICTSelector(ratio=ratio, scope=scope, warmup_steps=20).select(batch)
    assert torch.equal(got.mask.bool(), expected) and got.normalizer == "selected"
    complement = ICTComplementSelector(ratio=ratio, scope=scope, warmup_steps=20).select(batch).mask.bool()
    assert torch.equal(complement, resp.bool() & ~expected)


def test_ict_end_to_end_from_logits():
    logits, ids, resp, lengths, groups, adv = make_case(11)
    stats = LogitStatistics(1.0, chunk_size=7).of_logits(logits.float(), ids, resp, groups)
    ref = reference_stats(logits, ids, lengths, groups.tolist(), 1.0)
    got = ICTSelector(ratio=0.3).select(batch_of(stats, adv, resp, groups)).mask.bool()
    assert torch.equal(got, ref_top_sequence(ref["js"], lengths, 0.3))


def test_warmup_selects_every_token():
    stats, resp, lengths, groups, adv = shared_stats(dict(seed=1))
    for selector in (
        ICTSelector(warmup_steps=20),
        ICTComplementSelector(warmup_steps=20),
        RandomSelector(warmup_steps=20),
    ):
        assert torch.equal(selector.select(batch_of(stats, adv, resp, groups, step=19)).mask, resp.float())
        assert not torch.equal(selector.select(batch_of(stats, adv, resp, groups, step=20)).mask, resp.float())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ratio", [0.2, 0.5])
def test_entropy20(case, ratio):
    stats, resp, lengths, groups, adv = shared_stats(case)
    for normalizer in ("selected", "all"):
        got = Entropy20Selector(ratio=ratio, normalizer=normalizer).select(batch_of(stats, adv, resp, groups))
        assert torch.equal(got.mask.bool(), ref_top_batch(stats.entropy, lengths, ratio))
        assert got.normalizer == normalizer


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "tau_p,q,scope",
    [
        (0.002, 0.75, "candidates"),
        (0.1, 0.75, "candidates"),
        (0.3, 0.5, "candidates"),
        (0.3, 0.8, "all_tokens"),
        (1.0, 1.0, "candidates"),
    ],
)
def test_stapo(case, tau_p, q, scope):
    stats, resp, lengths, groups, adv = shared_stats(case)
    got = STAPOSelector(tau_p=tau_p, q=q, quantile_scope=scope).select(batch_of(stats, adv, resp, groups)).mask
    assert torch.equal(got.bool(), ref_stapo(stats.logprobs, stats.entropy, adv, lengths, tau_p, q, scope))


def test_stapo_with_no_candidates_keeps_everything():
    stats, resp, lengths, groups, adv = shared_stats(dict(seed=2))
    got = STAPOSelector(tau_p=0.3).select(batch_of(stats, -adv.abs() - 1, resp, groups)).mask
    assert torch.equal(got, resp.float())


def test_uniform_keeps_every_response_token():
    stats, resp, lengths, groups, adv = shared_stats(dict(seed=3))
    assert torch.equal(UniformSelector().select(batch_of(stats, adv, resp, groups)).mask, resp.float())


def test_random_keeps_ict_counts_seeded_and_uniform():
    stats, resp, lengths, groups, adv = shared_stats(dict(seed=4))
    batch = batch_of(stats, adv, resp, groups)
    ict = ICTSelector(ratio=0.3, warmup_steps=0).select(batch).mask
    first = RandomSelector(ratio=0.3, warmup_steps=0, seed=1).select(batch).mask
    assert torch.equal(first.sum(1), ict.sum(1)) and torch.equal(first * resp, first)
    assert torch.equal(first, RandomSelector(ratio=0.3, warmup_steps=0, seed=1).select(batch).mask)
    assert not torch.equal(first, RandomSelector(ratio=0.3, warmup_steps=0, seed=2).select(batch).mask)
    # over many steps every position of a row is chosen about equally often
    row = max(range(len(lengths)), key=lambda i: lengths[i])
    counts = torch.zeros(lengths[row])
    selector = RandomSelector(ratio=0.3, warmup_steps=0, seed=0)
    for step in range(600):
        counts += selector.select(batch_of(stats, adv, resp, groups, step=step)).mask[row, : lengths[row]]
    expected = 600 * k_of(0.3, lengths[row]) / lengths[row]
    assert (counts - expected).abs().max() < 5 * math.sqrt(expected)


@pytest.mark.parametrize(
    "override,message",
    [
        ("selector=ict selector_ratio=0", "selector.ratio=0: must be a number in (0, 1]"),
        ("selector=ict selector_ratio=1.5", "must be a number in (0, 1]"),
        ("selector=entropy20 selector.scope=rank", "selector.scope='rank': must be one of sequence, batch, global"),
        ("selector=stapo selector.quantile_scope=x", "quantile_scope='x'"),
        ("selector=random selector_ratio=-1", "selector.ratio=-1"),
        ("selector=ict selector.js_peers=mine", "selector.js_peers='mine': must be one of all, others"),
    ],
)
def test_bad_selector_settings_fail_with_the_setting_named(override, message):
    cfg = compose_config(override.split())
    with pytest.raises(
        InstantiationException,
        match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]"),
    ):
        instantiate(cfg.selector)


# the README's "Add a selector" recipe, exactly as it shows it
RARE_RECIPE = recipe_files()["src/tokenrl/selectors/rare.py"]  # the README's module, verbatim


def test_readme_recipe_selector_takes_the_fast_path_and_others_are_told_why_not():
    """Copied verbatim, the README's RareSelector (scope=sequence) is row-local, so the fused statistics admit it over
    several micro-batches; at scope=batch, or without a scope or `row_local`, the blocker says why and what to set."""
    namespace = {}
    exec(RARE_RECIPE, namespace)
    rare = namespace["RareSelector"]
    cfg = compose_config(["algorithm.micro_batch_size=4"])
    algorithm = AlgorithmConfig.from_node(cfg.algorithm, cfg.rollout.max_new_tokens)
    assert algorithm.batch.ppo_epochs * algorithm.batch.mini_batches == 1
    rows = 2 * algorithm.batch.group_size  # several micro-batches of whole groups
    assert rare().row_local and fused_blocker(algorithm, rare(), False, rows) is None
    batch_scoped = fused_blocker(algorithm, rare(scope="batch"), False, rows)
    assert "selector rare" in batch_scoped and "selector.scope=batch ranks across rows" in batch_scoped

    class Unscoped(TokenSelector):
        name = "unscoped"

        def mask(self, batch):
            return batch.response_mask.float()

    unscoped = fused_blocker(algorithm, Unscoped(), False, rows)
    assert "Unscoped does not declare row_local: set `row_local = True`" in unscoped
