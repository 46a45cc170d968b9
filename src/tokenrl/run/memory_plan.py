"""The memory a run will need per phase of a rollout step, planned before anything loads (docs/running.md#memory-plan).
Worst case: every response runs to `rollout.max_new_tokens`, every prompt is the longest training prompt, and each pass
takes the largest micro-batch the run's own cut makes of such a step (`largest_micro_batch`; the shared-prefix and
packed layouts encode each group's prompt once). Bytes, with P parameters, T trainable, L layers, h hidden, i
intermediate, kv key/value width, V vocabulary, b the activations' bytes per element, r a micro-batch's response tokens:
- weights P·dtype, gradients T·dtype, AdamW's two moments 2·T·dtype (ZeRO, arXiv 1910.02054, §3.1), the frozen
  reference P·reference_dtype when a KL term is on (LoRA: none, the policy with adapters off);
- the update's activations per token and layer (8h + 2kv + 5i)·b, what a SwiGLU decoder layer keeps for backward with
  fused (SDPA) attention (Korthikanti et al., arXiv 2205.05198, §4.1, re-counted for SwiGLU and GQA); with gradient
  checkpointing the layer inputs h·b plus one layer's full set. The update's peak is the larger of the forward's end
  (activations; 3 fp32 copies of the r tokens' logits, or `fused_head_bytes`; with fused statistics 3 copies of one
  group's chunk of them; the earlier micro-batches' gradients) and the backward (activations, gradients, and the shares
  waiting to be added: with several micro-batches the embedding's dense gradient V·h·dtype, twice with a tied head, and
  in the shared-prefix layout, whose decoder runs twice, the trainable weights outside embedding and head once more;
  with one micro-batch a tied head's alone);
- the statistics pass: its micro-batch's last hidden states and 4 fp32 copies of one group's chunk of logits
  (`stats_chunk_size` tokens at most), or fused; the reference's log-probs: 3 fp32 copies of its micro-batch's response
  logits, or fused; the phase holds the larger;
- generation: the hf engine's KV cache 2·L·kv·dtype per token of every row and one step's logits rows·V·fp32; a vLLM
  engine its weights (P·engine dtype) and KV cache (`kv_cache_gib` on CPU, `gpu_memory_utilization` of a GPU);
- the process itself (`BASELINE_GIB`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tokenrl.records.settings import ModelSettings

if TYPE_CHECKING:  # imported where used: step/ loads transformers
    from tokenrl.step.micro_batches import MicroBatchCut, Row

GIB = 2**30
# the process itself (torch, transformers, Lightning, the trainer, tokenizer and data): on CPU its host RSS at the first
# step's start less the weights, under tcmalloc; taken as the same on a GPU
BASELINE_GIB = 0.6
# (tokens × vocabulary chunk) fp32 buffers the fused head holds at its peak, forward and backward, less the head's
# gradient (counted as a gradient), measured by scripts/bench/lm_head.py (benchmarks/lm_head_cpu.json)
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
    layer_trainable: int  # trainable parameters outside the embedding and the head
    tied: bool = True  # the head is the embedding's weight


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


def architecture_shape(settings: ModelSettings) -> Shape:
    """Parameter counts and sizes of the configured model, built on the meta device (no memory, no weights read)."""
    from tokenrl.models import meta_model

    model = meta_model(settings)
    config = model.config
    parameters = sum(p.numel() for name, p in model.named_parameters() if "lora_" not in name)  # the base's
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    outer = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
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
        sum(p.numel() for p in model.parameters() if p.requires_grad and id(p) not in outer),
        len(outer) == 1,
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
    from hydra.utils import get_method

    from tokenrl.config.check import uses_fsdp
    from tokenrl.step.fast_path import FastPath  # the run's own rule for `fast_path.layout: auto`
    from tokenrl.step.micro_batches import MicroBatchCut  # the run's own cut

    model, algorithm, rollout = cfg["model"], cfg["algorithm"], cfg["rollout"]
    weight_bytes = DTYPE_BYTES[model["dtype"]]
    act_bytes = 2 if "16" in str(cfg["trainer"].get("precision", "")) else weight_bytes  # bf16-mixed, 16-mixed
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
        "process": BASELINE_GIB,
    }
    asleep = {}  # what the engine holds while the trainer computes: nothing when it sleeps (GPU sleep mode)
    if rollout["engine"] == "vllm":
        engine_weights = shape.parameters * DTYPE_BYTES[str(rollout["dtype"])] / GIB
        on_gpu = device.startswith("cuda")
        kv = float(rollout["kv_cache_gib"])
        if on_gpu and capacity_gib:
            kv = float(rollout["gpu_memory_utilization"]) * capacity_gib - engine_weights
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
    no_grad_layout = "padded" if fsdp else fast_path.layout  # the statistics and reference passes
    # the update encodes each group's prompt once where the run takes it (`layout_blocker`)
    update_layout = "padded" if fsdp or model.get("gradient_checkpointing") else fast_path.layout
    group_size = int(algorithm["group_size"])
    budget = algorithm.get("micro_batch_tokens")
    step = [(group, prompt, response) for group in range(int(algorithm["prompts_per_step"])) for _ in range(group_size)]
    selector = get_method(cfg["selector"]["_target_"])
    reads_js = "js" in getattr(selector, "requires", ()) or bool((cfg.get("diagnostics") or {}).get("js"))
    update_cut = largest_micro_batch(MicroBatchCut(micro, budget, update_layout), step, whole_groups=reads_js)
    no_grad = MicroBatchCut(micro, budget, no_grad_layout)
    stats_cut = largest_micro_batch(no_grad, step, whole_groups=True)
    reference_cut = largest_micro_batch(no_grad, step, whole_groups=False)
    chunk = group_size * min(max(1, int(model["stats_chunk_size"]) // group_size), response)  # a group's chunk
    fused_update_head = fast_path.fused_head and not fsdp

    def head(tokens: int, copies: int, fused: bool) -> float:
        return (fused_head_bytes(tokens, shape.vocab) if fused else copies * tokens * shape.vocab * 4) / GIB

    per_layer = (8 * shape.hidden + 2 * shape.kv_width + 5 * shape.intermediate) * act_bytes
    if model.get("gradient_checkpointing"):
        activations = update_cut.tokens * (shape.layers * shape.hidden * act_bytes + per_layer)
    else:
        activations = update_cut.tokens * shape.layers * per_layer
    logits = head(update_cut.response_tokens, 3, fused_update_head)
    fused_statistics = fast_path.fused_statistics and int(algorithm["ppo_epochs"]) * int(algorithm["mini_batches"]) == 1
    if fused_statistics and not fused_update_head:  # π_old's statistics from the update's own logits
        logits += head(min(chunk, update_cut.response_tokens), 3, False)
    gradients = shape.trainable * weight_bytes / GIB
    embedding = shape.vocab * shape.hidden if shape.trainable > shape.layer_trainable else 0  # it trains
    if update_cut.several:  # shares wait beside the earlier micro-batches' gradients
        twice = shape.layer_trainable if update_layout == "shared_prefix" else 0  # the decoder's first shares
        buffers = embedding * (2 if shape.tied else 1) + twice
    else:  # the shares become the gradients; a tied head's waits for the embedding's
        buffers = embedding if shape.tied else 0
    forward = {
        "gradients": gradients if update_cut.several else 0.0,
        "activations": activations / GIB,
        "logits": logits,
    }
    backward = {
        "gradients": gradients,
        "activations": activations / GIB,
        "gradient buffers": buffers * weight_bytes / GIB,
    }
    statistics = {
        "logits": max(
            head(stats_cut.response_tokens if fast_path.fused_head else chunk, 4, fast_path.fused_head),
            head(reference_cut.response_tokens, 3, fast_path.fused_head) if float(algorithm["kl_coef"]) > 0 else 0,
        ),
        "hidden states": stats_cut.tokens * shape.hidden * act_bytes / GIB,
    }
    update = max(forward, backward, key=lambda parts: sum(parts.values()))  # the update's larger end
    phases = {
        "generate": {**resident, **generation},
        "statistics": {**resident, **asleep, **statistics},
        "update": {**resident, **asleep, **update},
    }
    return MemoryPlan(device, capacity_gib, phases)


@dataclass(frozen=True)
class MicroBatch:
    """A pass's largest micro-batch: its tokens as the forward runs them, its response tokens, whether it has peers."""

    tokens: int
    response_tokens: int
    several: bool


