"""The PPO update of one rollout step: `ppo_epochs` × `mini_batches` optimizer steps over a `TrainBatch`
(docs/algorithms.md §1.2–1.4, §11). The loss normaliser is counted over the whole mini-batch on every rank, so the
micro-batches' shares sum to the full loss; `Backend.backward` is told the last micro-batch, so DDP all-reduces once,
and a plain loop can supply the `Backend` that `GRPOModule` builds from Lightning. `UpdatePath` takes π_old's
statistics from a separate no-grad pass (`ppo_update`) or, where step/fast_path.py says that is exact, from the
update's own forward (`fused_update`, §12.2): there the gradients are divided by the normaliser afterwards (the loss is
linear in 1/N)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.grpo import LossNormalizer, LossOutput, engine_is_weights, policy_loss
from tokenrl.algorithms.loss_settings import LossSettings
from tokenrl.records.loss_inputs import LossInputs
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.selection import Selection, single_process
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors.base import TokenSelector
from tokenrl.step.passes import PolicyPasses, UpdateForward
from tokenrl.step.train_batch import TrainBatch
from tokenrl.utils import StepTimer

UNIT = LossNormalizer(1.0, 1.0, 1.0)
log = logging.getLogger(__name__)


@dataclass
class Backend:
    """What the loop needs from the process that owns the policy and the optimizer.

    forward: (sub-batch, with statistics?, with entropy?) → `UpdateForward`; micro_batches: (rollouts, sorted row
    ids, whole groups?) → positions into those rows of each micro-batch, cut as `forward` runs them
    (`MicroBatchCut`); backward: (loss share, last micro-batch of the optimizer step?); scale_gradients: multiply
    the accumulated gradients by a factor; optimizer_step: clip, step and zero the gradients; current_stats: detached
    statistics of π_θ for a sub-batch (selectors with `stats_policy=current`); reduce_normalizer: this rank's loss
    divisors (`LossNormalizer.count`) → their sum over every rank; gather / rank: the selectors' cross-rank view;
    everyone: whether every rank answers yes (the ranks take one path: their collectives must run in one order).
    """

    forward: Callable[[RolloutBatch, bool, bool], UpdateForward]
    micro_batches: Callable[[RolloutBatch, torch.Tensor, bool], list[torch.Tensor]]
    backward: Callable[[torch.Tensor, bool], None]
    scale_gradients: Callable[[float], None]
    optimizer_step: Callable[[], None]
    current_stats: Callable[[RolloutBatch], TokenStats]
    reduce_normalizer: Callable[[LossNormalizer], LossNormalizer]
    gather: Callable[[torch.Tensor], list[torch.Tensor]] = field(default=single_process)
    rank: int = 0
    everyone: Callable[[bool], bool] = field(default=bool)


@dataclass(frozen=True)
class UpdateRun:
    """What a step's update runs with: the selector, the algorithm's settings (the loss's entropy coefficient: this
    step's α), the generator that orders the mini-batches and, for the fused update, whether its forward computes JS
    (then its micro-batches hold whole groups)."""

    selector: TokenSelector
    cfg: AlgorithmConfig
    shuffle: torch.Generator = field(default_factory=torch.Generator)
    with_js: bool = False


@dataclass
class UpdateResult:
    """Metrics of the update, the first epoch's token weights over the whole batch and the per-token fields its
    selections set (`SHAPING`; diagnostics and samples), the optimizer steps taken, π_old's statistics of the whole
    batch and whether they came from the update's own forward."""

    metrics: dict[str, float]
    first_epoch_weights: torch.Tensor
    optimizer_steps: int
    stats: TokenStats
    first_epoch_shaping: dict[str, torch.Tensor] = field(default_factory=dict)
    fused_statistics: bool = False


SHAPING = ("clip_high", "kl_weights", "advantages", "drift_coef")  # the per-token fields the samples page shows


def record_selection(
    weights: torch.Tensor, shaping: dict[str, torch.Tensor], rows: torch.Tensor, selection: Selection
) -> None:
    """Write `selection` (of `rows`) into the batch-wide `weights` and `shaping` tensors."""
    weights[rows] = selection.weights
    for name in SHAPING:
        value = getattr(selection, name)
        if value is not None:
            shaping.setdefault(name, torch.zeros(weights.shape))[rows] = value.float()


@dataclass
class UpdatePath:
    """One run's update, owning where each step's π_old statistics come from: the update's forward where the plan
    allows it for the step's rows on every rank (`ForwardPlan.statistics_blocker`), else the statistics pass first.
    The first step logs the path (rank 0)."""

    passes: PolicyPasses
    selector: TokenSelector
    cfg: AlgorithmConfig
    reported: bool = False

    def update(
        self, batch: TrainBatch, backend: Backend, shuffle: torch.Generator, entropy_coef: float, timer: StepTimer
    ) -> UpdateResult:
        """The update of `batch` with this step's entropy-bonus α and mini-batch order, the statistics pass and the
        update timed as their phases."""
        plan = self.passes.plan
        blocker = plan.statistics_blocker(self.cfg, self.selector, batch.rollouts)
        if not backend.everyone(blocker is None) and blocker is None:
            blocker = "another rank's rows cannot take it, and every rank takes the same path"
        if backend.rank == 0 and not self.reported:
            log.info(plan.describe(blocker))
            self.reported = True
        cfg = replace(self.cfg, loss=replace(self.cfg.loss, entropy_coef=entropy_coef))
        run = UpdateRun(self.selector, cfg, shuffle, plan.with_js)
        if blocker is None:
            with timer("update"):
                return fused_update(batch, run, backend)
        with timer("statistics"):
            stats = self.passes.statistics(batch.rollouts)
        with timer("update"):
            return ppo_update(batch, stats, run, backend)


def ppo_update(batch: TrainBatch, stats: TokenStats, run: UpdateRun, backend: Backend) -> UpdateResult:
    """`cfg.batch.ppo_epochs` passes over `batch`, whose π_old statistics are `stats`, in `cfg.batch.mini_batches`
    mini-batches (`run.shuffle` orders them), each cut into micro-batches by `backend.micro_batches`."""
    selector, cfg = run.selector, run.cfg
    rollouts = batch.rollouts
    is_weights = None if cfg.engine_is.tis_cap is None else engine_weights(cfg, stats.logprobs, rollouts)
    loss = UpdateLoss(batch, cfg.loss, is_weights)
    first_epoch_weights = torch.zeros(rollouts.response_ids.shape)
    shaping: dict[str, torch.Tensor] = {}
    terms: list[dict[str, torch.Tensor]] = []  # `loss_terms` per micro-batch, read once at the end
    # π_old's statistics do not change during the update: select once, over whole groups and the whole batch, so the
    # choice does not depend on how the step is cut into mini-batches (GTPO's shares, a batch-wide top fraction)
    whole = (
        selector.select(batch.selection_view(torch.arange(batch.size), stats, backend.gather, backend.rank))
        if selector.stats_policy == "old"
        else None
    )
    steps = 0
    for epoch in range(cfg.batch.ppo_epochs):
        for minibatch in torch.randperm(batch.size, generator=run.shuffle).tensor_split(cfg.batch.mini_batches):
            minibatch = minibatch.sort().values
            if whole is not None:
                selection = whole.rows(minibatch)
            else:  # stats_policy=current: ranked on this mini-batch by π_θ (π_old for the first; it has moved since)
                current = backend.current_stats(rollouts.rows(minibatch)) if steps > 0 else stats.rows(minibatch)
                selection = selector.select(batch.selection_view(minibatch, current, backend.gather, backend.rank))
            if epoch == 0:
                record_selection(first_epoch_weights, shaping, minibatch, selection)
            normalizer = backend.reduce_normalizer(
                LossNormalizer.count(rollouts.response_mask[minibatch], selection, cfg.loss)
            )
            parts = backend.micro_batches(rollouts, minibatch, False)
            for index, local in enumerate(parts):
                rows = minibatch[local]
                forward = backend.forward(rollouts.rows(rows), False, cfg.loss.entropy_coef > 0)
                # before the first optimizer step the weights are π_old's, so this very forward gives π_old and r = 1
                # exactly (the separate pass, in another layout or precision, leaves rounding in r that GSPO's 3e-4
                # clip and KL-Cov's |Δ| see); after it, π_old is the statistics pass's
                old = forward.logprobs.detach() if steps == 0 else stats.logprobs[rows]
                out = loss.micro_batch(rows, forward, old, selection.rows(local), normalizer)
                backend.backward(out.loss, index == len(parts) - 1)
                terms.append(loss_terms(out))
            backend.optimizer_step()
            steps += 1
    return UpdateResult(loss.metrics(terms, steps), first_epoch_weights, steps, stats, first_epoch_shaping=shaping)


def fused_update(batch: TrainBatch, run: UpdateRun, backend: Backend) -> UpdateResult:
    """One optimizer step whose micro-batches take π_old's statistics from their own forward (module docstring)."""
    selector, cfg = run.selector, run.cfg
    whole_groups = run.with_js or selector.reads_groups
    rollouts = batch.rollouts
    shape = rollouts.response_ids.shape
    is_weights = None if cfg.engine_is.tis_cap is None else (torch.ones(shape), torch.zeros(shape, dtype=torch.bool))
    loss = UpdateLoss(batch, cfg.loss, is_weights)
    parts = [rows.sort().values for rows in backend.micro_batches(rollouts, torch.arange(batch.size), whole_groups)]
    weights = torch.zeros(shape)
    shaping: dict[str, torch.Tensor] = {}
    local = LossNormalizer(0.0, 0.0, 0.0)
    terms: list[dict[str, torch.Tensor]] = []
    part_stats: list[TokenStats] = []
    for index, rows in enumerate(parts):
        part = rollouts.rows(rows)
        forward = backend.forward(part, True, cfg.loss.entropy_coef > 0)
        assert forward.stats is not None  # asked for (`with_stats`)
        part_stats.append(forward.stats)
        selection = selector.select(batch.selection_view(rows, forward.stats, backend.gather, backend.rank))
        record_selection(weights, shaping, rows, selection)
        local = local + LossNormalizer.count(part.response_mask, selection, cfg.loss)
        if is_weights is not None:
            for whole, share in zip(is_weights, engine_weights(cfg, forward.stats.logprobs, part)):
                whole[rows] = share.to(whole.device)
        # π_old = this forward's weights: r = 1 exactly, as the separate path
        out = loss.micro_batch(rows, forward, forward.logprobs.detach(), selection, UNIT)
        backend.backward(out.loss, index == len(parts) - 1)
        terms.append(loss_terms(out))
    divisor = max(backend.reduce_normalizer(local).pg, 1.0)
    backend.scale_gradients(1.0 / divisor)
    backend.optimizer_step()
    terms = [{**term, "loss": term["loss"] / divisor} for term in terms]
    stats = TokenStats.scatter(shape, parts, part_stats)
    return UpdateResult(loss.metrics(terms, 1), weights, 1, stats, shaping, True)


def engine_weights(
    cfg: AlgorithmConfig, trainer_logp: torch.Tensor, rollouts: RolloutBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's importance weights of `rollouts` and which tokens' ratios fell outside their bounds
    (`grpo.engine_is_weights` with `algorithm.tis_mode` / `tis_min` / `tis_cap`; docs/algorithms.md §1.6)."""
    device = trainer_logp.device
    return engine_is_weights(
        trainer_logp, rollouts.sampling_logprobs.to(device), rollouts.response_mask.to(device), cfg.engine_is
    )


@dataclass(frozen=True)
class UpdateLoss:
    """What every micro-batch's loss of one update reads beside its own rows: the batch, the loss `settings` (with
    this step's entropy coefficient) and the engine's (weights, outside) of the batch (None: off)."""

    batch: TrainBatch
    settings: LossSettings
    is_weights: tuple[torch.Tensor, torch.Tensor] | None

    def micro_batch(
        self,
        rows: torch.Tensor,
        forward: UpdateForward,
        old_logp: torch.Tensor,
        selection: Selection,
        normalizer: LossNormalizer,
    ) -> LossOutput:
        """`policy_loss` of the micro-batch `rows`, whose forward is `forward`."""
        batch, logp = self.batch, forward.logprobs
        device = logp.device

        def here(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        advantages = batch.advantages[rows] if selection.advantages is None else selection.advantages
        inputs = LossInputs(
            logp=logp,
            old_logp=old_logp.to(device),
            advantages=advantages.to(device),
            response_mask=batch.rollouts.response_mask[rows].to(device),
            weights=selection.weights.to(device),
            normalizer=selection.normalizer,
            clip_low=here(selection.clip_low),  # None: policy_loss takes the settings' ε
            clip_high=here(selection.clip_high),
            kl_weights=here(selection.kl_weights),
            drift_coef=here(selection.drift_coef),
            ref_logp=None if batch.ref_logprobs is None else batch.ref_logprobs[rows].to(device),
            is_weights=None if self.is_weights is None else self.is_weights[0][rows].to(device),
            entropy=forward.entropy,
        )
        return policy_loss(inputs, normalizer, self.settings)

    def metrics(self, terms: list[dict[str, torch.Tensor]], steps: int) -> dict[str, float]:
        """Mean loss per optimizer step, clip fractions over the weighted tokens (for DPPO: the dropped share), the
        surrogate's metrics averaged over them and the engine's importance weights: their mean and the share of
        response tokens whose ratio fell outside [tis_min, tis_cap] (truncated or masked)."""
        sums = dict.fromkeys(("loss", "clipped", "dual_clipped", "selected"), 0.0)
        if terms:  # one read of the device: every micro-batch's terms, in `loss_terms`' order
            stacked = torch.stack([torch.stack(list(term.values())) for term in terms]).sum(0)
            sums = dict(zip(terms[0], stacked.tolist()))
        selected = max(sums["selected"], 1.0)
        metrics = {"loss": sums["loss"] / max(steps, 1), "clip_frac": sums["clipped"] / selected}
        if self.settings.dual_clip is not None:
            metrics["dual_clip_frac"] = sums["dual_clipped"] / selected
        metrics.update({name: value / selected for name, value in sums.items() if name.startswith("surrogate/")})
        if self.is_weights is not None:
            weights, outside = self.is_weights
            valid = self.batch.rollouts.response_mask.bool().to(weights.device)
            metrics["tis_weight_mean"] = float(weights[valid].mean()) if valid.any() else 1.0
            metrics["tis_capped_frac"] = float(outside[valid].float().mean()) if valid.any() else 0.0
        return metrics


def loss_terms(out: LossOutput) -> dict[str, torch.Tensor]:
    """A micro-batch's loss, clipped, dual-clipped and selected tokens and the surrogate's metrics summed over them
    (`surrogate/<name>`), kept on the device and read once at the end."""
    terms = {
        "loss": out.loss,
        "clipped": out.clipped_tokens,
        "dual_clipped": out.dual_clipped_tokens,
        "selected": out.selected_tokens,
        **{f"surrogate/{name}": value for name, value in out.metrics.items()},
    }
    return {name: term.detach().double() for name, term in terms.items()}
