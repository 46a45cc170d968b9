"""DAPO dynamic sampling: the group filter, re-padding concatenation, the round bookkeeping against a brute-force
expectation, and end to end with the tiny model (every trained group has a non-zero advantage; exact resume)."""

from __future__ import annotations

import itertools
import random

import lightning as L
import pytest
import torch

from tests.run.test_training import Crash, CrashAfter, Recorder, fit
from tokenrl.algorithms.dapo import varied_groups
from tokenrl.records.marks import POSITION_MARKS, ForkMarks
from tokenrl.records.problem import Problem
from tokenrl.records.prompt_batch import PromptBatch
from tokenrl.records.rollout_batch import RolloutBatch, concat_rollouts
from tokenrl.rollout.dynamic_sampling import ScoredRollouts, VariedGroups, concat_scored

GATED = [
    "task.verifier=tests.helpers.rewards:odd_answers_unsolvable",
    "algorithm.filter_groups=acc",
    "algorithm.gen_prompts_per_step=2",
    "total_steps=3",
]


@pytest.mark.parametrize("seed", range(5))
def test_varied_groups_matches_brute_force(seed):
    rng = random.Random(seed)
    sizes = [rng.randint(1, 4) for _ in range(7)]
    group_ids = torch.tensor([g for g, size in enumerate(sizes) for _ in range(size)])
    values = torch.tensor([float(rng.randint(0, 1)) for _ in group_ids])
    expected = [len(set(values[group_ids == g].tolist())) > 1 or sizes[g] == 1 for g in group_ids.tolist()]
    assert varied_groups(values, group_ids).tolist() == expected