def largest_micro_batch(cut: MicroBatchCut, rows: list[Row], whole_groups: bool) -> MicroBatch:
    """The largest micro-batch the run's own `cut` makes of `rows`; `whole_groups`: JS, statistics."""
    from tokenrl.step.micro_batches import TokenCount

    units = [[rows[p] for p in part.tolist()] for part in cut.split(rows, whole_groups)]
    tokens, response = max((TokenCount(cut.layout).tokens(unit), sum(r for _, _, r in unit)) for unit in units)
    return MicroBatch(tokens, response, len(units) > 1)


def memory_refusal(plan: MemoryPlan, cfg: Mapping[str, Any]) -> str:
    """The error of a run whose `plan` does not fit: the need, the table, and what the composed config `cfg` (a
    resolved container) can still change — what it has on already is not offered."""
    model, algorithm = cfg["model"], cfg["algorithm"]
    budget = algorithm.get("micro_batch_tokens")
    rows = f"a smaller algorithm.micro_batch_size (now {algorithm['micro_batch_size']}) or algorithm.micro_batch_tokens"
    ways = [
        "a smaller model",
        rows if budget is None else f"a smaller algorithm.micro_batch_tokens (now {budget})",
        f"a smaller rollout.max_new_tokens (now {cfg['rollout']['max_new_tokens']})",
        *([] if model.get("lora") else ["LoRA (model.lora)"]),
        *([] if model.get("gradient_checkpointing") else ["model.gradient_checkpointing=true"]),
    ]
    return (
        f"this run needs about {plan.peak()[1]:.1f} GiB on {plan.device}, more than its {plan.capacity_gib:.1f} GiB:\n"
        f"{plan.table()}\nUse {', '.join(ways)} or a larger device"
    )


def fused_head_bytes(tokens: int, vocab: int) -> int:
    """The fused head's buffers (models/lm_head.py): `FUSED_HEAD_BUFFERS` fp32 (tokens × `vocab_chunk`) buffers."""
    from tokenrl.models.lm_head import vocab_chunk

    return FUSED_HEAD_BUFFERS * tokens * vocab_chunk(tokens, vocab) * 4


def device_capacity_gib(device: str) -> float:
    """Total memory of `device`: a GPU's, or the host's physical memory for `cpu`."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.device(device)).total_memory / GIB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
