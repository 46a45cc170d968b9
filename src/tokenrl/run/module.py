"""`GRPOModule`: the Lightning hooks and the order of a rollout step's phases (math: docs/algorithms.md §1.2–1.4):
collect G scored rollouts per prompt, then the engine sleeps; the reference's log-probs and advantages as one
`TrainBatch`; the PPO update (`LightningUpdate`); weight sync; metrics, diagnostics and samples. It is built from one
`ModuleSpec` and owns the run's counters (`RunState`), its LoRA checkpoints (`AdapterCheckpoints`) and its update."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.types import OptimizerLRScheduler
from transformers import PreTrainedModel

from tokenrl.algorithms.logit_statistics import needs_js
from tokenrl.evaluation.during_training import PeriodicValidation
from tokenrl.models import build_model, build_reference
from tokenrl.models.sharding import is_sharded, shard_under
from tokenrl.observe.diagnostics import selection_diagnostics
from tokenrl.records.prompt_batch import PromptBatch
from tokenrl.rewards.scorer import SafeScorer
from tokenrl.rollout import RolloutEngine, SamplingParams, build_engine
from tokenrl.rollout.collector import Generation, RolloutCollector
from tokenrl.run.checkpointing import AdapterCheckpoints
from tokenrl.run.lightning_backend import LightningUpdate
from tokenrl.run.module_spec import ModuleSpec
from tokenrl.run.preemption import PreemptionWatch
from tokenrl.run.run_state import RunState
from tokenrl.step.entropy_control import EntropyControl
from tokenrl.step.fast_path import ForwardPlan
from tokenrl.step.metrics import step_metrics
from tokenrl.step.passes import PolicyPasses
from tokenrl.step.schedule import with_linear_warmup
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import UpdatePath
from tokenrl.utils import StepTimer

# prompts stay on the host on purpose (see transfer_batch_to_device); Lightning warns about the override
warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
log = logging.getLogger(__name__)


class GRPOModule(L.LightningModule):
    """GRPO over a causal-LM policy with a pluggable `TokenSelector`."""

    def __init__(self, spec: ModuleSpec) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model_settings, self.rollout_settings = spec.model, spec.rollout
        self.cfg = spec.algorithm
        self.entropy_control = EntropyControl.of(self.cfg)
        self.selector, self.tokenizer, self.optimizer_factory = spec.selector, spec.tokenizer, spec.optimizer
        self.with_js = needs_js(spec.selector.requires, type(spec.selector).__name__, spec.js_diagnostics)
        self.sampling = SamplingParams.of_rollout(spec.rollout, n=self.cfg.batch.group_size)
        scorer, pad_id = SafeScorer(spec.reward_timeout_s), spec.tokenizer.pad_token_id
        self.collector = RolloutCollector(
            self.sampling, self.cfg, scorer, spec.seed, pad_id, self._refill, self._everyone, spec.fork_marker
        )
        self.validator, self.val_every, self.total_steps = spec.validator, spec.val_every_n_steps, spec.total_steps
        self.sample_writer, self.seed, self.fast_path = spec.sample_writer, spec.seed, spec.fast_path
        self.preemption = PreemptionWatch()  # a signal stops the run at the step's next safe point
        self.policy: torch.nn.Module | None = None  # the causal LM; under FSDP its root unit (models/sharding.py)
        self._reference: list[torch.nn.Module] = []  # a list keeps the frozen copy out of state_dict
        self.engine: RolloutEngine | None = None
        self.last_validation: dict[str, float] = {}  # the latest held-out metrics (val/*)
        self.run_state = RunState()  # step counters, reward history, refill position, the step boundary
        self.adapters = AdapterCheckpoints()  # LoRA: checkpoints hold the adapters alone
        self.update_step: LightningUpdate | None = None  # the PPO update, built with the policy (configure_model)

    # ----------------------------------------------------------------------------------------- set-up
    def configure_model(self) -> None:
        """The policy and, with a KL term and no LoRA (whose reference is the policy with adapters off), its frozen
        reference in `model.reference_dtype`; under Lightning's FSDP both sharded one unit per decoder layer."""
        if self.policy is not None:
            return
        policy = build_model(self.model_settings, seed=self.seed).train()
        self.adapters.remember_base(policy, self.model_settings, self.seed)
        references: list[torch.nn.Module] = []
        if self.cfg.uses_reference and isinstance(policy, PreTrainedModel):  # LoRA: a PeftModel, no copy
            references.append(build_reference(policy, self.model_settings.reference_dtype))
        strategy = self._trainer.strategy if self._trainer is not None else None
        root, *references = shard_under(strategy, [policy, *references])
        self.policy, self._reference = root, references
        plan = ForwardPlan(
            self.sampling.temperature,
            self.cfg.batch.micro_batch_size,
            self.model_settings.stats_chunk_size,
            self.with_js,
            self.selector.js_peers,
            self.cfg.batch.micro_batch_tokens,
            self.fast_path,
        )
        self.passes = PolicyPasses(root, references[0] if references else None, plan.resolved(root))
        path = UpdatePath(self.passes, self.selector, self.cfg)
        self.update_step = LightningUpdate(self, path, self.entropy_control, self.seed)

    def on_fit_start(self) -> None:
        if self.cfg.shaping.filter_groups is not None:
            self.collector.check_sizes(self.global_rank, self.trainer.world_size)
        for reference in (r for r in self._reference if not is_sharded(r)):  # FSDP placed a sharded one
            reference.to(self.device)
        log.info("building the %s rollout engine", self.rollout_settings.engine)
        assert self.policy is not None  # built in configure_model
        self.engine = build_engine(
            self.rollout_settings,
            self.policy,
            self.tokenizer,
            self.run_state.optimizer_steps,
            interrupt=lambda: self.preemption.requested,
        )

    def on_train_start(self) -> None:
        """Under FSDP Lightning restores a checkpoint after `on_fit_start` (`restore_checkpoint_after_setup`): the
        engine built there serves the weights from before the restore, so it is synced here to the restored ones."""
        assert self.engine is not None and self.policy is not None  # built in configure_model and on_fit_start
        if self.engine.weights_version != self.run_state.optimizer_steps:
            self.engine.sync_weights(self.policy, self.run_state.optimizer_steps)
        self.run_state.mark_step_boundary()
        if self.global_rank == 0:
            log.info(
                "starting step %d/%d (a validation first when one is due; a line follows each step)",
                self.run_state.rollout_step + 1,
                self.total_steps,
            )

    def on_train_epoch_end(self) -> None:
        self.trainer.should_stop = True  # one pass over the prompt schedule is the run (train.py: max_epochs=-1)

    def on_fit_end(self) -> None:
        self.collector.scorer.close()
        if self.engine is not None:
            self.engine.close()

    def configure_optimizers(self) -> OptimizerLRScheduler:
        """The optimizer, with a linear lr warm-up over `algorithm.lr_warmup_steps` rollout steps when set."""
        assert self.policy is not None  # built in configure_model
        optimizer = self.optimizer_factory([p for p in self.policy.parameters() if p.requires_grad])
        return with_linear_warmup(optimizer, self.cfg.schedule.lr_warmup_steps)

    def transfer_batch_to_device(self, batch: PromptBatch, device: torch.device, dataloader_idx: int) -> PromptBatch:
        return batch  # prompts stay on the host; rollouts are moved by the engine and the update

    def configure_callbacks(self) -> list[L.Callback]:
        if self.validator is None or not self.val_every:
            return []
        return [PeriodicValidation(self.validator, self.val_every, self.total_steps)]

    # ------------------------------------------------------------------------------------- one step
    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        assert self.engine is not None and self.policy is not None and self.update_step is not None  # set up before
        self.check_preempted()
        timer = StepTimer()
        who = Generation(
            self.run_state.rollout_step, self.run_state.optimizer_steps, self.global_rank, self.trainer.world_size
        )
        scored, sampling_metrics = self.collector.collect(self.engine, batch, who, timer)
        with timer("generate"):
            self.engine.sleep()
        self.check_preempted()  # safe: nothing of this step is applied yet (the engine wakes at the next generate)
        with timer("statistics"):  # the reference's; π_old's come with the update (`UpdatePath`)
            offset = self.global_rank * len(scored.rollouts.texts)
            train = TrainBatch.assemble(self.run_state.rollout_step, scored, self.cfg, self.passes, offset)
        entropy_coef = self.entropy_control.alpha  # this step's α (the update reads the same)
        self.check_preempted()  # the last safe point: an update that has begun runs to its end
        lr, update = self.update_step(train, timer)
        self.run_state.optimizer_steps += update.optimizer_steps
        if self.cfg.schedule.entropy_target is not None:
            self.entropy_control.observe(train.mean_entropy(update.stats, self.device))
        with timer("sync"):
            self.engine.sync_weights(self.policy, self.run_state.optimizer_steps)
        self.run_state.rollout_step += 1
        rewards = self.all_gather(train.rewards.mean())
        assert isinstance(rewards, torch.Tensor)  # a tensor gathers to a tensor
        self.run_state.reward_history.append(float(rewards.mean()))
        whole = train.whole_view(update.stats, self.device, self.global_rank)
        metrics = {
            **step_metrics(train, update, self.cfg, lr, timer),
            **{f"train/{key}": value for key, value in sampling_metrics.items()},  # dynamic sampling's
            "train/entropy_coef": entropy_coef,
            **selection_diagnostics(update.first_epoch_weights, whole, train.forks),
        }
        each_step: dict[str, Any] = dict(on_step=True, on_epoch=False, sync_dist=self.trainer.world_size > 1)
        self.log_dict(metrics, logger=True, batch_size=train.size, **each_step)
        shown = {"reward": metrics["train/reward"], "acc": metrics["train/accuracy"]}
        self.log_dict(shown, prog_bar=True, logger=False, batch_size=train.size, **each_step)
        if self.sample_writer is not None:
            self.sample_writer.record(train, update, whole, self.global_rank)
        self.run_state.mark_step_boundary()

    def _refill(self) -> PromptBatch:
        """Dynamic sampling's next round of prompts from the data module's second seeded stream."""
        state, count = self.run_state, self.cfg.batch.gen_prompts_per_step
        prompts = self.trainer.datamodule.refill_prompts(  # type: ignore[attr-defined]  # Lightning sets it at run time
            state.rollout_step, state.refill_position, count, self.global_rank, self.trainer.world_size
        )
        state.refill_position += count
        return prompts

    def check_preempted(self) -> None:
        """Raise `Preempted` once any rank got a preemption signal: every rank stops at the same safe point."""
        anyone = not self._everyone(not self.preemption.requested) if self.trainer.world_size > 1 else None
        self.preemption.check(anyone)

    def _everyone(self, mine: bool) -> bool:
        return bool(self.trainer.strategy.all_gather(torch.tensor(float(mine), device=self.device)).min() > 0)

    # ------------------------------------------------------------------------------------- checkpoints
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # torch's overloads: `destination` itself, filled
        return self.adapters.saved_state(super().state_dict(*args, **kwargs), kwargs.get("prefix", ""))

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        state_dict = self.adapters.loaded_state(state_dict, super().state_dict())
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["tokenrl"] = self.run_state.state_dict(self.entropy_control)
        self.adapters.save(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.adapters.check(checkpoint, self._trainer.ckpt_path if self._trainer is not None else None)
        self.run_state.load_state_dict(checkpoint["tokenrl"], self.entropy_control)
