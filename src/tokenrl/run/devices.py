"""Which GPU a one-process run sees: `trainer.devices=[k]` (k ≠ 0) narrows the process to that GPU before CUDA starts.
Why: vLLM 0.32's single-process executor puts its engine on visible GPU 0 (`device_config.device` has no index, so
`Worker.init_device` takes local rank 0) and makes it the current device, away from a trainer on GPU k. Several devices
(DDP/FSDP) are left alone: each rank's engine goes to its own device (rollout/vllm_engine.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

log = logging.getLogger(__name__)
VISIBLE = "CUDA_VISIBLE_DEVICES"
GPU_ACCELERATORS = ("gpu", "cuda", "auto")


def runs_on_gpu(cfg: DictConfig) -> bool:
    """Whether the trainer computes on a GPU: `trainer.accelerator` gpu or cuda, or auto with CUDA present."""
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    if accelerator == "auto":
        return torch.cuda.is_available()
    return accelerator in ("gpu", "cuda")


def device_indices(devices: Any) -> list[int] | None:
    """The GPU indices that `trainer.devices` names, Lightning's way (`device_parser._parse_gpu_ids`): a list, or a
    string with a comma ("3,"); None for a count (1, -1, "2", "auto")."""
    if isinstance(devices, (list, tuple, ListConfig)):
        return [int(index) for index in devices]
    if isinstance(devices, str) and "," in devices:
        return [int(part) for part in devices.split(",") if part.strip()]
    return None


def narrowed(environ: Mapping[str, str], accelerator: str, devices: Any) -> tuple[dict[str, str], Any]:
    """The environment and `trainer.devices` a run uses: a process on one GPU k ≠ 0 sees only that GPU (the k-th entry
    of an existing `CUDA_VISIBLE_DEVICES`) as device [0]; any other run (a count, several GPUs, GPU 0, CPU) as given."""
    indices = device_indices(devices)
    if str(accelerator) not in GPU_ACCELERATORS or indices is None or len(indices) != 1 or indices[0] == 0:
        return dict(environ), devices
    k = indices[0]
    visible = [entry.strip() for entry in environ[VISIBLE].split(",") if entry.strip()] if VISIBLE in environ else None
    if visible is not None and k >= len(visible):
        raise ValueError(
            f"trainer.devices=[{k}] asks for visible GPU {k}, and {VISIBLE}={environ[VISIBLE]} makes "
            f"{len(visible)} visible (a sweep slot of launcher=local gets hydra.launcher.gpus_per_job "
            f"of them); use trainer.devices=1 for the first visible GPU, or an index below {len(visible)}"
        )
    return {**environ, VISIBLE: visible[k] if visible is not None else str(k)}, [0]


def narrow_to_trainer_gpu(cfg: DictConfig) -> None:
    """Apply `narrowed` to this process and `cfg.trainer.devices`, logged; call it before anything initialises CUDA."""
    devices = cfg.trainer.get("devices")
    environ, new_devices = narrowed(os.environ, cfg.trainer.get("accelerator", "auto"), devices)
    if new_devices is devices:
        return
    before = os.environ.get(VISIBLE)
    os.environ[VISIBLE] = environ[VISIBLE]
    cfg.trainer.devices = new_devices
    shown = OmegaConf.to_container(devices) if isinstance(devices, ListConfig) else devices
    log.info(
        "trainer.devices=%s: this one-process run sees only that GPU (%s=%s%s) as trainer.devices=[0], so a vLLM "
        "engine, which takes device 0 of its process, shares the trainer's GPU",
        shown,
        VISIBLE,
        environ[VISIBLE],
        f", from {before}" if before is not None else "",
    )
