"""The `model`, `rollout` and `task.warmup` nodes as frozen records, each read once from the resolved config; `of(node)`
refuses an unknown key, or a missing one without a default, naming it as the command line writes it (`model.<key>`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


def _record(cls: type, node: Mapping[str, Any], where: str, **derived: Any) -> Any:
    """`cls` of `node`'s keys and the `derived` fields, refusing an unknown or a missing key of `where`."""
    fields = {field.name: field for field in dataclasses.fields(cls) if field.name not in derived}
    unknown = sorted(set(node) - set(fields))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a setting of `{where}` (settings: {', '.join(fields)})")
    missing = [name for name, field in fields.items() if field.default is dataclasses.MISSING and name not in node]
    if missing:
        raise ValueError(f"{where}.{missing[0]} is missing from the `{where}` config")
    return cls(**node, **derived)


@dataclass(frozen=True)
class ModelSettings:
    """The policy (configs/model/smollm2_135m.yaml documents each key); the keys with a default are those a command
    line may add (`+model.lora=…`)."""

    name: str
    source: str | None
    init: str
    dtype: str
    chat_template: bool | str
    stats_chunk_size: int
    architecture: Mapping[str, Any]
    tokenizer: str | None = None
    reference_dtype: str | None = None
    lora: Mapping[str, Any] | None = None
    gradient_checkpointing: bool = False
    paper_task: str | None = None

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> ModelSettings:
        return _record(cls, node, "model")


@dataclass(frozen=True)
class VLLMSettings:
    """The `vllm` engine's keys of the rollout node (configs/rollout/vllm.yaml documents each)."""

    max_model_len: int
    dtype: Literal["float32", "bfloat16", "float16", "auto"]  # rollout.dtype's rule (config/known_settings.py)
    kv_cache_gib: float
    gpu_memory_utilization: float
    enforce_eager: bool
    sync_bucket_mb: float
    sleep_level: int
    tensor_parallel_size: int
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    enable_chunked_prefill: bool


@dataclass(frozen=True)
class RolloutSettings:
    """How rollouts are sampled (configs/base/rollout.yaml) and by which engine (configs/rollout/*.yaml)."""

    engine: str
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    max_prompt_length: int
    decoding: str = "auto"  # the hf engine's
    vllm: VLLMSettings | None = None  # the vllm engine's

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> RolloutSettings:
        engine_keys = {field.name for field in dataclasses.fields(VLLMSettings)}
        own = {key: value for key, value in node.items() if key not in engine_keys}
        engine = {key: value for key, value in node.items() if key in engine_keys}
        vllm = _record(VLLMSettings, engine, "rollout") if engine or own.get("engine") == "vllm" else None
        return _record(cls, own, "rollout", vllm=vllm)


@dataclass(frozen=True)
class WarmupSettings:
    """A task's supervised warm-up of a random policy (`task.warmup`, models/warmup.py)."""

    steps: int = 600
    batch_size: int = 32
    lr: float = 3.0e-3
    seed: int = 0

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> WarmupSettings:
        return _record(cls, node, "task.warmup")
