"""selectors/forks_oracle.py: the oracle updates exactly the true forks; the matched random control updates, per
response, the oracle's count of tokens at random positions, reproducibly per seed and differently across steps; both
refuse a batch without forks, and a one-step task=forks run with the oracle trains at fork precision 1."""

from __future__ import annotations

import pytest
import torch

from tokenrl.records.marks import ForkMarks
from tokenrl.records.selection import SelectionBatch
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors import ForksMatchedRandomSelector, ForksOracleSelector


def batch(seed: int, step: int = 3, with_forks: bool = True) -> SelectionBatch:
    g = torch.Generator().manual_seed(seed)
    B, T = 10, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    forks = torch.rand(B, T, generator=g) < 0.3  # also outside the response: the selectors must ignore those
    none = torch.zeros(B, T, dtype=torch.bool)
    marks = ForkMarks(forks, forks, none, none, none, torch.zeros(B, dtype=torch.long))
    zeros = torch.zeros(B, T)
    return SelectionBatch(
        stats=TokenStats(zeros, zeros, zeros),
        advantages=torch.randn(B, generator=g),
        response_mask=mask,
        group_ids=torch.arange(B) // 5,
        row_ids=torch.arange(B) + 20,
        step=step,
        forks=marks if with_forks else None,
    )


@pytest.mark.parametrize("seed", range(5))
def test_the_oracle_selects_exactly_the_true_forks_of_each_response(seed):
    view = batch(seed)
    selection = ForksOracleSelector().select(view)
    assert torch.equal(selection.weights.bool(), view.forks.forks & view.response_mask.bool())
    assert selection.normalizer == "selected"


@pytest.mark.parametrize("seed", range(5))
def test_with_forced_the_oracle_also_selects_each_forced_position(seed):
    """`with_forced`: the true forks and every position on the graph that is not a decision (one option), inside the
    response: a loop over random marks, position by position."""
    view = batch(seed)
    g = torch.Generator().manual_seed(100 + seed)
    on_graph, decisions = (torch.rand(view.response_mask.shape, generator=g) < share for share in (0.7, 0.5))
    forks = view.forks.forks & decisions  # forks are decisions
    view.forks = ForkMarks(forks, decisions, on_graph, view.forks.invalid, view.forks.decisive, view.forks.failure)
    got = ForksOracleSelector(with_forced=True).select(view).weights
    rows, width = view.response_mask.shape
    for row in range(rows):
        for t in range(width):
            inside = bool(view.response_mask[row, t])
            forced = bool(on_graph[row, t]) and not bool(decisions[row, t])
            assert got[row, t] == float(inside and (bool(forks[row, t]) or forced)), (row, t)
    assert torch.equal(ForksOracleSelector().select(view).weights.bool(), forks & view.response_mask.bool())


@pytest.mark.parametrize("seed", range(5))
def test_the_matched_control_has_the_oracles_count_per_response_reproducibly_per_seed_and_step(seed):
    view = batch(seed)
    chosen = ForksMatchedRandomSelector(seed=seed).mask(view).bool()
    oracle = ForksOracleSelector().mask(view).bool()
    assert torch.equal(chosen.sum(1), oracle.sum(1))
    assert not (chosen & ~view.response_mask.bool()).any()
    assert torch.equal(chosen, ForksMatchedRandomSelector(seed=seed).mask(batch(seed)).bool())
    others = [ForksMatchedRandomSelector(seed=seed).mask(batch(seed, step=s)).bool() for s in range(4, 9)]
    assert any(not torch.equal(chosen, other) for other in others)  # a new draw each step
    assert not torch.equal(chosen, ForksMatchedRandomSelector(seed=seed + 100).mask(view).bool())
    rows = torch.tensor([1, 4, 7])  # a row's choice depends on its global row id alone (row_local)
    part = SelectionBatch(
        view.stats.rows(rows), view.advantages[rows], view.response_mask[rows], view.group_ids[rows],
        view.row_ids[rows], view.step, forks=view.forks.rows(rows),
    )  # fmt: skip
    assert torch.equal(ForksMatchedRandomSelector(seed=seed).mask(part).bool(), chosen[rows])


def test_the_matched_control_is_not_the_oracle():
    view = batch(0)
    chosen = ForksMatchedRandomSelector(seed=0).mask(view).bool()
    oracle = ForksOracleSelector().mask(view).bool()
    assert chosen.sum() > 0 and not torch.equal(chosen, oracle)


@pytest.mark.parametrize("selector", [ForksOracleSelector(), ForksMatchedRandomSelector()])
def test_a_batch_without_forks_is_refused_naming_the_task(selector):
    with pytest.raises(ValueError, match=rf"selector={selector.name} reads the task's true forks.*use task=forks"):
        selector.select(batch(0, with_forks=False))


def test_a_one_step_forks_run_with_the_oracle_trains_and_updates_only_forks(tiny_cfg):
    from tokenrl.run.training import run

    summary = run(
        tiny_cfg(
            "task=forks",
            "model=forks_tiny",
            "selector=forks_oracle",
            "total_steps=1",
            "task.warmup.steps=100",  # enough for the format: paths that start right, so forks to select
            "rollout.max_new_tokens=8",
        )
    )
    assert summary["optimizer_steps"] == 1 and torch.isfinite(torch.tensor(summary["train/loss"]))
    assert summary["forks/precision"] == 1.0 and summary["forks/precision_in_decisions"] == 1.0
    assert "forks/decision_rate" in summary and "forks/fail_early_stop" in summary
