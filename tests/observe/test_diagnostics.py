"""observe/diagnostics.py: the logged overlaps are with the same reference selectors the samples record (one list,
`selectors.reference_selectors`), and each overlap is |A∩B| / |A∪B| with that selector's choice; every `forks/*`
equals a loop over the tokens of responses to random graphs (precision among decisions, AUROC with ties, top-k at
equal budgets, the invalid tokens by kind of position, the failure anatomy)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest
import torch

from tests.data.test_forks_graph import random_small_graph, responses_for
from tokenrl.algorithms.logit_statistics import LogitStatistics
from tokenrl.data.forks_graph import path_marks
from tokenrl.observe.diagnostics import auroc, jaccard, selection_diagnostics, top_k_shares
from tokenrl.observe.samples import SampleWriter
from tokenrl.records.marks import FAILURES, POSITION_MARKS, ForkMarks
from tokenrl.selectors import SelectionBatch, reference_selectors


def whole_batch(with_js: bool) -> SelectionBatch:
    g = torch.Generator().manual_seed(0)
    B, T, V = 8, 12, 17
    logits = torch.randn(B, T, V, generator=g) * 2
    ids = torch.randint(0, V, (B, T), generator=g)
    resp = (torch.arange(T)[None] < torch.tensor([12, 9, 12, 5, 12, 12, 7, 3])[:, None]).long()
    groups = torch.arange(2).repeat_interleave(4)
    stats = LogitStatistics(1.0, chunk_size=64).of_logits(logits, ids, resp, groups, with_js=with_js)
    return SelectionBatch(
        stats=stats,
        advantages=torch.randn(B, generator=g),
        response_mask=resp,
        group_ids=groups,
        row_ids=torch.arange(B),
        step=0,
    )


@pytest.mark.parametrize("with_js", [False, True])
def test_overlaps_and_samples_use_one_list_of_reference_selectors(with_js):
    batch = whole_batch(with_js)
    mask = torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(1)) < 0.3
    metrics = selection_diagnostics(mask, batch)
    names = list(reference_selectors(with_js))
    assert names == (["ict", "entropy20", "stapo"] if with_js else ["entropy20", "stapo"])
    assert sorted(k.removeprefix("select/jaccard_") for k in metrics if k.startswith("select/jaccard_")) == sorted(
        names
    )
    would = SampleWriter.reference_masks(batch)
    assert list(would) == names
    chosen = mask & batch.response_mask.bool()
    for name, reference in would.items():
        assert metrics[f"select/jaccard_{name}"] == pytest.approx(jaccard(chosen, reference))


def forks_only(forks: torch.Tensor) -> ForkMarks:
    """Marks whose decisions are the forks (what the older fork metrics read does not depend on the rest)."""
    none = torch.zeros_like(forks)
    return ForkMarks(forks, forks, torch.ones_like(forks), none, none, torch.zeros(forks.shape[0], dtype=torch.long))


def loop_fork_scores(weights: torch.Tensor, forks: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Token by token in float64: precision, recall and the weight share on forks (absent when undefined)."""
    hits = chosen = true = 0
    on_forks = total = 0.0
    for row in range(weights.shape[0]):
        for t in range(weights.shape[1]):
            if not valid[row, t]:
                continue
            w, fork = float(weights[row, t]), bool(forks[row, t])
            chosen += w != 0
            true += fork
            hits += (w != 0) and fork
            total += w
            on_forks += w if fork else 0.0
    out = {}
    if chosen:
        out.update({"precision": hits / chosen, "weight_on_forks": on_forks / total})
    if true:
        out["recall"] = hits / true
    return out


