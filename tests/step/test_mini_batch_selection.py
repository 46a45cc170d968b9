"""A selection on π_old's statistics does not depend on how the rollout step is cut into mini-batches (issue #36 §1).

For every selector preset (configs/selector/) and every method preset (configs/method/), with the statistics π_old's
(`stats_policy=old`; a preset's `current` is switched to it): `ppo_update` on the tiny real model, over one step of
3 groups × 8 ragged rollouts with 0/1 rewards (forks-shaped: mixed groups), run with 1, 2 and 4 mini-batches from the
same weights, must apply the same token weights, clip ranges, KL weights, token advantages and drift penalties to
every row. Mini-batches are random row subsets, so at 2 and 4 each group is split; a selection computed per
mini-batch would see partial groups (GTPO's entropy shares and standardisation) and partial pools (a batch-wide top
fraction), and this test fails on it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tests.helpers.tiny import rollouts as tiny_rollouts
from tests.helpers.varied import ACTS, METHODS
from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.grpo import group_advantages
from tokenrl.records.marks import ForkMarks
from tokenrl.records.selection import Selection
from tokenrl.step.fast_path import ForwardPlan
from tokenrl.step.passes import PolicyPasses
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import Backend, UpdateRun, ppo_update

ROOT = Path(__file__).resolve().parents[2]
SELECTORS = sorted(path.stem for path in (ROOT / "configs" / "selector").glob("*.yaml"))
FIELDS = ("weights", "clip_low", "clip_high", "kl_weights", "advantages", "drift_coef")
GROUP_SIZE = 8
STEP = 5  # past every preset's warm-up that the tests' settings leave on (ICT's Θ is switched off below)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def step_data():
    """(policy, rollouts, 0/1 rewards with every group mixed, π_old's statistics with JS, reference log-probs, random
    true forks)."""
    policy, _, rollouts = tiny_rollouts(seed=3, max_new_tokens=12, n=GROUP_SIZE)
    g = torch.Generator().manual_seed(7)
    rewards = (torch.rand(rollouts.response_ids.shape[0], generator=g) < 0.5).float()
    for group in rollouts.group_ids.unique():  # a right and a wrong answer in every group
        rows = (rollouts.group_ids == group).nonzero().squeeze(1)
        rewards[rows[0]], rewards[rows[1]] = 1.0, 0.0
    passes = PolicyPasses(policy, None, ForwardPlan(1.0, 8, 64, with_js=True))
    stats = passes.statistics(rollouts)
    reference = (stats.logprobs + 0.3 * torch.randn(stats.logprobs.shape, generator=g)) * rollouts.response_mask
    mask = rollouts.response_mask.bool()  # true forks for the presets that read them (forks_oracle, its control)
    forks = mask & (torch.rand(mask.shape, generator=g) < 0.3)
    marks = ForkMarks(forks, forks, mask, torch.zeros_like(mask), torch.zeros_like(mask), torch.zeros(len(mask)).long())
    return policy, rollouts, rewards, stats, reference, marks


def applied_selection(preset: tuple[str, str], mini_batches: int, step_data) -> dict[str, torch.Tensor]:
    """Every row's selection as the update applied it, assembled from each `select` call's rows."""
    group, name = preset
    overrides = [
        f"{group}={name}",
        "model=tiny",
        f"algorithm.group_size={GROUP_SIZE}",
        f"algorithm.mini_batches={mini_batches}",
        "algorithm.ppo_epochs=1",
        "algorithm.micro_batch_size=4",
        *ACTS.get(name, []),
    ]
    cfg = compose_config(overrides)
    if "warmup_steps" in cfg.selector:
        cfg.selector.warmup_steps = 0
    if cfg.selector.get("stats_policy") == "current":
        cfg.selector.stats_policy = "old"
    selector = instantiate(cfg.selector)
    algorithm = AlgorithmConfig.from_node(
        OmegaConf.to_container(cfg.algorithm, resolve=True), int(cfg.rollout.max_new_tokens)
    )
    policy, rollouts, rewards, stats, reference, marks = step_data
    policy = copy.deepcopy(policy)
    advantages = group_advantages(rewards, rollouts.group_ids)
    batch = TrainBatch(
        STEP, rollouts, rewards, rewards, advantages, reference if algorithm.uses_reference else None, forks=marks
    )
    applied = {name: torch.full(rollouts.response_ids.shape, float("nan")) for name in FIELDS}
    seen = torch.zeros(rollouts.response_ids.shape[0], dtype=torch.bool)

    def recording(view) -> Selection:
        selection = type(selector).select(selector, view)
        for field in FIELDS:
            value = getattr(selection, field)
            applied[field][view.row_ids] = (
                torch.full(view.response_mask.shape, -1.0) if value is None else value.float()
            )
        seen[view.row_ids] = True
        return selection

    selector.select = recording
    passes = PolicyPasses(policy, None, ForwardPlan(1.0, algorithm.batch.micro_batch_size, 64))
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)  # the policy moves between mini-batches

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad()

    backend = Backend(
        forward=passes.update_forward,
        micro_batches=passes.plan.cut(with_grad=True),
        backward=lambda loss, last: loss.backward(),
        scale_gradients=lambda factor: None,
        optimizer_step=optimizer_step,
        current_stats=lambda rows: passes.statistics(rows, with_js=False),
        reduce_normalizer=lambda local: local,
    )
    result = ppo_update(batch, stats, UpdateRun(selector, algorithm, torch.Generator().manual_seed(11)), backend)
    assert bool(seen.all()) and result.optimizer_steps == mini_batches
    return applied


@pytest.mark.parametrize(
    "preset",
    [("selector", name) for name in SELECTORS] + [("method", name) for name in METHODS],
    ids=lambda preset: "/".join(preset),
)
def test_the_selection_is_the_same_at_one_two_and_four_mini_batches(preset, step_data):
    whole = applied_selection(preset, 1, step_data)
    mask = step_data[1].response_mask.bool()
    assert float(whole["weights"][mask].abs().sum()) > 0  # the preset selects something here
    for mini_batches in (2, 4):
        cut = applied_selection(preset, mini_batches, step_data)
        for field in FIELDS:
            torch.testing.assert_close(
                cut[field][mask], whole[field][mask], rtol=0, atol=0, msg=f"{field} at {mini_batches} mini-batches"
            )
