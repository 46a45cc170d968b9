"""`algorithm.micro_batch_tokens` (step/micro_batches.py's `MicroBatchCut`, docs/algorithms.md §12.4) through the
passes and the update, on the tiny float64 Qwen2 and the ragged rollouts of test_fused_update.py: each pass counts a
micro-batch's tokens as its own forward runs them; a token budget changes how a step is cut, never its result (the
update's gradient, the statistics and the reference log-probs equal a single micro-batch's); the fused update under a
budget equals the separate pass; and `fused_blocker` refuses a budget exactly where the cut would break the fused path.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from tests.step.test_fused_update import (
    algorithm,
    assert_same_grads,
    assert_same_stats,
    both_paths,
    make_passes,
    ragged_rollouts,
    recording_backend,
    tiny_float64_qwen2,
    train_batch,
)
from tokenrl.models.response_forward import trimmed
from tokenrl.selectors import Entropy20Selector, ICTSelector, UniformSelector
from tokenrl.step.fast_path import TokenBudgetCut, fused_blocker
from tokenrl.step.micro_batches import MicroBatchCut
from tokenrl.step.update import UpdatePath
from tokenrl.utils import StepTimer

pytestmark = pytest.mark.usefixtures("one_thread", "exact_norm")  # tests/conftest.py

ICT = ICTSelector(ratio=0.3, scope="sequence", warmup_steps=0)  # row-local, JS over whole groups
# (layout, trim): the trimmed padded forward, the untrimmed shared prefix, packed
LAYOUTS = [("padded", True), ("shared_prefix", False), ("packed", True)]
BUDGETS = [12, 40, 1000]  # below a group (whole groups then run alone), a few groups, everything at once


@pytest.fixture(scope="module")
def policy(exact_norm):
    return tiny_float64_qwen2()


@pytest.fixture(scope="module")
def rollouts(policy):
    return ragged_rollouts(policy)


@pytest.mark.parametrize("layout, trim", LAYOUTS, ids=[layout for layout, _ in LAYOUTS])
def test_a_cut_counts_the_tokens_its_forward_runs(rollouts, layout, trim):
    """Padded: rows × (prompt + response) columns of the batch the forward sees (trimmed or whole); shared prefix:
    one prompt per group; packed: every real prompt token of each group once plus every real response token."""
    batch, _ = rollouts
    cut = MicroBatchCut(1, 40, layout, trim, by_length=True)
    every = torch.arange(len(batch.texts))
    for whole_groups in (False, True):
        for part in cut(batch, every, whole_groups):
            sub = batch.rows(part)
            seen = trimmed(sub) if trim else sub
            groups = len(torch.unique(sub.group_ids))
            prompt, response = seen.prompt_ids.shape[1], seen.response_ids.shape[1]
            expected = {
                "padded": len(part) * (prompt + response),
                "shared_prefix": groups * prompt + len(part) * response,
                "packed": sum(int(sub.prompt_mask[sub.group_ids == g][0].sum()) for g in torch.unique(sub.group_ids))
                + int(sub.response_mask.sum()),
            }[layout]
            assert cut.tokens(batch, part) == expected
            assert expected <= 40 or len(part) == 1 or (whole_groups and groups == 1)  # only a lone unit exceeds


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("layout, trim", LAYOUTS, ids=[layout for layout, _ in LAYOUTS])
def test_the_update_under_a_token_budget_equals_one_micro_batch(policy, rollouts, layout, trim, budget):
    """ICT with an unmasked KL term (seq-mean-token-mean: one divisor): under a budget the separate and the fused
    update make as many forwards as the cut has micro-batches (rows, or whole groups), choose the same tokens and
    accumulate the gradient of one micro-batch holding every row; `micro_batch_size=1` is ignored."""
    batch, rewards = rollouts
    rows = len(batch.texts)
    settings = dict(aggregation="seq-mean-token-mean", kl_coef=0.05, kl_masked=False)
    cfg = algorithm(micro_batch_size=1, micro_batch_tokens=budget, **settings)
    separate, separate_run, stats, fused, fused_run = both_paths(
        policy, batch, rewards, ICT, cfg, with_kl=True, layout=layout, trim=trim
    )
    cut = make_passes(policy, ICT, cfg, layout, trim).plan.cut(with_grad=True)
    assert len(separate_run.forwards) == len(cut(batch, torch.arange(rows), False))
    assert len(fused_run.forwards) == len(cut(batch, torch.arange(rows), True))
    if budget == 1000:
        assert len(separate_run.forwards) == len(fused_run.forwards) == 1
    else:
        assert len(separate_run.forwards) > 1 and len(fused_run.forwards) > 1
    if budget == 12:  # every group is over it: each runs alone
        assert len(fused_run.forwards) == len(torch.unique(batch.group_ids))

    whole = algorithm(micro_batch_size=rows, **settings)
    one, one_run, one_stats, _, _ = both_paths(
        policy, batch, rewards, ICT, whole, with_kl=True, layout=layout, trim=trim
    )
    assert len(one_run.forwards) == 1
    for result, run in ((separate, separate_run), (fused, fused_run)):
        assert torch.equal(result.first_epoch_weights, one.first_epoch_weights)
        assert result.metrics["loss"] == pytest.approx(one.metrics["loss"], rel=1e-6)
        assert_same_grads(run.grads[0], one_run.grads[0], rtol=1e-5)
    assert_same_stats(fused.stats, one_stats, True)
    assert_same_stats(stats, one_stats, True)  # the statistics pass under the budget


@pytest.mark.parametrize("layout, trim", LAYOUTS, ids=[layout for layout, _ in LAYOUTS])
def test_the_reference_pass_under_a_token_budget_equals_one_micro_batch(policy, rollouts, layout, trim):
    batch, _ = rollouts
    rows = len(batch.texts)
    budgeted = make_passes(policy, ICT, algorithm(micro_batch_size=1, micro_batch_tokens=12), layout, trim)
    whole = make_passes(policy, ICT, algorithm(micro_batch_size=rows), layout, trim)
    budgeted.reference = whole.reference = policy  # a frozen copy of the same weights
    assert len(budgeted.plan.cut(with_grad=False)(batch, torch.arange(rows))) > 1
    mask = batch.response_mask.bool()  # beyond a row's end each forward's width differs (and nothing reads it)
    got, expected = budgeted.reference_logprobs(batch)[mask], whole.reference_logprobs(batch)[mask]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_fused_blocker_under_a_token_budget():
    """The number of micro-batches comes from the cut, not the row count; a group over the budget blocks JS."""
    cfg = algorithm(micro_batch_size=1, micro_batch_tokens=50)
    batch_scoped = Entropy20Selector(scope="batch")
    refused = fused_blocker(cfg, batch_scoped, False, 12, TokenBudgetCut(parts=2, group_over=False))
    assert refused is not None and "2 micro-batches of algorithm.micro_batch_tokens=50" in refused
    assert fused_blocker(cfg, batch_scoped, False, 12, TokenBudgetCut(parts=1, group_over=False)) is None
    # micro_batch_size=1 < G would refuse JS under the row cut; under a budget only a group over it does
    assert fused_blocker(cfg, ICT, True, 12, TokenBudgetCut(parts=3, group_over=False)) is None
    over = fused_blocker(cfg, ICT, True, 12, TokenBudgetCut(parts=3, group_over=True))
    assert over is not None and "a group's tokens exceed algorithm.micro_batch_tokens=50" in over
    assert fused_blocker(cfg, UniformSelector(), False, 12, TokenBudgetCut(parts=3, group_over=True)) is None


@pytest.mark.parametrize("layout, trim", LAYOUTS, ids=[layout for layout, _ in LAYOUTS])
def test_the_step_decides_on_its_own_cut(policy, rollouts, layout, trim):
    """`ForwardPlan.statistics_blocker` on the real rollouts: a budget below a group refuses JS (its whole groups
    would outgrow it) and a batch-wide selector (several micro-batches); a budget holding every row admits both."""
    batch, _ = rollouts
    for budget, admitted in ((12, False), (1000, True)):
        cfg = algorithm(micro_batch_tokens=budget)
        for selector, with_js in ((ICT, True), (Entropy20Selector(scope="batch"), False)):
            plan = make_passes(policy, selector, cfg, layout, trim, with_js).plan
            assert (plan.statistics_blocker(cfg, selector, batch) is None) == admitted


def test_every_rank_takes_the_path_of_the_one_that_cannot_fuse(policy, rollouts, caplog):
    """Under a budget each rank decides on its own rows; one rank that cannot fuse sends every rank to the separate
    pass (their collectives would otherwise run in different orders), and the run's line says why."""
    batch, rewards = rollouts
    cfg = algorithm(micro_batch_tokens=1000)
    passes = make_passes(policy, ICT, cfg, "padded", True)
    assert passes.plan.statistics_blocker(cfg, ICT, batch) is None  # this rank alone could
    asked = []

    def everyone(mine: bool) -> bool:
        asked.append(mine)
        return False  # another rank's answer is no

    backend, _ = recording_backend(policy, passes, cfg)
    caplog.set_level(logging.INFO, logger="tokenrl.step.update")
    step = (torch.Generator().manual_seed(0), 0.0, StepTimer())
    path = UpdatePath(passes, ICT, cfg)
    result = path.update(train_batch(batch, rewards, False), dataclasses.replace(backend, everyone=everyone), *step)
    assert asked == [True] and not result.fused_statistics
    assert "another rank's rows cannot take it" in caplog.records[-1].getMessage()
    backend, _ = recording_backend(policy, passes, cfg)
    assert UpdatePath(passes, ICT, cfg).update(train_batch(batch, rewards, False), backend, *step).fused_statistics