@pytest.mark.parametrize("seed", range(6))
def test_fork_scores_equal_a_loop_reference_on_random_ragged_batches(seed):
    batch = whole_batch(with_js=True)
    g = torch.Generator().manual_seed(seed)
    forks = torch.rand(batch.response_mask.shape, generator=g) < [0.0, 0.2, 0.5][seed % 3]
    weights = torch.rand(batch.response_mask.shape, generator=g) * (
        torch.rand(batch.response_mask.shape, generator=g) < [0.0, 0.3, 1.0][seed // 2]
    )
    metrics = selection_diagnostics(weights, batch, forks_only(forks))
    expected = loop_fork_scores(weights, forks, batch.response_mask.bool())
    for key, value in expected.items():
        assert metrics[f"forks/{key}"] == pytest.approx(value, rel=1e-12)
    for key in {"precision", "recall", "weight_on_forks"} - set(expected):
        assert f"forks/{key}" not in metrics  # undefined: absent, not zero
    valid = batch.response_mask.bool()
    assert metrics["forks/rate"] == pytest.approx(float((forks & valid).sum() / valid.sum()))
    for name, mask in SampleWriter.reference_masks(batch).items():
        for key, value in loop_fork_scores(mask.double(), forks, valid).items():
            assert metrics[f"forks/{key}_{name}"] == pytest.approx(value, rel=1e-12)
    if (forks & valid).any():
        assert metrics["forks/entropy_forks"] == pytest.approx(float(batch.stats.entropy[forks & valid].mean()))
        assert metrics["forks/js_other"] == pytest.approx(float(batch.stats.js[valid & ~forks].mean()))


def test_no_fork_metrics_without_forks():
    batch = whole_batch(with_js=False)
    assert not [key for key in selection_diagnostics(batch.response_mask, batch) if key.startswith("forks/")]


def graph_batch(seed: int, with_js: bool) -> SelectionBatch:
    """Responses to random graphs (cycles, dead ends, several goals, noise off the graph), one character per token
    and the end token when the response ended, their marks from `path_marks`; statistics from random logits, entropy
    rounded so that scores tie."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < 16:
        graph = random_small_graph(rng)
        response, ended = rng.choice(responses_for(graph, rng)), rng.random() < 0.7
        if response or ended:
            rows.append((path_marks(graph, response, ended), len(response) + ended))
    B, T, V = len(rows), max(length for _, length in rows), 11
    g = torch.Generator().manual_seed(seed)
    marks = {name: torch.zeros(B, T, dtype=torch.bool) for name in POSITION_MARKS}
    mask = torch.zeros(B, T, dtype=torch.long)
    for row, (chars, length) in enumerate(rows):
        mask[row, :length] = 1
        for name, values in chars.positions().items():
            marks[name][row, :length] = torch.tensor(values[:length])
    failure = torch.tensor([FAILURES.index(chars.failure) for chars, _ in rows])
    groups = torch.arange(B // 4).repeat_interleave(4)
    logits = torch.randn(B, T, V, generator=g) * 2
    stats = LogitStatistics(1.0, 64).of_logits(logits, torch.randint(0, V, (B, T), generator=g), mask, groups, with_js)
    stats = dataclasses.replace(stats, entropy=(stats.entropy * 4).round() / 4)
    return SelectionBatch(
        stats=stats,
        advantages=torch.randn(B, generator=g),
        response_mask=mask,
        group_ids=groups,
        row_ids=torch.arange(B),
        step=0,
        forks=ForkMarks(**marks, failure=failure),
    )


def loop_top_k(scores: list[float], k: int) -> list[float]:
    """Each score's expected membership in the top k under a uniformly random tie-break, by enumerating every
    order of the tied scores (few enough here) or, for a large tie, every subset of them."""
    k = min(k, len(scores))
    if k == 0:
        return [0.0] * len(scores)
    threshold = sorted(scores, reverse=True)[k - 1]
    tied = [i for i, v in enumerate(scores) if v == threshold]
    above = sum(v > threshold for v in scores)
    subsets = list(itertools.combinations(tied, k - above))  # every equally likely choice of the tied that fit
    return [
        1.0 if v > threshold else (sum(i in chosen for chosen in subsets) / len(subsets) if v == threshold else 0.0)
        for i, v in enumerate(scores)
    ]


def loop_forks_metrics(weights: torch.Tensor, batch: SelectionBatch, references: dict) -> dict[str, float]:
    """Every new `forks/*` key by a loop over the cells of the batch, in float64."""
    marks, valid = batch.forks, batch.response_mask.bool()
    cells = [(r, t) for r in range(valid.shape[0]) for t in range(valid.shape[1]) if valid[r, t]]
    F = {c for c in cells if marks.forks[c]}
    D = {c for c in cells if marks.decisions[c]}
    on = {c for c in cells if marks.on_graph[c]}
    inv = {c for c in cells if marks.invalid[c]}
    out = {"forks/decision_rate": len(D) / len(cells)}
    null = len(F & D) / len(D) if D else None
    if null is not None:
        out["forks/rate_in_decisions"] = null

    def precision(share: dict) -> float | None:
        among = sum(share.get(c, 0.0) for c in D)
        return sum(share.get(c, 0.0) for c in F & D) / among if among else None

    selections = {"": {c: 1.0 for c in cells if weights[c] != 0}}
    selections.update({f"_{name}": {c: 1.0 for c in cells if mask[c]} for name, mask in references.items()})
    for suffix, share in selections.items():
        p = precision(share)
        if p is not None:
            out[f"forks/precision_in_decisions{suffix}"] = p
            if null is not None:
                out[f"forks/lift_in_decisions{suffix}"] = p - null
    stats = batch.stats
    scores = {"entropy": stats.entropy, "renyi2": stats.renyi2, "surprisal": -stats.logprobs}
    if stats.js is not None:
        scores["js"] = stats.js
    budgets = {"run": len(selections[""])} | {
        f: math.ceil(round(int(f) / 100 * len(cells), 9)) for f in "10 20 30".split()
    }
    for name, values in scores.items():
        pos = [float(values[c]) for c in F & D]
        neg = [float(values[c]) for c in D - F]
        if pos and neg:
            out[f"forks/auroc_{name}"] = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
        for budget, k in budgets.items():
            share = dict(zip(cells, loop_top_k([float(values[c]) for c in cells], k)))
            p = precision(share)
            if p is not None:
                out[f"forks/precision_in_decisions_{name}@{budget}"] = p
                if budget == "run" and null is not None:
                    out[f"forks/lift_in_decisions_{name}@run"] = p - null
    kinds = {"forks/invalid_at_forks": F, "forks/invalid_at_decisions": D - F, "forks/invalid_at_forced": on - D}
    kinds["forks/invalid_nonfork"] = on - F
    for key, where in kinds.items():
        if where:
            out[key] = len(where & inv) / len(where)
    responses = range(valid.shape[0])
    failed = [r for r in responses if FAILURES[int(marks.failure[r])] != "none"]
    kind = {}
    for r in failed:
        at = [c for c in cells if c[0] == r and marks.decisive[c]]
        kind[r] = None if not at else "fork" if at[0] in F else "decision" if at[0] in D else "forced"
    counts = {f"forks/fail_{way}": sum(FAILURES[int(marks.failure[r])] == way for r in failed) for way in FAILURES[1:]}
    for name in ("fork", "decision", "forced"):
        counts[f"forks/fail_invalid_letter_{name}"] = sum(
            FAILURES[int(marks.failure[r])] == "invalid_letter" and kind[r] == name for r in failed
        )
    out["forks/fail_rate"] = len(failed) / len(responses)  # absolute rates: over every response, failing or not
    out.update({f"{key}_of_all": n / len(responses) for key, n in counts.items()})
    if failed:
        out.update({key: n / len(failed) for key, n in counts.items()})
        out["forks/fail_at_fork"] = sum(kind[r] == "fork" for r in failed) / len(failed)
        decided = [r for r in failed if kind[r] is not None]
        if decided:
            out["forks/fail_decided_updated"] = sum(
                any(marks.decisive[c] and weights[c] != 0 for c in cells if c[0] == r) for r in decided
            ) / len(decided)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_forks_metrics_equal_a_loop_over_responses_to_random_graphs(seed):
    batch = graph_batch(seed, with_js=seed % 2 == 0)
    g = torch.Generator().manual_seed(seed)
    density = [0.0, 0.3, 1.0][seed % 3]
    weights = torch.rand(batch.response_mask.shape, generator=g) * (
        torch.rand(batch.response_mask.shape, generator=g) < density
    )
    metrics = selection_diagnostics(weights, batch)  # the marks come with the batch (`SelectionBatch.forks`)
    references = SampleWriter.reference_masks(batch)
    expected = loop_forks_metrics(weights, batch, references)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    new = {k for k in metrics if k.startswith("forks/")} - {k for k in metrics if k in loop_fork_keys(metrics)}
    assert new == set(expected), sorted(new ^ set(expected))  # nothing more is logged, nothing is missing
    assert any(k.startswith("forks/fail_") for k in expected) and "forks/auroc_entropy" in expected


def loop_deciding_token_reach(mask: torch.Tensor, batch: SelectionBatch) -> float | None:
    """Of the failed responses decided at a token, the share whose deciding token `mask` updates: a plain loop over
    rows and positions in Python floats (None when no failure is decided at a token)."""
    marks, valid = batch.forks, batch.response_mask.bool()
    reached = decided = 0
    for r in range(valid.shape[0]):
        if FAILURES[int(marks.failure[r])] == "none":
            continue
        deciding = [t for t in range(valid.shape[1]) if valid[r, t] and marks.decisive[r, t]]
        if deciding:
            decided += 1
            reached += any(bool(mask[r, t] != 0) for t in deciding)
    return reached / decided if decided else None


@pytest.mark.parametrize("seed", range(24))
def test_deciding_token_reach_equals_a_brute_force_loop_on_random_graphs(seed):
    """issue #48: `forks/fail_decided_updated`, the deciding-token reach, for a random sparse mask, for the true forks
    (the oracle: its reach is the share of decided failures decided at a fork) and for every token (uniform: 1)."""
    batch = graph_batch(seed, with_js=False)
    valid = batch.response_mask.bool()
    g = torch.Generator().manual_seed(1000 + seed)
    masks = {
        "random": (torch.rand(valid.shape, generator=g) < [0.1, 0.33, 0.6][seed % 3]).float() * valid,
        "oracle": batch.forks.forks.float() * valid,
        "uniform": valid.float(),
    }
    for name, mask in masks.items():
        expected = loop_deciding_token_reach(mask, batch)
        got = selection_diagnostics(mask, batch).get("forks/fail_decided_updated")
        if expected is None:
            assert got is None, name
        else:
            assert got == pytest.approx(expected, rel=0, abs=1e-12), name
    if loop_deciding_token_reach(masks["uniform"], batch) is not None:
        assert selection_diagnostics(masks["uniform"], batch)["forks/fail_decided_updated"] == 1.0


def test_absolute_failure_rates_are_the_shares_times_the_failure_rate_and_zero_when_nothing_fails():
    ways = [*FAILURES[1:], "invalid_letter_fork", "invalid_letter_decision", "invalid_letter_forced"]
    for seed in range(6):
        batch = graph_batch(seed, False)
        metrics = selection_diagnostics(torch.ones(batch.response_mask.shape), batch)
        rate = metrics["forks/fail_rate"]
        for way in ways:
            share = metrics.get(f"forks/fail_{way}", 0.0)
            assert metrics[f"forks/fail_{way}_of_all"] == pytest.approx(share * rate, abs=1e-12)
        assert sum(metrics[f"forks/fail_{way}_of_all"] for way in FAILURES[1:]) == pytest.approx(rate)
    batch = graph_batch(0, False)
    none_fail = dataclasses.replace(batch.forks, failure=torch.zeros_like(batch.forks.failure))
    metrics = selection_diagnostics(torch.ones(batch.response_mask.shape), dataclasses.replace(batch, forks=none_fail))
    assert metrics["forks/fail_rate"] == 0.0 and metrics["forks/fail_wrong_branch_of_all"] == 0.0
    assert "forks/fail_wrong_branch" not in metrics and "forks/fail_decided_updated" not in metrics


def loop_fork_keys(metrics: dict) -> set[str]:
    """The fork metrics the earlier test checks (precision, recall, weight share, rate, signals at forks)."""
    old = ("forks/precision", "forks/recall", "forks/weight_on_forks", "forks/rate", "forks/entropy_", "forks/js_")
    return {k for k in metrics if k.startswith(old) and not k.startswith(("forks/precision_in", "forks/rate_in"))}


def test_top_k_shares_are_the_expected_membership_under_a_random_tie_break():
    rng = random.Random(3)
    for _ in range(200):
        values = [float(rng.choice([0.0, 0.5, 1.0, 2.0])) for _ in range(rng.randint(1, 8))]
        k = rng.randint(0, len(values) + 1)
        shares = top_k_shares(torch.tensor([values]), torch.ones(1, len(values), dtype=torch.bool), k)
        assert shares[0].tolist() == pytest.approx(loop_top_k(values, k))
        assert float(shares.sum()) == pytest.approx(min(k, len(values)))


def test_auroc_counts_ties_as_one_half_and_is_absent_for_an_empty_class():
    scores = torch.tensor([0.1, 0.5, 0.5, 0.9, 0.5])
    positive = torch.tensor([False, True, False, True, False])
    assert auroc(scores, positive, ~positive) == pytest.approx((1 + 0.5 + 0.5 + 1 + 1 + 1) / 6)
    assert auroc(scores, positive, torch.zeros(5, dtype=torch.bool)) is None


def test_the_oracle_selection_scores_precision_one_among_decisions_and_overall():
    batch = graph_batch(0, with_js=False)
    metrics = selection_diagnostics(batch.forks.forks.float() * batch.response_mask, batch)
    assert metrics["forks/precision"] == 1.0 and metrics["forks/precision_in_decisions"] == 1.0
    assert metrics["forks/lift_in_decisions"] == pytest.approx(1.0 - metrics["forks/rate_in_decisions"])
