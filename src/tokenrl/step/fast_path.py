"""`fast_path`: the update's exact shortcuts (docs/algorithms.md §12), each on by default (the layout chosen per
device by measurement, the fused head on a GPU only) and taken only where it is exact. This module alone decides which
path a step takes — the layout of the forwards (`layout_blocker`), statistics from the update's forward
(`fused_blocker`), micro-batches by length, the fused LM head (`fused_head_blocker`) — and `UpdatePath` says once per
run which were taken and why not the others; step/update.py only runs the path chosen."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.models.response_forward import LAYOUTS
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.selectors.base import TokenSelector
from tokenrl.step.micro_batches import MicroBatchCut
from tokenrl.step.passes import PolicyPasses, fused_head_blocker, layout_blocker

# `fast_path.layout: auto`, by device: the fastest layout measured there (docs/algorithms.md §12.4). CPU: the step of
# scripts/bench/step.py in each layout (benchmarks/step_layouts.json); cuda: on an H200 the shared prefix made the
# update 2x slower than the padded layout (§12.1), and the packed layout has not run on a GPU yet.
AUTO_LAYOUT = {"cpu": "shared_prefix", "cuda": "padded"}
CPU_HEAD_AUTO_OFF = "fast_path.fused_head=auto off a GPU (docs/algorithms.md §12.5); true forces it"


@dataclass(frozen=True)
class TokenBudgetCut:
    """How the fused update would cut one batch under `algorithm.micro_batch_tokens`: into `parts` micro-batches, one
    of them holding a group whose tokens exceed the budget (`group_over`: whole groups run whole, however long)."""

    parts: int
    group_over: bool

    @classmethod
    def of(cls, cut: MicroBatchCut, rollouts: RolloutBatch, whole_groups: bool) -> TokenBudgetCut:
        parts = cut(rollouts, torch.arange(rollouts.response_ids.shape[0]), whole_groups)
        over = any(len(part) > 1 and cut.tokens(rollouts, part) > cut.max_tokens for part in parts)
        return cls(len(parts), over)


def fused_blocker(
    cfg: AlgorithmConfig, selector: TokenSelector, with_js: bool, rows: int, budget: TokenBudgetCut | None = None
) -> str | None:
    """Why the statistics cannot come from the update's forward for a batch of `rows` rows on this rank (None: they
    can, exactly). The first optimizer step must be the only one (π_θ = π_old), and the selection of each micro-batch
    must be the mini-batch's: one micro-batch, or a selector that chooses row by row (`row_local`) on micro-batches of
    whole groups when it compares a row with its group — groups no larger than the micro-batch the setting asks for;
    the gradient can be divided afterwards only by one normaliser. `budget`: with `algorithm.micro_batch_tokens`, how
    the fused update would cut this batch (the micro-batches then depend on the lengths, not the row count)."""
    if cfg.batch.optimizer_steps > 1:
        return (
            f"algorithm.ppo_epochs × mini_batches = {cfg.batch.optimizer_steps} optimizer steps: every "
            "step after the first needs π_old's statistics"
        )
    if budget is not None:
        several = budget.parts > 1
        spans = f"{budget.parts} micro-batches of algorithm.micro_batch_tokens={cfg.batch.micro_batch_tokens}"
    else:
        several = rows > cfg.batch.micro_batch_size
        spans = f"several micro-batches of algorithm.micro_batch_size={cfg.batch.micro_batch_size}"
    if several and not selector.row_local:
        scope = getattr(selector, "scope", None)
        why = (
            f"selector.scope={scope} ranks across rows (selector.scope=sequence chooses row by row)"
            if scope is not None
            else f"{type(selector).__name__} does not declare row_local: set `row_local = True` on it if each "
            "row's choice depends only on that row and its group"
        )
        return f"selector {selector.name} chooses over the mini-batch ({rows} rows), which spans {spans}: {why}"
    if with_js or selector.reads_groups:
        if budget is not None and budget.group_over:
            return (
                "JS or the selection compares a group's rows, and a group's tokens exceed "
                f"algorithm.micro_batch_tokens={cfg.batch.micro_batch_tokens}"
            )
        if budget is None and several and cfg.batch.micro_batch_size < cfg.batch.group_size:
            return (
                f"JS or the selection compares a group's {cfg.batch.group_size} rows, more than "
                f"algorithm.micro_batch_size={cfg.batch.micro_batch_size}"
            )
    if cfg.loss.aggregation == "token-mean":
        selected = selector.normalizer == "selected"
        if cfg.uses_reference and (cfg.loss.kl_masked != selected or selector.weighs_kl):
            return (
                "the policy-gradient and KL terms are divided by different token counts (selector.normalizer="
                f"{selector.normalizer}, algorithm.kl_masked={cfg.loss.kl_masked}"
                + (", per-token KL weights)" if selector.weighs_kl else ")")
            )
        if cfg.uses_entropy_bonus and cfg.loss.entropy_masked != selected:
            return (
                "the policy-gradient and entropy terms are divided by different token counts (selector.normalizer="
                f"{selector.normalizer}, algorithm.entropy_masked={cfg.loss.entropy_masked})"
            )
    return None


@dataclass(frozen=True)
class FastPath:
    """layout: the forwards' layout (models/response_forward.py's `LAYOUTS`: each group's prompt once in
    `shared_prefix` and `packed`); fused_statistics: π_old's statistics from the update's own forward
    (step/update.py); pack: micro-batches of similar lengths, each forward cut to its own longest prompt and response
    (step/micro_batches.py). fused_head: log π, the entropy and the statistics from the hidden states through the
    fused, chunked head (models/lm_head.py), never the full logits. `layout_auto` / `fused_head_auto` record that the
    setting was `auto`, resolved for the run's device (`AUTO_LAYOUT`; the head on a GPU only); they are not part of
    the record's equality."""

    layout: str = AUTO_LAYOUT["cpu"]
    fused_statistics: bool = True
    pack: bool = True
    layout_auto: bool = dataclasses.field(default=False, compare=False)
    fused_head: bool = False
    fused_head_auto: bool = dataclasses.field(default=False, compare=False)

    @classmethod
    def from_node(cls, node: Mapping[str, Any] | None, on_gpu: bool = False) -> FastPath:
        """The record of the `fast_path` node (None: every shortcut on, the layout the device's `auto`, the head
        unfused) for a run on a GPU or not (`layout: auto` is `AUTO_LAYOUT`'s, `fused_head: auto` on only on a GPU);
        ValueError names an unknown or invalid key."""
        node = dict(node or {})
        names = [field.name for field in dataclasses.fields(cls) if not field.name.endswith("_auto")]
        for key, value in node.items():
            if key not in names:
                raise ValueError(f"fast_path.{key} is not a setting (settings: {names})")
            if key == "layout":
                if value != "auto" and value not in LAYOUTS:
                    raise ValueError(f"fast_path.layout={value!r} must be auto or one of {', '.join(LAYOUTS)}")
            elif not isinstance(value, bool) and not (key == "fused_head" and value == "auto"):
                raise ValueError(
                    f"fast_path.{key}={value!r} must be true or false" + (" or auto" if key == "fused_head" else "")
                )
        if node.get("layout", "auto") == "auto":
            node.update(layout=AUTO_LAYOUT["cuda" if on_gpu else "cpu"], layout_auto=True)
        if node.get("fused_head") == "auto":
            node.update(fused_head=on_gpu, fused_head_auto=True)
        return cls(**node)


