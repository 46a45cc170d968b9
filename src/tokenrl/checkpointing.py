"""Checkpoints: atomic writes (a temporary file in the same folder, fsync, then a rename over the target), the run's
checkpoint policy (periodic + best + exactly one `last.ckpt` holding the final state), and clean-up of the temporaries a
killed save leaves (the RNG states a checkpoint carries: utils.rng_state).

An interrupted save never leaves a truncated `last.ckpt`; the previous one stays valid until replaced.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

log = logging.getLogger(__name__)
TEMPORARY_GLOB = ".*.ckpt.*.tmp"   # what AtomicCheckpointIO writes before its rename


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the message names the file, the cause and what survives."""


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors inside a (nested) checkpoint dict: about what `torch.save` writes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(value) for value in obj)
    return 0


def _out_of_space(err: BaseException) -> bool:
    """Whether `err` or an exception it chains from is "No space left on device" (torch wraps the OSError)."""
    while err is not None:
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except (OSError, RuntimeError) as err:
            kept = f"the previous {target.name} is intact" if target.exists() else f"no {target.name} was written before"
            if _out_of_space(err):
                free = shutil.disk_usage(target.parent).free
                raise CheckpointWriteError(
                    errno.ENOSPC, f"no space left on device writing checkpoint {target}: it needs about "
                    f"{_tensor_bytes(checkpoint) / 2**30:.2f} GiB and its file system has {free / 2**30:.2f} GiB free "
                    f"(after removing the partial file); {kept}. Free space, or point paths.log_dir at a larger disk "
                    f"and resume with ckpt_path=") from err
            raise CheckpointWriteError(getattr(err, "errno", None) or errno.EIO,
                                       f"could not write checkpoint {target}: {err}; {kept}") from err
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files that a save killed mid-write (`kill -9`, a node failure) left in `folder` (one run's
    checkpoints folder only); returns them."""
    stale = sorted(Path(folder).glob(TEMPORARY_GLOB)) if Path(folder).is_dir() else []
    for path in stale:
        log.warning("removing %s (%.2f GiB): the partial file of a checkpoint save that was interrupted", path,
                    path.stat().st_size / 2**30)
        path.unlink()
    return stale


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint (periodic `stepNNNN.ckpt` best by `monitor`, and `last.ckpt`) writing `last.ckpt`
    exactly once per state: also after the final step when that step was not a periodic one, and on demand
    (`save_last_now`, a preemption). Never `last-v1.ckpt`: the run's `last.ckpt` is overwritten in place."""

    def __init__(self, dirpath: str | Path, every_n_steps: int, monitor: str, mode: str) -> None:
        super().__init__(dirpath=dirpath, filename="step{step:04d}", auto_insert_metric_name=False, save_last=True,
                         save_top_k=1, monitor=monitor, mode=mode, every_n_train_steps=every_n_steps,
                         enable_version_counter=False)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_global_step_saved != trainer.global_step:   # the final state is not on disk yet
            self.save_last_now(trainer)

    def save_last_now(self, trainer: L.Trainer) -> Path:
        """Write the current state to last.ckpt now; returns its path."""
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        return Path(self.last_model_path)
