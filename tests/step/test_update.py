"""`ppo_update` (step/update.py) runs without Lightning: on a tiny real model, a plain-PyTorch backend gives the
same weights as `GRPOModule`'s update of the same `TrainBatch` under the real Trainer."""

from __future__ import annotations

import copy
import dataclasses

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from tests.conftest import TINY, compose_config
from tokenrl.models import build_model
from tokenrl.models.response_forward import response_logprobs
from tokenrl.run.training import build_components
from tokenrl.step.fast_path import ForwardPlan
from tokenrl.step.micro_batches import MicroBatchCut
from tokenrl.step.passes import UpdateForward
from tokenrl.step.statistics import compute_token_stats
from tokenrl.step.update import Backend, UpdateRun, ppo_update
from tokenrl.utils import derived_seed

SETTING = [
    "selector=ict",
    "selector_warmup_steps=0",
    "algorithm.mini_batches=2",
    "algorithm.micro_batch_size=3",
    "total_steps=1",
    "task.verifier=tests.helpers.rewards:length_reward",
]


class CaptureUpdate(L.Callback):
    """The TrainBatch of the step, its π_old statistics and the policy's weights just before and after the module's
    update."""

    def on_train_start(self, trainer, module) -> None:
        update = module.update_step

        def spy(train, timer):
            self.train, self.before = train, copy.deepcopy(module.policy.state_dict())
            lr, result = update(train, timer)
            self.stats, self.after = result.stats, copy.deepcopy(module.policy.state_dict())
            return lr, result

        module.update_step = spy


def plain_backend(policy, cfg, temperature, optimizer, chunk):
    def optimizer_step():
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.schedule.grad_clip)
        optimizer.step()
        optimizer.zero_grad()

    def scale_gradients(factor):
        for parameter in policy.parameters():
            parameter.grad.mul_(factor)

    return Backend(
        forward=lambda rows, with_stats, with_entropy: UpdateForward(
            response_logprobs(policy, rows, temperature, layout="shared_prefix", trim=True)
        ),
        micro_batches=MicroBatchCut(cfg.batch.micro_batch_size, layout="shared_prefix", trim=True, by_length=True),
        backward=lambda loss, last: loss.backward(),
        scale_gradients=scale_gradients,
        optimizer_step=optimizer_step,
        current_stats=lambda rows: compute_token_stats(
            policy, rows, ForwardPlan(temperature, cfg.batch.micro_batch_size, chunk)
        ),
        reduce_normalizer=lambda local: local,
    )


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """One rollout step of SETTING under the real Trainer: (its config, the module, the update's TrainBatch and the
    weights before and after the update)."""
    cfg = compose_config(TINY + SETTING, output_dir=tmp_path_factory.mktemp("run"))
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    capture = CaptureUpdate()
    trainer.callbacks.append(capture)
    trainer.fit(module, datamodule=datamodule)
    return cfg, module, capture


def plain_update(cfg, module, train, stats, before):
    """`ppo_update` of `train` (π_old's statistics `stats`) from weights `before` with the plain backend and the
    module's shuffle; returns the result, the policy and its weights after each optimizer step."""
    policy = build_model(module.model_settings, seed=cfg.seed)
    policy.load_state_dict(before)
    policy.train()
    optimizer = instantiate(cfg.algorithm.optimizer)([p for p in policy.parameters() if p.requires_grad])
    backend = plain_backend(
        policy, module.cfg, module.sampling.temperature, optimizer, module.model_settings.stats_chunk_size
    )
    snapshots = []
    step = backend.optimizer_step
    backend = dataclasses.replace(
        backend, optimizer_step=lambda: (step(), snapshots.append(copy.deepcopy(policy.state_dict())))
    )
    shuffle = torch.Generator().manual_seed(derived_seed(cfg.seed, "shuffle", 0))
    result = ppo_update(train, stats, UpdateRun(module.selector, module.cfg, shuffle), backend)
    return result, policy, snapshots


def test_update_loop_without_a_trainer_equals_the_module(captured):
    cfg, module, capture = captured
    assert module.run_state.optimizer_steps == 2
    result, policy, _ = plain_update(cfg, module, capture.train, capture.stats, capture.before)
    assert (
        result.optimizer_steps == 2
        and 0 < result.first_epoch_weights.sum() < capture.train.rollouts.response_mask.sum()
    )
    moved = 0.0
    for name, weight in policy.state_dict().items():
        torch.testing.assert_close(weight, capture.after[name], rtol=1e-6, atol=1e-7, msg=name)
        moved = max(moved, float((weight - capture.before[name]).abs().max()))
    assert moved > 1e-5  # the update really changed the weights


def test_the_first_optimizer_step_takes_pi_old_from_its_own_forward(captured):
    """Before the first optimizer step the weights are π_old's, so its ratio is exactly 1 whatever rounding the separate
    statistics pass leaves (simulated: its log-probs shifted by 0.05); the second optimizer step reads that pass."""
    cfg, module, capture = captured
    stats = capture.stats
    shifted = dataclasses.replace(stats, logprobs=stats.logprobs + 0.05 * capture.train.rollouts.response_mask)
    _, _, exact = plain_update(cfg, module, capture.train, stats, capture.before)
    _, _, moved = plain_update(cfg, module, capture.train, shifted, capture.before)
    assert len(exact) == len(moved) == 2
    for name in exact[0]:
        torch.testing.assert_close(moved[0][name], exact[0][name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(moved[1][name], exact[1][name]) for name in exact[1])