def head_blocker_of(policy: nn.Module) -> str | None:
    """Why the update cannot take the fused head with `policy` (None: it can); a model without a causal LM's
    decoder/head pair (a stand-in in tests) is not refused here: the passes check again."""
    try:
        return fused_head_blocker(policy, with_grad=True)
    except AttributeError:
        return None


@dataclass
class UpdatePath:
    """The shortcuts one run's update takes: each `*layout_blocker` is why the chosen layout is not run (None: it is;
    the padded one runs instead), in the passes without gradient (statistics, reference) and in the update's forward;
    `reported`: the run's log said so."""

    fast_path: FastPath
    layout_blocker: str | None
    update_layout_blocker: str | None
    reported: bool = False
    head_blocker: str | None = "fast_path.fused_head=false"

    @classmethod
    def of(cls, fast_path: FastPath, policy: nn.Module) -> UpdatePath:
        """The path `fast_path` asks for, as far as `policy` allows it (`layout_blocker`: e.g. gradient checkpointing
        keeps the update padded)."""
        head_off = (
            None
            if fast_path.fused_head
            else (CPU_HEAD_AUTO_OFF if fast_path.fused_head_auto else "fast_path.fused_head=false")
        )
        return cls(
            fast_path,
            layout_blocker(policy, fast_path.layout, with_grad=False),
            layout_blocker(policy, fast_path.layout, with_grad=True),
            head_blocker=head_off or head_blocker_of(policy),
        )

    def layouts(self) -> tuple[str, str]:
        """(the no-grad passes' layout, the update's): the chosen one where it is not blocked, else padded."""
        chosen = self.fast_path.layout
        return (
            chosen if self.layout_blocker is None else "padded",
            chosen if self.update_layout_blocker is None else "padded",
        )

    def policy_passes(
        self,
        policy: nn.Module,
        reference: nn.Module | None,
        temperature: float,
        micro_batch_size: int,
        stats_chunk_size: int,
        with_js: bool,
        js_peers: str,
        micro_batch_tokens: int | None = None,
    ) -> PolicyPasses:
        """The policy's passes in the layouts this path takes, each micro-batch cut to its own widths and groups
        ordered by length with `pack`, by rows or by `micro_batch_tokens` tokens."""
        layout, update_layout = self.layouts()
        return PolicyPasses(
            policy,
            reference,
            temperature,
            micro_batch_size,
            stats_chunk_size,
            with_js,
            js_peers,
            layout=layout,
            update_layout=update_layout,
            trim=self.fast_path.pack,
            fused_head=self.fast_path.fused_head,
            micro_batch_tokens=micro_batch_tokens,
            by_length=self.fast_path.pack,
        )

    def statistics_blocker(
        self, cfg: AlgorithmConfig, selector: TokenSelector, with_js: bool, rollouts: RolloutBatch, cut: MicroBatchCut
    ) -> str | None:
        """Why the step of `rollouts` (this rank's) takes π_old's statistics from a separate pass (None: from the
        update's forward, whose micro-batches `cut` makes)."""
        if not self.fast_path.fused_statistics:
            return "fast_path.fused_statistics=false"
        budget = None
        if cut.max_tokens is not None and cfg.batch.optimizer_steps == 1:  # else refused whatever the cut
            budget = TokenBudgetCut.of(cut, rollouts, with_js or selector.reads_groups)
        return fused_blocker(cfg, selector, with_js, rollouts.response_ids.shape[0], budget)

    def fused_statistics(
        self,
        cfg: AlgorithmConfig,
        selector: TokenSelector,
        with_js: bool,
        rollouts: RolloutBatch,
        cut: MicroBatchCut,
        report: logging.Logger | None,
        everyone: Callable[[bool], bool] | None = None,
    ) -> bool:
        """Whether the step of `rollouts` takes π_old's statistics from the update's forward; the first call with a
        `report` logger logs the update's path there. `everyone` (several ranks): whether every rank's answer is yes —
        each rank decides on its own rows (a token budget cuts them by their lengths), and the ranks must take one path
        (their collectives run in a different order on each)."""
        blocker = self.statistics_blocker(cfg, selector, with_js, rollouts, cut)
        if everyone is not None and not everyone(blocker is None) and blocker is None:
            blocker = "another rank's rows cannot take it, and every rank takes the same path"
        if report is not None and not self.reported:
            report.info(self.describe(blocker, cut.max_tokens))
            self.reported = True
        return blocker is None

    def describe(self, statistics_blocker: str | None, micro_batch_tokens: int | None = None) -> str:
        """The run log's line: the layout of the forwards (and where it came from), where the statistics come from,
        how micro-batches are cut (`micro_batch_tokens`: by that token budget) and, where `fast_path.fused_head` asks
        for it, whether the head is fused."""
        chosen = self.fast_path.layout
        no_grad, update = self.layouts()
        if update == no_grad:
            reasons = dict.fromkeys((self.layout_blocker, self.update_layout_blocker))  # the no-grad one first
            layout = no_grad if update == chosen else f"padded ({chosen}: {'; '.join(filter(None, reasons))})"
        else:
            layout = (
                f"padded in the update ({chosen}: {self.update_layout_blocker}), {chosen} in the statistics and "
                "reference passes"
            )
        if self.fast_path.layout_auto:
            layout += " (fast_path.layout=auto: the device's measured choice, docs/algorithms.md §12.4)"
        statistics = (
            "from the update's forward"
            if statistics_blocker is None
            else f"from a separate pass ({statistics_blocker})"
        )
        cut = "by length, cut to their own widths" if self.fast_path.pack else "in row order, full width"
        if micro_batch_tokens is not None:
            cut += f", at most {micro_batch_tokens} tokens each (algorithm.micro_batch_tokens)"
        line = f"update path: layout {layout}; statistics {statistics}; micro-batches {cut}"
        if not self.fast_path.fused_head:  # off (or auto off a GPU): the head as it always was, nothing to add
            return line
        head = "fused over vocabulary chunks" if self.head_blocker is None else f"materialised ({self.head_blocker})"
        return f"{line}; LM head {head}"
