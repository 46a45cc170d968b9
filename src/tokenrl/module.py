"""`GRPOModule`: the Lightning side of a rollout step (the math: docs/algorithms.md §1.2–1.4). `training_step`:
1. collect G scored rollouts per prompt (rollout/collector.py), then the engine sleeps (GPU: the update gets its memory);
2. advantages, π_old's statistics and the reference's log-probs → one `TrainBatch` (step/train_batch.py);
   the statistics come from the update's own forward instead where that is exact (`fast_path.fused_statistics`);
3. the PPO update (step/update.py) with this module's backend (manual backward, DDP `no_sync` before the last
   micro-batch, FSDP-aware clipping, optimizer, lr schedule); 4. weight sync; 5. metrics, diagnostics, samples.
"""
from __future__ import annotations

import dataclasses
import logging
import warnings
from contextlib import nullcontext
from functools import partial
from typing import Any, Callable, Mapping

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from transformers import PreTrainedTokenizerBase

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.grpo import group_advantages
from tokenrl.algorithms.token_stats import needs_js
from tokenrl.data.datamodule import PromptBatch
from tokenrl.diagnostics import selection_diagnostics
from tokenrl.evaluation.during_training import PeriodicValidation
from tokenrl.evaluation.runner import Validator
from tokenrl.lightning_backend import lightning_backend
from tokenrl.models import build_model, build_reference
from tokenrl.models.sharding import gathered_root, is_sharded, shard
from tokenrl.preemption import PreemptionWatch
from tokenrl.rewards.scorer import SafeScorer
from tokenrl.rollout import RolloutEngine, SamplingParams, build_engine
from tokenrl.rollout.collector import Generation, RolloutCollector
from tokenrl.rollout.fork_marks import ForkMarker
from tokenrl.rollout.hf import HFEngine
from tokenrl.samples import SampleWriter
from tokenrl.selectors.base import TokenSelector
from tokenrl.step.distributed import gather_variable
from tokenrl.step.entropy_control import EntropyControl
from tokenrl.step.fast_path import FastPath
from tokenrl.step.metrics import step_metrics
from tokenrl.step.passes import PolicyPasses, shared_prefix_blocker
from tokenrl.step.schedule import with_linear_warmup
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import UpdateResult, fused_blocker, ppo_update
from tokenrl.utils import StepTimer, derived_seed, restore_rng_state, rng_state

# prompts stay on the host on purpose (see transfer_batch_to_device); Lightning warns about the override
warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
log = logging.getLogger(__name__)


