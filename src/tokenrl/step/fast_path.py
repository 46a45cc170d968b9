"""`fast_path`: the update's exact shortcuts (docs/algorithms.md §12), each taken only where it is exact. This module
alone decides which path a step takes: `ForwardPlan` resolves once per run which forwards the model allows and how each
pass cuts its rows; `statistics_blocker` says per step whether π_old's statistics come from the update's own forward.
step/update.py only runs the path chosen."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.models.lm_head import fusable_head
from tokenrl.models.packed import packed_blocker
from tokenrl.models.response_forward import LAYOUTS, decoder_and_head
from tokenrl.models.sharding import hf_model, is_sharded
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.selectors.base import TokenSelector
from tokenrl.step.micro_batches import MicroBatchCut

# `fast_path.layout: auto`, by device: the fastest layout measured there (docs/algorithms.md §12.1, §12.4)
AUTO_LAYOUT = {"cpu": "shared_prefix", "cuda": "padded"}


@dataclass(frozen=True)
class TokenBudgetCut:
    """How the fused update would cut one batch under `algorithm.micro_batch_tokens`: into `parts` micro-batches, one
    of them holding a group whose tokens exceed the budget (`group_over`: whole groups run whole, however long)."""

    parts: int
    group_over: bool

    @classmethod
    def of(cls, cut: MicroBatchCut, rollouts: RolloutBatch, whole_groups: bool) -> TokenBudgetCut:
        parts = cut(rollouts, torch.arange(rollouts.response_ids.shape[0]), whole_groups)
        budget = cut.max_tokens
        over = budget is not None and any(len(part) > 1 and cut.tokens(rollouts, part) > budget for part in parts)
        return cls(len(parts), over)


def fused_blocker(
    cfg: AlgorithmConfig, selector: TokenSelector, with_js: bool, rows: int, budget: TokenBudgetCut | None = None
) -> str | None:
    """Why the statistics cannot come from the update's forward for a batch of `rows` rows on this rank (None: they
    can, exactly; the three conditions of docs/algorithms.md §12.2). `budget`: with `algorithm.micro_batch_tokens`, how
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
    """The `fast_path` node (docs/algorithms.md §12): the forwards' `layout` (`LAYOUTS`), π_old's statistics from the
    update's own forward (`fused_statistics`), micro-batches by length (`pack`), the fused LM head (`fused_head`).
    `layout_auto` / `fused_head_auto` record that the setting was `auto`, resolved for the run's device; they are not
    part of the record's equality."""

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


def layout_blocker(model: nn.Module, layout: str, with_grad: bool = True) -> str | None:
    """Why a pass over `model` cannot run `layout` (None: it can; the padded layout always can): FSDP runs every pass
    through the root's single forward; in the update (`with_grad`), gradient checkpointing turns transformers' KV cache
    off (the shared prefix) and recomputes the layers outside the packed attention (`packed_blocker`)."""
    if layout == "padded":
        return None
    if is_sharded(model):
        return "FSDP updates through the root module's own forward"
    if layout == "packed":
        return packed_blocker(model, with_grad)
    base = hf_model(model)
    if with_grad and getattr(base, "is_gradient_checkpointing", False):
        return "gradient checkpointing turns transformers' KV cache off in the update"
    return None


def fused_head_blocker(model: nn.Module, with_grad: bool = True) -> str | None:
    """Why a pass over `model` cannot take the fused head (None: it can): FSDP runs the update through the root's
    own forward, which applies the head itself; an adapter-wrapped (or otherwise not plain linear) head."""
    if with_grad and is_sharded(model):
        return "FSDP updates through the root module's own forward"
    _, head = decoder_and_head(model)
    if not fusable_head(head):
        return f"the output head is a {type(head).__name__}, not a plain nn.Linear"
    return None


PLAIN = FastPath("padded", fused_statistics=False, pack=False)  # every forward as the model's own: no shortcut


