"""`fast_path`: the update's exact shortcuts (docs/algorithms.md §12), each on by default (the shared prefix off a GPU
only, the fused head on a GPU only) and taken only where it is exact. This module alone decides which path a step
takes — the shared prefix (`shared_prefix_blocker`), statistics from the update's forward (`fused_blocker`),
micro-batches by length, the fused LM head (`fused_head_blocker`) — and `UpdatePath` says once per run which were
taken and why not the others; step/update.py only runs the path chosen."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.selectors.base import TokenSelector
from tokenrl.step.passes import PolicyPasses, fused_head_blocker, shared_prefix_blocker

GPU_AUTO_OFF = (
    "fast_path.shared_prefix=auto on a GPU, where it measured slower (docs/algorithms.md §12.1); true forces it"
)
CPU_HEAD_AUTO_OFF = "fast_path.fused_head=auto off a GPU (docs/algorithms.md §12.5); true forces it"
AUTO_KEYS = ("shared_prefix", "fused_head")


def fused_blocker(cfg: AlgorithmConfig, selector: TokenSelector, with_js: bool, rows: int) -> str | None:
    """Why the statistics cannot come from the update's forward for a batch of `rows` rows on this rank (None: they
    can, exactly). The first optimizer step must be the only one (π_θ = π_old), and the selection of each micro-batch
    must be the mini-batch's: one micro-batch, or a selector that chooses row by row (`row_local`) on micro-batches of
    whole groups when it compares a row with its group; the gradient can be divided afterwards only by one
    normaliser."""
    if cfg.batch.optimizer_steps > 1:
        return (
            f"algorithm.ppo_epochs × mini_batches = {cfg.batch.optimizer_steps} optimizer steps: every "
            "step after the first needs π_old's statistics"
        )
    if rows > cfg.batch.micro_batch_size:
        if not selector.row_local:
            scope = getattr(selector, "scope", None)
            why = (
                f"selector.scope={scope} ranks across rows (selector.scope=sequence chooses row by row)"
                if scope is not None
                else f"{type(selector).__name__} does not declare row_local: set `row_local = True` on it if each "
                "row's choice depends only on that row and its group"
            )
            return (
                f"selector {selector.name} chooses over the mini-batch ({rows} rows), which spans several "
                f"micro-batches of algorithm.micro_batch_size={cfg.batch.micro_batch_size}: {why}"
            )
        if (with_js or selector.reads_groups) and cfg.batch.micro_batch_size < cfg.batch.group_size:
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
    """shared_prefix: each group's prompt encoded once (models/response_forward.py); fused_statistics: π_old's
    statistics from the update's own forward (step/update.py); pack: micro-batches of similar lengths, each
    forward cut to its own longest prompt and response (step/micro_batches.py). `shared_prefix_auto`: the shared
    prefix was `auto` and resolved for the run's device (off on a GPU). fused_head: log π, the entropy and the
    statistics from the hidden states through the fused, chunked head (models/lm_head.py), never the full logits;
    `auto` resolves on a GPU only (`fused_head_auto` records it; not part of the record's equality)."""

    shared_prefix: bool = True
    fused_statistics: bool = True
    pack: bool = True
    shared_prefix_auto: bool = False
    fused_head: bool = False
    fused_head_auto: bool = dataclasses.field(default=False, compare=False)

    @classmethod
    def from_node(cls, node: Mapping[str, Any] | None, on_gpu: bool = False) -> FastPath:
        """The record of the `fast_path` node (None: every shortcut on but the fused head) for a run on a GPU or not
        (`shared_prefix: auto` is on only off a GPU, `fused_head: auto` only on one); ValueError names an unknown or
        invalid key."""
        node = dict(node or {})
        names = [field.name for field in dataclasses.fields(cls) if not field.name.endswith("_auto")]
        for key, value in node.items():
            if key not in names:
                raise ValueError(f"fast_path.{key} is not a setting (settings: {names})")
            if not isinstance(value, bool) and not (key in AUTO_KEYS and value == "auto"):
                raise ValueError(
                    f"fast_path.{key}={value!r} must be true or false" + (" or auto" if key in AUTO_KEYS else "")
                )
        if node.get("shared_prefix") == "auto":
            node.update(shared_prefix=not on_gpu, shared_prefix_auto=True)
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
    """The shortcuts one run's update takes: each `*_blocker` is why the shared prefix is off (None: on), in the
    passes without gradient (statistics, reference) and in the update's forward; `reported`: the run's log said so."""

    fast_path: FastPath
    prefix_blocker: str | None
    update_prefix_blocker: str | None
    reported: bool = False
    head_blocker: str | None = "fast_path.fused_head=false"

    @classmethod
    def of(cls, fast_path: FastPath, policy: nn.Module) -> UpdatePath:
        """The path `fast_path` asks for, as far as `policy` allows it (gradient checkpointing blocks the shared prefix
        with gradient: `shared_prefix_blocker`)."""
        off = (
            None
            if fast_path.shared_prefix
            else (GPU_AUTO_OFF if fast_path.shared_prefix_auto else "fast_path.shared_prefix=false")
        )
        head_off = (
            None
            if fast_path.fused_head
            else (CPU_HEAD_AUTO_OFF if fast_path.fused_head_auto else "fast_path.fused_head=false")
        )
        return cls(
            fast_path,
            off or shared_prefix_blocker(policy, with_grad=False),
            off or shared_prefix_blocker(policy, with_grad=True),
            head_blocker=head_off or head_blocker_of(policy),
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
    ) -> PolicyPasses:
        """The policy's passes in the layouts this path takes: the shared prefix where it is not blocked, each
        micro-batch cut to its own widths with `pack`."""
        return PolicyPasses(
            policy,
            reference,
            temperature,
            micro_batch_size,
            stats_chunk_size,
            with_js,
            js_peers,
            share_prefix=self.prefix_blocker is None,
            share_prefix_update=self.update_prefix_blocker is None,
            trim=self.fast_path.pack,
            fused_head=self.fast_path.fused_head,
        )

    def statistics_blocker(self, cfg: AlgorithmConfig, selector: TokenSelector, with_js: bool, rows: int) -> str | None:
        """Why a step of `rows` rows takes π_old's statistics from a separate pass (None: from the update's forward)."""
        if not self.fast_path.fused_statistics:
            return "fast_path.fused_statistics=false"
        return fused_blocker(cfg, selector, with_js, rows)

    def fused_statistics(
        self, cfg: AlgorithmConfig, selector: TokenSelector, with_js: bool, rows: int, report: logging.Logger | None
    ) -> bool:
        """Whether a step of `rows` rows takes π_old's statistics from the update's forward; the first call with a
        `report` logger logs the update's path there."""
        blocker = self.statistics_blocker(cfg, selector, with_js, rows)
        if report is not None and not self.reported:
            report.info(self.describe(blocker))
            self.reported = True
        return blocker is None

    def describe(self, statistics_blocker: str | None) -> str:
        """The run log's line: where the shared prefix runs, where the statistics come from, how micro-batches are
        cut and, where `fast_path.fused_head` asks for it, whether the head is fused."""
        update, no_grad = self.update_prefix_blocker, self.prefix_blocker
        prefix = (
            ("on" if update is None else f"off ({update})")
            if update == no_grad
            else f"off in the update ({update}), on in the statistics and reference passes"
        )
        statistics = (
            "from the update's forward"
            if statistics_blocker is None
            else f"from a separate pass ({statistics_blocker})"
        )
        cut = "by length, cut to their own widths" if self.fast_path.pack else "in row order, full width"
        line = f"update path: shared prefix {prefix}; statistics {statistics}; micro-batches {cut}"
        if not self.fast_path.fused_head:  # off (or auto off a GPU): the head as it always was, nothing to add
            return line
        head = "fused over vocabulary chunks" if self.head_blocker is None else f"materialised ({self.head_blocker})"
        return f"{line}; LM head {head}"