class GRPOModule(L.LightningModule):
    """GRPO over a causal-LM policy with a pluggable `TokenSelector`."""

    def __init__(self, model: Mapping[str, Any], algorithm: Mapping[str, Any], rollout: Mapping[str, Any],
                 selector: TokenSelector, tokenizer: PreTrainedTokenizerBase,
                 optimizer: Callable[..., torch.optim.Optimizer], seed: int = 0,
                 reward_timeout_s: float = 5.0, js_diagnostics: bool = False,
                 validator: Validator | None = None, val_every_n_steps: int = 0, total_steps: int = 0,
                 sample_writer: SampleWriter | None = None, fast_path: FastPath = FastPath(),
                 preemption: PreemptionWatch | None = None, fork_marker: ForkMarker | None = None) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model_cfg, self.rollout_cfg = dict(model), dict(rollout)
        self.cfg = AlgorithmConfig.from_node(algorithm, int(rollout["max_new_tokens"]))
        self.entropy_control = EntropyControl(self.cfg.entropy_coef, self.cfg.entropy_target,
                                              self.cfg.entropy_coef_delta, self.cfg.entropy_coef_max)
        self.selector, self.tokenizer, self.optimizer_factory = selector, tokenizer, optimizer
        self.with_js = needs_js(selector.requires, type(selector).__name__, js_diagnostics)
        self.sampling = SamplingParams.of_rollout(rollout, n=self.cfg.group_size)
        self.collector = RolloutCollector(self.sampling, self.cfg, SafeScorer(reward_timeout_s), seed,
                                          tokenizer.pad_token_id, fork_marker)
        self.validator, self.val_every, self.total_steps = validator, val_every_n_steps, total_steps
        self.sample_writer, self.seed, self.fast_path = sample_writer, seed, fast_path
        self.path_reported = False   # the run's log says once which fast-path shortcuts the update takes
        self.preemption = preemption or PreemptionWatch()   # a signal stops the run at the step's next safe point
        self.policy: torch.nn.Module | None = None   # the causal LM; under FSDP its root unit (models/sharding.py)
        self._reference: list[torch.nn.Module] = []   # a list keeps the frozen copy out of state_dict
        self.engine: RolloutEngine | None = None
        self.rollout_step = self.optimizer_steps = 0
        self.refill_position = 0   # prompts drawn so far from the data module's refill stream (dynamic sampling)
        self.reward_history: list[float] = []   # mean reward of every rollout step (checkpointed)
        self.last_validation: dict[str, float] = {}   # the latest held-out metrics (val/*)
        self.boundary: dict[str, Any] = {}   # refill position and RNG states after the last completed step

    # ----------------------------------------------------------------------------------------- set-up
    def configure_model(self) -> None:
        """The policy and, with a KL term and no LoRA (whose reference is the policy with adapters off), its frozen
        reference in `model.reference_dtype`; under Lightning's FSDP both sharded one unit per decoder layer."""
        if self.policy is not None:
            return
        policy = build_model(self.model_cfg, seed=self.seed).train()
        references = ([build_reference(policy, self.model_cfg.get("reference_dtype"))]
                      if self.cfg.uses_reference and not self.model_cfg.get("lora") else [])
        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, FSDPStrategy):
            policy, references = shard(policy, strategy), [shard(reference, strategy) for reference in references]
        self.policy, self._reference = policy, references
        off = "fast_path.shared_prefix=false" if not self.fast_path.shared_prefix else None
        self.prefix_blocker = off or shared_prefix_blocker(policy, with_grad=False)   # statistics, reference passes
        self.update_prefix_blocker = off or shared_prefix_blocker(policy, with_grad=True)
        self.passes = PolicyPasses(policy, references[0] if references else None, self.sampling.temperature,
                                   self.cfg.micro_batch_size, int(self.model_cfg["stats_chunk_size"]), self.with_js,
                                   self.selector.js_peers, share_prefix=self.prefix_blocker is None,
                                   share_prefix_update=self.update_prefix_blocker is None, trim=self.fast_path.pack)

    def setup(self, stage: str) -> None:
        self.configure_model()

    def on_fit_start(self) -> None:
        if self.cfg.filter_groups is not None:
            self.collector.check_sizes(self.global_rank, self.trainer.world_size)
        for reference in self._reference:
            if not is_sharded(reference):   # FSDP placed it already
                reference.to(self.device)
        log.info("building the %s rollout engine", self.rollout_cfg["engine"])
        self.engine = build_engine(self.rollout_cfg, self.policy, self.tokenizer, self.optimizer_steps)
        if isinstance(self.engine, HFEngine):
            self.engine.interrupt = lambda: self.preemption.requested

    def on_train_start(self) -> None:
        """Under FSDP Lightning restores a checkpoint after `on_fit_start` (`restore_checkpoint_after_setup`): the engine
        built there serves the weights from before the restore, so it is synced here to the restored ones."""
        if self.engine.weights_version != self.optimizer_steps:
            self.engine.sync_weights(self.policy, self.optimizer_steps)
        self.mark_step_boundary()
        if self.global_rank == 0:
            log.info("starting step %d/%d (a validation first when one is due; a line follows each step)",
                     self.rollout_step + 1, self.total_steps)

    def on_train_epoch_end(self) -> None:
        self.trainer.should_stop = True   # one pass over the prompt schedule is the run (train.py: max_epochs=-1)

    def mark_step_boundary(self) -> None:
        """Record what a checkpoint taken before the next step completes must hold (a preemption mid-step)."""
        self.boundary = {"refill_position": self.refill_position, "rng": rng_state()}

    def on_fit_end(self) -> None:
        self.collector.scorer.close()
        if self.engine is not None:
            self.engine.close()

    def configure_optimizers(self) -> torch.optim.Optimizer | dict[str, Any]:
        """The optimizer, with a linear lr warm-up over `algorithm.lr_warmup_steps` rollout steps when set."""
        optimizer = self.optimizer_factory([p for p in self.policy.parameters() if p.requires_grad])
        return with_linear_warmup(optimizer, self.cfg.lr_warmup_steps)

    def transfer_batch_to_device(self, batch: PromptBatch, device: torch.device, dataloader_idx: int) -> PromptBatch:
        return batch  # prompts stay on the host; rollouts are moved by the engine and the update

    def configure_callbacks(self) -> list[L.Callback]:
        if self.validator is None or not self.val_every:
            return []
        return [PeriodicValidation(self.validator, self.val_every, self.total_steps)]

    # ------------------------------------------------------------------------------------- one step
    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        if batch.step != self.rollout_step:
            raise RuntimeError(f"prompt batch for step {batch.step} arrived at step {self.rollout_step}")
        self.check_preempted()
        timer = StepTimer()
        who = Generation(self.rollout_step, self.optimizer_steps, self.global_rank, self.trainer.world_size)
        scored, sampling_metrics = self.collector.collect(self.engine, batch, who, timer, self._refill,
                                                          self._everyone, self.engine_context)
        with timer("generate"):
            self.engine.sleep()
        self.check_preempted()   # safe: nothing of this step is applied yet (the engine wakes at the next generate)
        fused = self._fused_statistics(len(scored.rollouts.texts))
        with timer("statistics"):
            train = TrainBatch(self.rollout_step, scored.rollouts, scored.scores, scored.rewards,
                               group_advantages(scored.rewards, scored.rollouts.group_ids, eps=self.cfg.adv_eps,
                                                std_normalize=self.cfg.adv_std_normalize),
                               None if fused else self.passes.statistics(scored.rollouts),
                               self.passes.reference_logprobs(scored.rollouts) if self.cfg.uses_reference else None,
                               row_offset=self.global_rank * len(scored.rollouts.texts), forks=scored.forks)
        entropy_coef = self.entropy_control.alpha   # this step's α (the update reads the same)
        self.check_preempted()   # the last safe point: an update that has begun runs to its end
        with timer("update"):
            lr, update = self._update(train)
        if fused:
            train = dataclasses.replace(train, stats=update.stats)
        if self.cfg.entropy_target is not None:
            self.entropy_control.observe(self._mean_entropy(train))
        with timer("sync"):
            self.engine.sync_weights(self.policy, self.optimizer_steps)
        self.rollout_step += 1
        self.reward_history.append(float(self.all_gather(train.rewards.mean()).mean()))
        self._log({**step_metrics(train, update, self.cfg, lr, timer, sampling_metrics),
                   "train/fused_statistics": float(fused), "train/entropy_coef": entropy_coef}, train.size)
        whole = train.selection_view(torch.arange(train.size), partial(gather_variable, device=self.device),
                                     self.global_rank)
        self._log(selection_diagnostics(update.first_epoch_weights, whole, train.forks), train.size)
        if self.sample_writer is not None and self.sample_writer.due(train.step):
            would = self.sample_writer.reference_masks(whole)   # every rank: reference selectors may gather
            if self.global_rank == 0:
                self.sample_writer.write(train.step, train.rollouts, train.rewards, whole, update.first_epoch_weights,
                                         would, update.first_epoch_shaping, train.forks)
        self.mark_step_boundary()

    def _fused_statistics(self, rows: int) -> bool:
        """Whether this step's statistics come from the update's forward; the first step logs the update's path."""
        blocker = ("fast_path.fused_statistics=false" if not self.fast_path.fused_statistics
                   else fused_blocker(self.cfg, self.selector, self.with_js, rows))
        if not self.path_reported and self.global_rank == 0:
            log.info("update path: shared prefix %s; statistics %s; micro-batches %s", self._prefix_phrase(),
                     "from the update's forward" if blocker is None else f"from a separate pass ({blocker})",
                     "by length, cut to their own widths" if self.fast_path.pack else "in row order, full width")
            self.path_reported = True
        return blocker is None

    def _prefix_phrase(self) -> str:
        """Where the shared-prefix layout runs, for the update-path log line."""
        update, no_grad = self.update_prefix_blocker, self.prefix_blocker
        if update == no_grad:
            return "on" if update is None else f"off ({update})"
        return f"off in the update ({update}), on in the statistics and reference passes"

    def _update(self, train: TrainBatch) -> tuple[float, UpdateResult]:
        """The PPO update with Lightning's backend and this step's entropy-bonus α; returns the lr it used and its
        result."""
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        lr = optimizer.param_groups[0]["lr"]
        shuffle = torch.Generator().manual_seed(derived_seed(self.seed, "shuffle", self.rollout_step))
        result = ppo_update(train, self.selector, self.cfg, lightning_backend(self, optimizer), shuffle,
                            by_length=self.fast_path.pack, entropy_coef=self.entropy_control.alpha,
                            with_js=self.with_js)
        self.optimizer_steps += result.optimizer_steps
        if scheduler is not None:
            scheduler.step()   # once per rollout step, as verl
        return lr, result

    def _refill(self) -> PromptBatch:
        """Dynamic sampling's next round of prompts from the data module's second seeded stream."""
        per_round = self.cfg.gen_prompts_per_step
        prompts = self.trainer.datamodule.refill_prompts(self.rollout_step, self.refill_position, per_round,
                                                         self.global_rank, self.trainer.world_size)
        self.refill_position += per_round
        return prompts

    def _mean_entropy(self, train: TrainBatch) -> float:
        """π_old's mean entropy over the step's response tokens of every rank (the adaptive α's input)."""
        valid = train.rollouts.response_mask.bool()
        local = torch.tensor([float(train.stats.entropy[valid].sum()), float(valid.sum())], device=self.device)
        total = self.all_gather(local).reshape(-1, 2).sum(0)
        return float(total[0] / total[1].clamp_min(1.0))

    def check_preempted(self) -> None:
        """Raise `Preempted` once any rank got a preemption signal: every rank stops at the same safe point."""
        mine = self.preemption.requested
        self.preemption.check(not self._everyone(not mine) if self.trainer.world_size > 1 else mine)

    def _everyone(self, mine: bool) -> bool:
        return bool(self.all_gather(torch.tensor(float(mine), device=self.device)).min() > 0)

    def engine_context(self) -> Any:
        """The hf engine generates with the policy object itself: under FSDP its root unit must be gathered."""
        return gathered_root(self.policy) if isinstance(self.engine, HFEngine) else nullcontext()

    def _log(self, metrics: dict[str, float], rows: int) -> None:
        sync = self.trainer.world_size > 1
        self.log_dict(metrics, on_step=True, on_epoch=False, sync_dist=sync, batch_size=rows)
        if "train/reward" in metrics:
            self.log_dict({"reward": metrics["train/reward"], "acc": metrics["train/accuracy"]}, prog_bar=True,
                          on_step=True, on_epoch=False, logger=False, sync_dist=sync, batch_size=rows)

    # ----------------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The state after the last completed step (also when a preemption saves in the middle of the next one)."""
        checkpoint["tokenrl"] = {"rollout_step": self.rollout_step, "optimizer_steps": self.optimizer_steps,
                                 "reward_history": self.reward_history,
                                 "refill_position": self.boundary.get("refill_position", self.refill_position),
                                 "entropy_control": self.entropy_control.state_dict(),
                                 "rng": self.boundary.get("rng") or rng_state()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["tokenrl"]
        self.rollout_step, self.optimizer_steps = state["rollout_step"], state["optimizer_steps"]
        self.reward_history = list(state["reward_history"])
        self.refill_position = int(state.get("refill_position", 0))   # absent in checkpoints before dynamic sampling
        if "entropy_control" in state:   # absent in checkpoints before the entropy bonus
            self.entropy_control.load_state_dict(state["entropy_control"])
        restore_rng_state(state["rng"])