def rollout_batch(
    prompts: list[list[int]], responses: list[list[int]], group_ids: list[int], pad: int = 0, version: int = 0
) -> RolloutBatch:
    """A batch padded the way the engines pad: prompts on the left, responses on the right."""
    pw, rw = max(map(len, prompts)), max(map(len, responses))
    prompt_ids = torch.tensor([[pad] * (pw - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (pw - len(p)) + [1] * len(p) for p in prompts])
    response_ids = torch.tensor([r + [pad] * (rw - len(r)) for r in responses])
    response_mask = torch.tensor([[1] * len(r) + [0] * (rw - len(r)) for r in responses])
    logprobs = -torch.tensor([[0.1 * t for t in r] + [0.0] * (rw - len(r)) for r in responses])
    return RolloutBatch(
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        logprobs,
        torch.tensor(group_ids),
        ["stop"] * len(prompts),
        [str(r) for r in responses],
        version,
    )


def test_concat_rollouts_repads_and_renumbers_groups():
    a = rollout_batch([[5, 6], [5, 6]], [[1, 2, 3], [4]], [7, 7])
    b = rollout_batch([[9, 8, 7, 6], [3], [3]], [[2], [2, 3], [1, 1, 1, 1, 1]], [0, 2, 2])
    whole = concat_rollouts([a, b], pad_id=0)
    rows = [
        (p, r)
        for part in (a, b)
        for p, r in zip(
            [row[m.bool()].tolist() for row, m in zip(part.prompt_ids, part.prompt_mask)],
            [row[m.bool()].tolist() for row, m in zip(part.response_ids, part.response_mask)],
        )
    ]
    assert whole.prompt_ids.shape == (5, 4) and whole.response_ids.shape == (5, 5)
    for i, (prompt, response) in enumerate(rows):
        assert whole.prompt_ids[i][whole.prompt_mask[i].bool()].tolist() == prompt
        assert whole.prompt_mask[i, : 4 - len(prompt)].sum() == 0  # still left-padded
        assert whole.response_ids[i][whole.response_mask[i].bool()].tolist() == response
        assert torch.equal(whole.sampling_logprobs[i, : len(response)], -0.1 * torch.tensor(response).float())
        assert whole.sampling_logprobs[i, len(response) :].abs().sum() == 0
    assert whole.group_ids.tolist() == [0, 0, 1, 2, 2] and whole.texts == a.texts + b.texts
    with pytest.raises(ValueError, match="different weights versions"):
        concat_rollouts([a, rollout_batch([[1]], [[1]], [0], version=1)], pad_id=0)


def test_true_forks_follow_their_rows_through_selection_and_concatenation():
    def scored(responses: list[list[int]], groups: list[int]) -> ScoredRollouts:
        batch = rollout_batch([[1]] * len(responses), responses, groups)
        ids = batch.response_ids
        marks = ForkMarks(  # any per-token marks tied to the response, a per-row failure tied to its first token
            ids > 5, ids > 2, ids > 0, ids == 7, ids == 9, ids[:, 0].clone()
        )
        return ScoredRollouts(batch, torch.zeros(len(responses)), torch.zeros(len(responses)), marks)

    a, b = scored([[6, 2], [3, 7]], [0, 0]), scored([[9, 1, 8]], [0])
    whole = concat_scored([a.rows(torch.tensor([1])), b], pad_id=0)
    assert whole.forks.forks.tolist() == [[False, True, False], [True, False, True]]
    ids = whole.rollouts.response_ids
    for name, expected in zip(POSITION_MARKS, (ids > 5, ids > 2, ids > 0, ids == 7, ids == 9)):
        assert torch.equal(getattr(whole.forks, name), expected), name
    assert whole.forks.failure.tolist() == [3, 9]
    assert concat_scored([a, ScoredRollouts(b.rollouts, b.scores, b.rewards)], pad_id=0).forks is None


def outcome(prompt: int, sample: int) -> float:
    """The fake verifier of the bookkeeping test: multiples of 3 always fail, 5s always pass, the rest mix."""
    return 0.0 if prompt % 3 == 0 else 1.0 if prompt % 5 == 0 else float(sample % 2)


def fake_round(prompts: PromptBatch, n: int) -> ScoredRollouts:
    ids = [p[0] for p in prompts.prompt_ids]
    batch = rollout_batch(
        [[i] for i in ids for _ in range(n)],
        [[i, s + 1] for i in ids for s in range(n)],
        [g for g in range(len(ids)) for _ in range(n)],
    )
    scores = torch.tensor([outcome(i, s) for i in ids for s in range(n)])
    return ScoredRollouts(batch, scores, scores.clone())


def prompt_batch(ids: list[int]) -> PromptBatch:
    return PromptBatch(0, [Problem(str(i), str(i), "0", "gsm8k_flexible") for i in ids], [[i] for i in ids])


@pytest.mark.parametrize("quota,max_rounds", [(3, 10), (4, 10), (5, 2), (1, 1)])
def test_rounds_keep_the_first_varied_groups_in_order(quota, max_rounds):
    """Prompts 1, 2, 3, … in rounds of 3: the kept groups are the first `quota` varied prompts, topped up with the
    earliest filtered prompts when the rounds run out; every round's prompts are drawn even after the quota."""
    n, per_round = 4, 3
    stream = itertools.count(1)
    drawn, generated = [], []

    def refill() -> PromptBatch:
        ids = [next(stream) for _ in range(per_round)]
        drawn.append(ids)
        return prompt_batch(ids)

    def generate(prompts: PromptBatch, round_index: int) -> ScoredRollouts:
        generated.append(round_index)
        return fake_round(prompts, n)

    other_rank_done_after = 3  # a slower rank keeps every rank in the loop for 3 rounds at least
    calls = itertools.count(1)

    def everyone_done(mine: bool) -> bool:
        return next(calls) >= other_rank_done_after and mine

    batch, metrics = VariedGroups(quota, "acc", max_rounds, pad_id=0).collect(refill(), generate, refill, everyone_done)
    rounds = len(drawn)
    seen = [i for ids in drawn[: len(generated)] for i in ids]
    varied = [i for i in seen if i % 3 and i % 5]
    uniform = [i for i in seen if not (i % 3 and i % 5)]
    expected = varied[:quota] + uniform[: max(0, quota - len(varied))]
    assert [int(batch.rollouts.prompt_ids[g * n, -1]) for g in range(quota)] == expected
    assert batch.rollouts.group_ids.tolist() == [g for g in range(quota) for _ in range(n)]
    assert metrics["gen_rounds"] == len(generated) and metrics["filled_groups"] == max(0, quota - len(varied))
    assert metrics["kept_group_frac"] == pytest.approx(len(varied) / len(seen))
    assert generated == list(range(len(generated)))  # generation stops once this rank has its quota
    assert rounds == min(max_rounds, max(other_rank_done_after, len(generated)))  # but the draws go on


class CaptureUpdates(L.Callback):
    """The advantages and group count of every update, via the module's `update_step`."""

    def __init__(self) -> None:
        self.updates: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_train_start(self, trainer, module) -> None:
        update = module.update_step

        def spy(train, timer):
            self.updates.append((train.advantages.clone(), train.rollouts.group_ids.clone()))
            return update(train, timer)

        module.update_step = spy


def test_every_trained_group_has_a_nonzero_advantage(tiny_cfg):
    capture = CaptureUpdates()
    module, trainer = fit(tiny_cfg(*GATED), capture)
    assert len(capture.updates) == 3
    for advantages, groups in capture.updates:
        assert groups.unique().numel() == 4  # prompts_per_step groups
        for g in groups.unique():
            assert advantages[groups == g].abs().max() > 0  # none was all-equal
    metrics = trainer.callback_metrics
    assert float(metrics["train/filled_groups"]) == 0.0
    assert 0.0 < float(metrics["train/kept_group_frac"]) < 1.0  # odd answers were really dropped
    assert module.run_state.refill_position > 0 and module.run_state.refill_position % 2 == 0


def test_dynamic_sampling_run_resumes_to_the_same_weights(tiny_cfg, tmp_path):
    overrides = GATED + ["checkpoint.enabled=true", "checkpoint.every_n_steps=1"]
    straight = Recorder()
    plain, _ = fit(tiny_cfg(*overrides), straight)
    with pytest.raises(Crash):
        fit(tiny_cfg(*overrides, f"paths.output_dir={tmp_path / 'interrupted'}"), CrashAfter(2))
    resumed_rec = Recorder()
    resumed, _ = fit(
        tiny_cfg(*overrides, f"paths.output_dir={tmp_path / 'resumed'}"),
        resumed_rec,
        ckpt_path=str(tmp_path / "interrupted" / "checkpoints" / "last.ckpt"),
    )
    assert resumed.run_state.refill_position == plain.run_state.refill_position
    assert resumed_rec.after_step[0] == straight.after_step[2]


def test_sizes_that_cannot_fill_a_step_fail_at_start_up(tiny_cfg):
    with pytest.raises(ValueError, match=r"gen_prompts_per_step=1 × max_gen_rounds=2 cannot supply prompts_per_step=4"):
        fit(tiny_cfg(*GATED, "algorithm.gen_prompts_per_step=1", "algorithm.max_gen_rounds=2"))
    with pytest.raises(ValueError, match=r"algorithm.filter_groups='score' is not one of \('acc', 'reward'\)"):
        fit(tiny_cfg(*GATED, "algorithm.filter_groups=score"))
