"""The weights a rollout engine serves: the policy's full (unsharded) tensors under their plain HF names."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeGuard

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from tokenrl.models.sharding import hf_model, is_sharded

if TYPE_CHECKING:
    from peft.tuners.tuners_utils import BaseTunerLayer

WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
PEFT_PREFIX = "base_model.model."  # a PeftModel's keys = this + the base model's keys


@contextmanager
def served_weights(model: nn.Module) -> Iterator[Iterable[tuple[str, torch.Tensor]]]:
    """(name, tensor) of the weights vLLM should serve, every state-dict entry once under the base model's name, for
    the duration of the block, with PEFT adapters merged (one layer at a time) and the base weights restored from a
    copy afterwards, bit for bit (unmerging rounds: W + ΔW − ΔW ≠ W, and a base that moved by that each sync would
    drift). Unsharded: the model's own tensors, no copies but the merged layers. FSDP: a lazy stream gathered one unit
    at a time (the root's, then each decoder layer's), copied, since the gathered storage is freed when the next unit
    is gathered; every rank must consume the whole stream, in the same order (all-gathers)."""
    if is_sharded(model):
        yield _gathered_unit_by_unit(model)
    elif hasattr(model, "merge_adapter"):  # a PEFT model
        yield _merged_layer_by_layer(model)
    else:
        yield [(k, v.detach()) for k, v in model.state_dict().items()]


@contextmanager
def _merged(tuners: list[BaseTunerLayer]) -> Iterator[None]:
    """PEFT's adapters of `tuners` merged into their base layers for the block; afterwards the base layers' parameters
    are what they were, bit for bit (restored from copies, after PEFT's unmerge resets its state)."""
    bases = [dict(tuner.get_base_layer().named_parameters(recurse=False)) for tuner in tuners]
    saved = [{name: param.detach().clone() for name, param in base.items()} for base in bases]
    for tuner in tuners:
        tuner.merge()
    try:
        yield
    finally:
        for tuner, base, before in zip(tuners, bases, saved):
            tuner.unmerge()
            for name, param in base.items():
                param.data.copy_(before[name])


def _merged_layer_by_layer(peft_model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The unsharded half of `served_weights` for a PEFT model: its base model's state dict in order, adapter weights
    left out, each tuned layer's base parameters replaced by merged copies."""
    model = hf_model(peft_model)
    tuners = {name: module for name, module in model.named_modules() if _is_tuner_layer(module)}
    merged: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if "lora_" in key:
            continue
        owner = key.rpartition(".base_layer.")[0]
        if owner in tuners and key not in merged:
            base = tuners[owner].get_base_layer()
            with _merged([tuners[owner]]):
                merged.update(
                    {
                        f"{owner}.base_layer.{name}": param.detach().clone()
                        for name, param in base.named_parameters(recurse=False)
                    }
                )
        yield key.replace(".base_layer", ""), merged.pop(key, value.detach())


def _gathered_unit_by_unit(root: FullyShardedDataParallel) -> Iterator[tuple[str, torch.Tensor]]:
    """The FSDP half of `served_weights`: unit by unit, each gathered alone (`summon_full_params(unit, recurse=False,
    writeback=False)`, as TRL's `_sync_fsdp1_params_to_vllm`); PEFT adapters of the unit merged into the gathered
    weights (`_merged`: a unit that FSDP keeps whole, NO_SHARD or one rank, gathers to the model's own storage, where
    `writeback=False` does not protect it). The root first: gathering it initialises FSDP's root state."""
    peft = hasattr(root, "merge_adapter")
    units = [("", root)] + [
        (_plain_name(name) + ".", unit)
        for name, unit in root.named_modules()
        if isinstance(unit, FullyShardedDataParallel) and unit is not root
    ]
    for prefix, unit in units:
        with (
            FullyShardedDataParallel.summon_full_params(unit, recurse=False, writeback=False),
            _merged([module for module in _own_modules(unit.module) if _is_tuner_layer(module)]),
        ):
            copies = [(prefix + _plain_name(name), tensor.detach().clone()) for name, tensor in _own_state(unit.module)]
        for name, tensor in copies:
            served = _served_name(name, peft)
            if served is not None:
                yield served, tensor


def _own_modules(module: nn.Module) -> Iterator[nn.Module]:
    """`module` and its submodules, without the nested FSDP units (each gathered on its own)."""
    yield module
    for child in module.children():
        if not isinstance(child, FullyShardedDataParallel):
            yield from _own_modules(child)


def _own_state(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """State-dict entries (parameters, then persistent buffers, then children's) of `module` outside nested FSDP
    units, in state-dict order; a tied parameter under each of its names, as `state_dict()` gives it."""
    yield from (
        (prefix + name, param) for name, param in module.named_parameters(recurse=False, remove_duplicate=False)
    )
    yield from (
        (prefix + name, buffer)
        for name, buffer in module.named_buffers(recurse=False, remove_duplicate=False)
        if name not in module._non_persistent_buffers_set
    )
    for name, child in module.named_children():
        if not isinstance(child, FullyShardedDataParallel):
            yield from _own_state(child, f"{prefix}{name}.")


def _plain_name(name: str) -> str:
    for wrapper in WRAPPER_PREFIXES:
        name = name.replace(wrapper, "")
    return name


def _served_name(name: str, peft: bool) -> str | None:
    """The base model's name of a PEFT model's entry (None for adapter weights); other names unchanged."""
    if not peft:
        return name
    if "lora_" in name:
        return None
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer", "")


def _is_tuner_layer(module: nn.Module) -> TypeGuard[BaseTunerLayer]:
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return False
    return isinstance(module, BaseTunerLayer)