@dataclass(frozen=True)
class ForwardPlan:
    """How every pass of one run runs the policy, resolved once (`resolved`): the sampling `temperature`, the rows
    (`micro_batch_size`) or tokens (`micro_batch_tokens`) of a micro-batch, the statistics' `stats_chunk_size`, JS
    (`with_js`, over `js_peers`), and the `fast_path` shortcuts as far as the model allows them: `blockers` names each
    one the model refuses ("layout" in the no-grad passes, "update_layout", "head" in the no-grad passes,
    "update_head") and why."""

    temperature: float
    micro_batch_size: int
    stats_chunk_size: int
    with_js: bool = False
    js_peers: str = "all"
    micro_batch_tokens: int | None = None
    fast_path: FastPath = PLAIN
    blockers: tuple[tuple[str, str], ...] = ()

    def resolved(self, policy: nn.Module) -> ForwardPlan:
        """This plan with the shortcuts `policy` refuses named (e.g. gradient checkpointing keeps the update padded;
        the reference is a copy of the policy, or the policy itself with its adapters off, so one check holds for
        both)."""
        layout, fused = self.fast_path.layout, self.fast_path.fused_head
        found = {
            "layout": layout_blocker(policy, layout, with_grad=False),
            "update_layout": layout_blocker(policy, layout, with_grad=True),
            "head": fused_head_blocker(policy, with_grad=False) if fused else None,
            "update_head": fused_head_blocker(policy, with_grad=True) if fused else None,
        }
        return dataclasses.replace(self, blockers=tuple((key, why) for key, why in found.items() if why))

    def blocker(self, name: str) -> str | None:
        return dict(self.blockers).get(name)

    def layout(self, with_grad: bool) -> str:
        """The layout of the update's forward (`with_grad`) or of a pass without gradient: the chosen one where the
        model allows it, else padded."""
        allowed = self.blocker("update_layout" if with_grad else "layout") is None
        return self.fast_path.layout if allowed else "padded"

    def fuses_head(self, with_grad: bool) -> bool:
        return self.fast_path.fused_head and self.blocker("update_head" if with_grad else "head") is None

    @property
    def trim(self) -> bool:
        """Each micro-batch cut to its own longest prompt and response, groups ordered by length (`fast_path.pack`)."""
        return self.fast_path.pack

    def cut(self, with_grad: bool) -> MicroBatchCut:
        """How the update's forward (`with_grad`) or a pass without gradient cuts its rows into micro-batches, the
        token budget counted in that pass's layout (a budget is refused under FSDP: config/check.py)."""
        layout = self.layout(with_grad)
        return MicroBatchCut(self.micro_batch_size, self.micro_batch_tokens, layout, self.trim, self.trim)

    def statistics_blocker(self, cfg: AlgorithmConfig, selector: TokenSelector, rollouts: RolloutBatch) -> str | None:
        """Why the step of `rollouts` (this rank's) takes π_old's statistics from a separate pass (None: from the
        update's forward, whose micro-batches `cut(with_grad=True)` makes)."""
        if not self.fast_path.fused_statistics:
            return "fast_path.fused_statistics=false"
        cut, budget = self.cut(with_grad=True), None
        if cut.max_tokens is not None and cfg.batch.optimizer_steps == 1:  # else refused whatever the cut
            budget = TokenBudgetCut.of(cut, rollouts, self.with_js or selector.reads_groups)
        return fused_blocker(cfg, selector, self.with_js, rollouts.response_ids.shape[0], budget)

    def describe(self, statistics_blocker: str | None) -> str:
        """The run log's line: the layout of the forwards (and where it came from), where the statistics come from,
        how micro-batches are cut and, where `fast_path.fused_head` asks for it, whether the head is fused."""
        chosen = self.fast_path.layout
        no_grad, update = self.layout(with_grad=False), self.layout(with_grad=True)
        if update == no_grad:
            reasons = dict.fromkeys((self.blocker("layout"), self.blocker("update_layout")))  # the no-grad one first
            layout = no_grad if update == chosen else f"padded ({chosen}: {'; '.join(filter(None, reasons))})"
        else:
            layout = (
                f"padded in the update ({chosen}: {self.blocker('update_layout')}), {chosen} in the statistics and "
                "reference passes"
            )
        if self.fast_path.layout_auto:
            layout += " (fast_path.layout=auto: the device's measured choice, docs/algorithms.md §12.4)"
        statistics = (
            "from the update's forward"
            if statistics_blocker is None
            else f"from a separate pass ({statistics_blocker})"
        )
        cut = "by length, cut to their own widths" if self.trim else "in row order, full width"
        if self.micro_batch_tokens is not None:
            cut += f", at most {self.micro_batch_tokens} tokens each (algorithm.micro_batch_tokens)"
        line = f"update path: layout {layout}; statistics {statistics}; micro-batches {cut}"
        if not self.fast_path.fused_head:  # off, or auto off a GPU: the head as it always was
            return line
        blocker = self.blocker("update_head")
        head = "fused over vocabulary chunks" if blocker is None else f"materialised ({blocker})"
        return f"{line}; LM head {head}"
