"""FSDP for the policy and the reference model: one unit per decoder layer and a root unit around the causal LM.

`GRPOModule` generates, scores and runs several forwards and backwards inside one `training_step`, which a root around
the LightningModule (what Lightning's `FSDPStrategy` builds) cannot serve: the root's parameters (embeddings, final
norm, head) are full only inside its forward, and its backward hooks expect one backward per forward. So
`GRPOModule.configure_model` wraps the causal LM itself (`shard`): passes with gradients go through the root's own
forward, passes without run inside `gathered_root` (as TRL does around `generate`). Wrapping the model object keeps the
plain model's state-dict keys, and `generate` keeps the ranks' decoding steps in lockstep (`synced_gpus`)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def is_sharded(model: nn.Module) -> TypeGuard[FullyShardedDataParallel]:
    return isinstance(model, FullyShardedDataParallel)


def hf_model(model: nn.Module) -> PreTrainedModel:
    """The Hugging Face model `model` is, or the one its PEFT wrapper holds. Typed as one, though a FSDP root (or a
    test's stand-in) is returned as it is: FSDP forwards every attribute to the model it wraps."""
    return cast("PreTrainedModel", getattr(model, "get_base_model", lambda: model)())


def decoder_layer_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The classes of `model`'s decoder layers: those its Hugging Face class names in `_no_split_modules` (the blocks
    that must stay whole on one device), found among its modules (PEFT-wrapped or not)."""
    base = hf_model(model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    classes = {type(module) for module in model.modules() if type(module).__name__ in names}
    if not classes:
        raise ValueError(
            f"{type(base).__name__} names no decoder layer class in `_no_split_modules` "
            f"({sorted(names)}): cannot wrap it per layer for FSDP"
        )
    return classes


def mixed_precision(
    param_dtype: str | None = "bf16", reduce_dtype: str | None = "fp32", buffer_dtype: str | None = "fp32"
) -> MixedPrecision:
    """FSDP's mixed precision from dtype names (fp32 | bf16 | fp16 | None: the model's own), for
    configs/trainer/fsdp.yaml: verl's choice is bf16 all-gathers, fp32 gradient reduction, fp32 buffers. Every unit
    casts its floating inputs to `param_dtype` (`cast_forward_inputs`): the passes inside `gathered_root` enter the
    decoder layers from the root's full-precision embeddings, and the hf engine's `generate` runs there without autocast
    (FSDP casts only the root's inputs by default, so a bf16 layer met fp32 hidden states)."""
    from tokenrl.models import torch_dtype

    def dtype(name: str | None) -> torch.dtype | None:
        return None if name is None else torch_dtype(name)

    return MixedPrecision(
        param_dtype=dtype(param_dtype),
        reduce_dtype=dtype(reduce_dtype),
        buffer_dtype=dtype(buffer_dtype),
        cast_forward_inputs=param_dtype is not None,
    )


def shard(model: nn.Module, strategy: Any) -> FullyShardedDataParallel:
    """`model` as an FSDP root with one unit per decoder layer, with the Lightning FSDP strategy's settings (sharding
    strategy, mixed precision, CPU offload, `use_orig_params`, device mesh, …) on its device. The strategy's own
    `auto_wrap_policy`, if any, is replaced by the per-layer one (Lightning ignores it for a wrapped model anyway)."""
    kwargs = {key: value for key, value in strategy.kwargs.items() if key != "auto_wrap_policy"}
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy(decoder_layer_classes(model)),
        sharding_strategy=strategy.sharding_strategy,
        mixed_precision=strategy.mixed_precision_config,
        cpu_offload=strategy.cpu_offload,
        device_id=strategy.root_device,
        **kwargs,
    )


def shard_under(strategy: Any, models: list[nn.Module]) -> list[nn.Module]:
    """`models` each sharded (`shard`) under Lightning's FSDP strategy; as they are under any other strategy or none."""
    from lightning.pytorch.strategies import FSDPStrategy

    return [shard(model, strategy) for model in models] if isinstance(strategy, FSDPStrategy) else models


def gathered_root(model: nn.Module) -> AbstractContextManager:
    """For a pass without gradients outside the root's forward: the root unit's full parameters for the block (not
    written back), or nothing to do for an unsharded model. Every rank must enter it (an all-gather)."""
    if not is_sharded(model):
        return nullcontext()
    return FullyShardedDataParallel.summon_full_params(model, recurse=False, writeback=False)
