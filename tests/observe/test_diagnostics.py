"""observe/diagnostics.py: the logged overlaps are with the same reference selectors the samples record (one list,
`selectors.reference_selectors`), and each overlap is |A∩B| / |A∪B| with that selector's choice."""

from __future__ import annotations

import pytest
import torch

from tokenrl.algorithms.token_stats import stats_from_logits
from tokenrl.observe.diagnostics import jaccard, selection_diagnostics
from tokenrl.observe.samples import SampleWriter
from tokenrl.selectors import SelectionBatch, reference_selectors


def whole_batch(with_js: bool) -> SelectionBatch:
    g = torch.Generator().manual_seed(0)
    B, T, V = 8, 12, 17
    logits = torch.randn(B, T, V, generator=g) * 2
    ids = torch.randint(0, V, (B, T), generator=g)
    resp = (torch.arange(T)[None] < torch.tensor([12, 9, 12, 5, 12, 12, 7, 3])[:, None]).long()
    groups = torch.arange(2).repeat_interleave(4)
    stats = stats_from_logits(logits, ids, resp, groups, 1.0, chunk_size=64, with_js=with_js)
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
    metrics = selection_diagnostics(weights, batch, forks)
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
