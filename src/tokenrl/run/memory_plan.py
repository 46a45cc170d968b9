"""The memory a run will need, per phase of a rollout step, before anything loads: printed at start-up and by the
doctor; a plan that exceeds the device stops the run with its table instead of failing in step one.

Worst case by construction: every response runs to `rollout.max_new_tokens` and every prompt is as long as the
longest training prompt (`prompt_tokens`; `rollout.max_prompt_length` when not given). In the shared-prefix and
packed layouts (fast_path.layout, no gradient checkpointing, no FSDP) the update encodes each group's prompt once. Per
component (bytes; P parameters, T trainable, L layers, h hidden, i intermediate, kv = key/value width, V vocabulary, b
the activations' bytes per element):
- weights P·dtype, gradients T·dtype, AdamW's two moments 2·T·dtype (ZeRO, arXiv 1910.02054, §3.1), the frozen
  reference P·reference_dtype when a KL term is on (LoRA: none, the policy with adapters off);
- the update's activations per micro-batch token and layer: (8h + 2kv + 5i)·b, what a SwiGLU decoder layer keeps for
  backward with fused (SDPA) attention (Korthikanti et al., arXiv 2205.05198, §4.1, re-counted for SwiGLU and GQA);
  with gradient checkpointing only the layer inputs, h·b, plus one layer's full set; plus 3 copies of the micro-batch's
  response logits in fp32 (logits, log-softmax, its gradient) — with `fast_path.fused_head` (not under FSDP) instead
  the fused head's few (tokens × vocabulary chunk) buffers (`fused_head_bytes`);
- the statistics pass: one chunk of `stats_chunk_size` tokens × V in fp32, 4 copies (logits, log-softmax, probabilities,
  their square) — fused: `fused_head_bytes` — and the micro-batch's last hidden states;
- generation: the hf engine's KV cache 2·L·kv·dtype per token of every row, and one step's logits rows·V·fp32; a
  vLLM engine its own weights (P·engine dtype) and KV cache (`kv_cache_gib` on CPU, `gpu_memory_utilization` of the
  GPU there);
- the process itself (`BASELINE_GIB`: torch, transformers, Lightning and their libraries, measured here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

GIB = 2**30
BASELINE_GIB = {"cpu": 0.55, "cuda": 0.6}  # an idle process with the stack imported (host RSS; GPU: CUDA context)
# (tokens × vocabulary chunk) fp32 buffers the fused head holds at its peak, forward and backward: 710 MiB measured at
# 4,096 tokens of vocabulary 151,936, less the head's gradient (519 MiB, counted as a gradient) ≈ 6 × 32 MiB
# (python scripts/bench/lm_head.py --device cpu --tokens 1024,4096: benchmarks/lm_head_cpu.json)
FUSED_HEAD_BUFFERS = 6
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}


@dataclass(frozen=True)
class Shape:
    """What the plan needs of the architecture."""

    parameters: int
    trainable: int
    layers: int
    hidden: int
    intermediate: int
    kv_width: int
    vocab: int


@dataclass
class MemoryPlan:
    """GiB per component of each phase; `device` and its `capacity_gib` (None: unknown)."""

    device: str
    capacity_gib: float | None
    phases: dict[str, dict[str, float]] = field(default_factory=dict)

    def peak(self) -> tuple[str, float]:
        """The phase with the largest total, and that total."""
        return max(((name, sum(parts.values())) for name, parts in self.phases.items()), key=lambda item: item[1])

    def fits(self) -> bool:
        return self.capacity_gib is None or self.peak()[1] <= self.capacity_gib

    def table(self) -> str:
        components = list(dict.fromkeys(key for parts in self.phases.values() for key in parts))
        head = f"{'GiB':<22}" + "".join(f"{name:>12}" for name in self.phases)
        rows = [
            f"{key:<22}" + "".join(f"{parts.get(key, 0.0):>12.2f}" for parts in self.phases.values())
            for key in components
        ]
        total = f"{'total':<22}" + "".join(f"{sum(parts.values()):>12.2f}" for parts in self.phases.values())
        name, peak = self.peak()
        capacity = f"{self.capacity_gib:.1f} GiB" if self.capacity_gib is not None else "unknown"
        return "\n".join([head, *rows, total, f"peak {peak:.2f} GiB in {name}; {self.device} has {capacity}"])

    def as_dict(self) -> dict[str, Any]:
        name, peak = self.peak()
        return {
            "device": self.device,
            "capacity_gib": self.capacity_gib,
            "peak_phase": name,
            "peak_gib": peak,
            "phases": self.phases,
        }


def architecture_shape(model_cfg: Mapping[str, Any]) -> Shape:
    """Parameter counts and sizes of the configured model, built on the meta device (no memory, no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tokenrl.models import _load_pretrained

    if model_cfg["init"] == "random":
        arch = dict(model_cfg["architecture"])
        config = AutoConfig.for_model(arch.pop("model_type"), **arch)
    else:
        config = _load_pretrained(model_cfg["source"], AutoConfig)  # offline: the same error as the model's load
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    parameters = sum(p.numel() for p in model.parameters())
    trainable = parameters
    if model_cfg.get("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **dict(model_cfg["lora"])))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return Shape(
        parameters,
        trainable,
        config.num_hidden_layers,
        config.hidden_size,
        config.intermediate_size,
        kv_heads * head_dim,
        config.vocab_size,
    )


def plan_memory(
    cfg: Mapping[str, Any],
    shape: Shape,
    device: str = "cpu",
    capacity_gib: float | None = None,
    prompt_tokens: int | None = None,
) -> MemoryPlan:
    """The plan of the composed train config `cfg` (a resolved container) for `shape` on `device`, with prompts of
    `prompt_tokens` tokens (default: rollout.max_prompt_length)."""
    from tokenrl.config.check import uses_fsdp
    from tokenrl.step.fast_path import FastPath  # the run's own rule for `fast_path.layout: auto`

    model, algorithm, rollout = cfg["model"], cfg["algorithm"], cfg["rollout"]
    weight_bytes = DTYPE_BYTES[model["dtype"]]
    mixed = "16" in str(cfg["trainer"].get("precision", ""))  # bf16-mixed, 16-mixed: activations in 16 bits
    act_bytes = 2 if mixed else weight_bytes
    rows = int(algorithm["prompts_per_step"]) * int(algorithm["group_size"])
    micro = min(int(algorithm["micro_batch_size"]), rows)
    prompt = int(prompt_tokens or rollout["max_prompt_length"])
    response = int(rollout["max_new_tokens"])
    optimizer_target = str(algorithm["optimizer"]["_target_"]).lower()
    moments = 2 if "adam" in optimizer_target else (1 if "momentum" in str(algorithm["optimizer"]) else 0)
    uses_reference = float(algorithm["kl_coef"]) > 0 and not model.get("lora")
    reference_bytes = DTYPE_BYTES[model.get("reference_dtype") or model["dtype"]]

    resident = {
        "policy weights": shape.parameters * weight_bytes / GIB,
        "optimizer state": moments * shape.trainable * weight_bytes / GIB,
        "reference": (shape.parameters * reference_bytes if uses_reference else 0) / GIB,
        "process": BASELINE_GIB["cuda" if device.startswith("cuda") else "cpu"],
    }
    asleep = {}  # what the engine holds while the trainer computes: nothing when it sleeps (GPU sleep mode)
    if rollout["engine"] == "vllm":
        engine_weights = shape.parameters * DTYPE_BYTES[str(rollout["dtype"])] / GIB
        on_gpu = device.startswith("cuda")
        kv = (
            float(rollout["gpu_memory_utilization"]) * capacity_gib - engine_weights
            if on_gpu and capacity_gib
            else float(rollout["kv_cache_gib"])
        )
        generation = {"engine weights + KV": engine_weights + max(kv, 0.0)}
        if not (on_gpu and int(rollout.get("sleep_level", 0)) > 0):
            asleep = dict(generation)
    else:
        kv_per_token = 2 * shape.layers * shape.kv_width * weight_bytes
        generation = {
            "KV cache": rows * (prompt + response) * kv_per_token / GIB,
            "logits": rows * shape.vocab * 4 / GIB,
        }

    fast_path = FastPath.from_node(cfg.get("fast_path"), on_gpu=device.startswith("cuda"))
    fsdp = uses_fsdp(cfg["trainer"])
    shared = (  # each group's prompt once: the shared-prefix and packed layouts, where the run takes them
        fast_path.layout != "padded" and not model.get("gradient_checkpointing") and not fsdp
    )
    group_size = int(algorithm["group_size"])
    budget = algorithm.get("micro_batch_tokens")
    if budget is None:
        groups = max(1, micro // group_size) if shared else micro
        tokens = stats_tokens = groups * prompt + micro * response
        head_tokens = stats_head_tokens = micro * response  # the head runs on response tokens only
    else:  # a token budget, at most the step's tokens: a unit larger runs alone (a row; a group in the statistics pass)
        step_tokens = rows // group_size * (prompt if shared else group_size * prompt) + rows * response
        tokens = max(min(int(budget), step_tokens), prompt + response)
        group = (prompt if shared else group_size * prompt) + group_size * response
        stats_tokens = max(min(int(budget), step_tokens), group)
        head_tokens, stats_head_tokens = tokens, stats_tokens
    per_layer = (8 * shape.hidden + 2 * shape.kv_width + 5 * shape.intermediate) * act_bytes
    if model.get("gradient_checkpointing"):
        activations = tokens * (shape.layers * shape.hidden * act_bytes + per_layer)
    else:
        activations = tokens * shape.layers * per_layer
    update = {
        "gradients": shape.trainable * weight_bytes / GIB,
        "activations": activations / GIB,
        "logits": (
            fused_head_bytes(head_tokens, shape.vocab)
            if fast_path.fused_head and not fsdp
            else 3 * head_tokens * shape.vocab * 4
        )
        / GIB,
    }
    chunk = min(int(model["stats_chunk_size"]), stats_head_tokens)
    statistics = {
        "logits": (
            fused_head_bytes(stats_head_tokens, shape.vocab) if fast_path.fused_head else 4 * chunk * shape.vocab * 4
        )
        / GIB,
        "hidden states": stats_tokens * shape.hidden * act_bytes / GIB,
    }
    plan = MemoryPlan(device, capacity_gib)
    plan.phases = {
        "generate": {**resident, **generation},
        "statistics": {**resident, **asleep, **statistics},
        "update": {**resident, **asleep, **update},
    }
    return plan


def fused_head_bytes(tokens: int, vocab: int) -> int:
    """The fused head's buffers for `tokens` tokens (models/lm_head.py): `FUSED_HEAD_BUFFERS` fp32 buffers of
    (tokens × `vocab_chunk` columns)."""
    from tokenrl.models.lm_head import vocab_chunk

    return FUSED_HEAD_BUFFERS * tokens * vocab_chunk(tokens, vocab) * 4


def device_capacity_gib(device: str) -> float | None:
    """Total memory of `device`: a GPU's, or the host's physical memory for `cpu`."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.device(device)).total_memory / GIB
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return None
