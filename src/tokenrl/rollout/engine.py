"""The rollout contract: G samples per prompt from the current weights, with token ids and sampling log-probs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.settings import RolloutSettings


@dataclass(frozen=True)
class SamplingParams:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int

    @staticmethod
    def of_rollout(settings: RolloutSettings, n: int) -> SamplingParams:
        """n samples per prompt with the rollout's temperature, top-p, top-k and response budget."""
        return SamplingParams(
            n=n,
            temperature=float(settings.temperature),
            top_p=float(settings.top_p),
            top_k=int(settings.top_k),
            max_new_tokens=int(settings.max_new_tokens),
        )


class RolloutEngine(ABC):
    """Generates from the trainer's current weights; `sync_weights` is called after every optimizer step. Every engine
    call runs with autocast off (`training_step` runs inside the trainer's autocast under `precision=bf16-mixed`): an
    engine computes in its own dtype (CUDA autocast would rewrite vLLM's torch ops; the `hf` engine samples from the
    model's own weights, as the statistics pass scores them). Subclasses implement `_generate`, `_sync_weights` and, if
    they can free memory, `_sleep`."""

    weights_version: int = 0

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        """n samples for each prompt, seeded so the same (weights, prompts, seed) give the same rollouts."""
        with autocast_disabled():
            return self._generate(prompt_ids, params, seed)

    def sync_weights(self, model: nn.Module, version: int) -> None:
        """Make the engine generate with `model`'s weights from now on (`version` = optimizer steps applied)."""
        with autocast_disabled():
            self._sync_weights(model, version)

    def sleep(self) -> None:
        """Free accelerator memory until the next `sync_weights` (between generation and the update)."""
        with autocast_disabled():
            self._sleep()

    @abstractmethod
    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        """`generate` without the autocast guard."""

    @abstractmethod
    def _sync_weights(self, model: nn.Module, version: int) -> None:
        """`sync_weights` without the autocast guard."""

    def context(self) -> AbstractContextManager:
        """What every rank enters around generation: nothing by default (the `hf` engine gathers its FSDP root)."""
        return nullcontext()

    def _sleep(self) -> None:  # noqa: B027  (an optional hook: a no-op unless an engine overrides it)
        """Nothing to free by default."""

    def close(self) -> None:  # noqa: B027  (an optional hook: a no-op unless an engine overrides it)
        """Release engine resources."""


@contextmanager
def autocast_disabled() -> Iterator[None]:
    """No autocast on the CPU nor on any CUDA device for the block, whatever the caller entered."""
    with ExitStack() as stack:
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) with every sequence right-aligned to the longest."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def response_mask_until_eos(response_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, list[str]]:
    """Mask covering tokens up to and including the first EOS; finish reason 'stop' if one was produced."""
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, dtype=response_ids.dtype))
    seen_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    mask = (~seen_before).long()
    reasons = ["stop" if row.any() else "length" for row in is_eos]
    return mask, reasons
