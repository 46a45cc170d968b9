"""A LoRA run checkpoints only what trains (the adapters; GRPOModule.state_dict) and a reference to the frozen base
weights it was built on (`base_reference`: where they came from and a fingerprint of their values). Resume, export
and eval rebuild the base from `model.*` and refuse one whose fingerprint differs (`check_base`), then put the
checkpoint's adapters on it (`with_base`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tokenrl.models.engine_weights import PEFT_PREFIX
from tokenrl.records.settings import ModelSettings

SAMPLES = 1024  # values of each base tensor the fingerprint reads, evenly spaced over it
DESCRIBED = {"source": "model.source", "init": "model.init", "dtype": "model.dtype", "seed": "seed"}  # key: option


def trained_names(model: nn.Module) -> set[str]:
    """The state-dict names of `model`'s parameters that train (of a PEFT model: the adapters)."""
    return {name for name, param in model.named_parameters() if param.requires_grad}


def fingerprint(model: nn.Module) -> str:
    """sha256 of `model`'s frozen weights (every state-dict entry that does not train): of each, its base model name
    (PEFT's prefix and `.base_layer` left out, so any LoRA setting gives the same), dtype, shape and SAMPLES evenly
    spaced values, bit for bit. Reads about a thousandth of a 1.5B model; any retrained or re-quantised base differs."""
    trained = trained_names(model)
    digest = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        if key in trained:
            continue
        flat = tensor.detach().reshape(-1)
        picks = torch.linspace(0, flat.numel() - 1, min(flat.numel(), SAMPLES), dtype=torch.float64).round().long()
        name = key.removeprefix(PEFT_PREFIX).replace(".base_layer", "")
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat[picks].cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def base_reference(model: nn.Module, settings: ModelSettings, seed: int) -> dict[str, Any] | None:
    """What a LoRA checkpoint records of the base it was built on: `model.source`, `init`, `dtype`, the seed of random
    weights, and the fingerprint of the weights themselves; None without LoRA."""
    if not settings.lora:
        return None
    return {
        "source": settings.source,
        "init": settings.init,
        "dtype": settings.dtype,
        "seed": seed if settings.init == "random" else None,
        "fingerprint": fingerprint(model),
    }


def check_base(saved: Mapping[str, Any] | None, current: Mapping[str, Any] | None, ckpt_path: str | Path) -> None:
    """Raise a ValueError naming `ckpt_path` when it holds a LoRA adapter (`saved`: its base reference; None: a
    checkpoint with all its weights) that this run (`current`: its base reference, None without LoRA) cannot use."""
    if saved is None:
        return
    if current is None:
        raise ValueError(
            f"ckpt_path={ckpt_path} holds a LoRA adapter without its base weights, and this run has no "
            "LoRA (model.lora=null): use the model.lora of the run that wrote it"
        )
    if saved["fingerprint"] == current["fingerprint"]:
        return
    changed = [
        f"{option} {saved.get(key)!r} there, {current.get(key)!r} here"
        for key, option in DESCRIBED.items()
        if saved.get(key) != current.get(key)
    ]
    wanted = ", ".join(f"{option}={saved[key]}" for key, option in DESCRIBED.items() if saved.get(key) is not None)
    raise ValueError(
        f"ckpt_path={ckpt_path} holds a LoRA adapter trained on other base weights than this run's "
        f"({'; '.join(changed) or 'the same settings, but the weights at model.source changed'}; base fingerprint "
        f"{saved['fingerprint'][:12]} there, {current['fingerprint'][:12]} here): an adapter fits only the base it "
        f"was trained on; use that base ({wanted})"
    )


def with_base(
    model: nn.Module,
    weights: Mapping[str, torch.Tensor],
    saved: Mapping[str, Any] | None,
    current: Mapping[str, Any] | None,
    ckpt_path: str | Path,
) -> Mapping[str, torch.Tensor]:
    """A checkpoint's policy `weights` to load into `model` (whose base reference is `current`): as they are when they
    are all the weights (`saved` None), else the LoRA adapters completed with `model`'s own frozen base entries, once
    `check_base` found that base to be the one they were trained on."""
    check_base(saved, current, ckpt_path)
    return weights if saved is None else {**model.state_dict(), **weights}
