"""Rollout engines. `build_engine` picks one by name (`rollout.engine`)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn
from transformers import PreTrainedTokenizerBase

from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.settings import RolloutSettings
from tokenrl.rollout.engine import RolloutEngine, SamplingParams

ENGINES = ("hf", "vllm")


def build_engine(
    settings: RolloutSettings,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    weights_version: int = 0,
    interrupt: Callable[[], bool] | None = None,
) -> RolloutEngine:
    """The engine `rollout.engine` names, serving `model`'s current weights as version `weights_version`; the `hf`
    engine stops generating once `interrupt()` is true (a preemption signal; vLLM's requests are short)."""
    if settings.engine == "hf":
        from tokenrl.rollout.hf import HFEngine

        engine = HFEngine(model, tokenizer, weights_version, decoding=settings.decoding)
        engine.interrupt = interrupt or engine.interrupt
        return engine
    if settings.engine == "vllm":
        from tokenrl.rollout.vllm_engine import VLLMEngine

        assert settings.vllm is not None  # RolloutSettings.of reads the vllm keys of rollout.engine=vllm
        return VLLMEngine(model, tokenizer, settings.vllm, weights_version)
    raise ValueError(f"rollout.engine={settings.engine!r} is not one of {ENGINES}")


__all__ = ["ENGINES", "RolloutBatch", "RolloutEngine", "SamplingParams", "build_engine"]
