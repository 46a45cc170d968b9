"""Checkpoints (docs/running.md#resume-and-preemption): atomic writes of a file or a sharded FSDP checkpoint's folder (a
temporary next to the target, fsync, a rename over it: an interrupted save never leaves a truncated checkpoint), the
run's checkpoint policy (`RunCheckpoint`), clean-up after a killed save, and the policy's weights of any checkpoint
(`policy_state_dict`, `load_policy`; a LoRA one holds its adapters and its base's reference: models/base_weights.py)."""

from __future__ import annotations

import ctypes
import errno
import glob
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.checkpoint.api import CheckpointException

from tokenrl.models.base_weights import base_reference, check_base, trained_names, with_base
from tokenrl.records.settings import ModelSettings

log = logging.getLogger(__name__)
TEMPORARY_GLOB = ".*.ckpt.*.tmp"  # what a save writes before its rename: `.<name>.<random>.tmp`, a file or a folder
# A sharded checkpoint is a folder (Lightning's FSDPStrategy layout): torch.distributed.checkpoint's files (`.metadata`,
# one `__<rank>_0.distcp` per rank: its shards of "model" and "optimizer_<i>") and SHARDED_META, the rest, written last.
SHARDED_META = "meta.pt"
RENAME_EXCHANGE, AT_FDCWD = 2, -100  # linux/fs.h, linux/fcntl.h


def checkpoint_mismatch(
    path: str | Path,
    saved: Mapping[str, Sequence[int]],
    built: Mapping[str, Sequence[int]],
    fix: str,
    complete: bool = True,
) -> ValueError | None:
    """The error of a checkpoint whose weights' shapes (`saved`, by name) are not the built model's (`built`), or None.
    `complete`: it holds every weight (not a LoRA checkpoint's adapters alone); `fix` ends the message."""
    names = sorted(set(saved) | (set(built) if complete else set()))
    differ = [
        name for name in names if name not in saved or name not in built or list(saved[name]) != list(built[name])
    ]
    if not differ:
        return None
    first = differ[0]
    there, here = (str(list(shapes[first])) if first in shapes else "absent" for shapes in (saved, built))
    return ValueError(
        f"ckpt_path={path}: a checkpoint of another model ({len(differ)} of {len(names)} weights differ "
        f"in shape, e.g. `{first}` {there} in the checkpoint vs {here} here): {fix}"
    )


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the message names the file, the cause and what survives."""


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a complete sharded checkpoint (a folder whose meta.pt, written last, is there)."""
    return Path(path).is_dir() and (Path(path) / SHARDED_META).is_file()


def checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """The checkpoint at `path` memory-mapped (the weights are not read), or of a sharded checkpoint its meta.pt."""
    source = Path(path) / SHARDED_META if Path(path).is_dir() else path
    return torch.load(source, map_location="cpu", weights_only=True, mmap=True)


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested checkpoint dict, about what `torch.save` writes (ShardedTensor: its shards)."""
    if hasattr(obj, "local_shards"):
        return sum(_tensor_bytes(shard.tensor) for shard in obj.local_shards())
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(value) for value in obj)
    return 0


def _out_of_space(err: BaseException | None) -> bool:
    """Whether `err` or an exception it chains from is "No space left on device" (torch wraps the OSError)."""
    while err is not None:
        if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _write_error(err: BaseException, target: Path, needed_bytes: int, per_rank: bool = False) -> CheckpointWriteError:
    """A failed save's error: its cause, what survives and, on a full disk, the space it needs and the space left."""
    kept = f"the previous {target.name} is intact" if target.exists() else f"no {target.name} was written before"
    if _out_of_space(err):
        free = shutil.disk_usage(target.parent).free
        return CheckpointWriteError(
            errno.ENOSPC,
            f"no space left on device writing checkpoint {target}: it needs about "
            f"{needed_bytes / 2**30:.2f} GiB{' per rank' if per_rank else ''} and its file system has "
            f"{free / 2**30:.2f} GiB free (after removing the partial write); {kept}. Free space, or point "
            f"paths.log_dir at a larger disk and resume with ckpt_path=",
        )
    cause = (
        "; ".join(f"rank {rank}: {type(exc).__name__}: {exc}" for rank, (exc, _) in err.failures.items())
        if isinstance(err, CheckpointException)
        else err
    )
    return CheckpointWriteError(
        getattr(err, "errno", None) or errno.EIO, f"could not write checkpoint {target}: {cause}; {kept}"
    )


def _save_atomically(obj: Any, target: Path) -> None:
    """`torch.save` into a temporary file next to `target`, fsync, rename over it (removed on failure)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)  # after a failure


def _remove(path: Path) -> None:
    """Remove a checkpoint file or folder; a folder's meta.pt first, so a removal cut short never looks complete."""
    if path.is_dir() and not path.is_symlink():
        (path / SHARDED_META).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _save_atomically(checkpoint, target)
        except (OSError, RuntimeError) as err:
            raise _write_error(err, target, _tensor_bytes(checkpoint)) from err

    def load_checkpoint(self, path: str | Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if is_sharded_checkpoint(path):  # only FSDPStrategy reads these, without a CheckpointIO
            raise ValueError(
                f"ckpt_path={path} is a sharded checkpoint (trainer=fsdp's folder of shards): resume it "
                "with trainer=fsdp, or evaluate its policy with tokenrl-eval ckpt_path=<it>"
            )
        return super().load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path: str | Path) -> None:
        """A superseded checkpoint (file or sharded folder), removed so that it never looks complete half-removed."""
        _remove(Path(path))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux `renameat2`); False where the file system cannot (NFS, most cluster ones)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _swap_in(staging: Path, target: Path) -> None:
    """Put the complete checkpoint folder `staging` at `target`: exchanged in one step where the file system can, else
    the old one removed (meta.pt first) and the new one renamed in. A kill at any point leaves `target` complete, or
    the new checkpoint complete under its temporary name, which resume takes (`interrupted_swap`)."""
    if os.path.lexists(target) and _exchange(staging, target):
        _remove(staging)  # the previous checkpoint, now under the temporary name
        return
    if os.path.lexists(target):
        _remove(target)
    os.rename(staging, target)


def _link_atomically(source: Path, target: Path) -> None:
    """Give the checkpoint `source` (a file, or a sharded folder file by file) the second name `target` in one step by
    hard links (a copy without them). Saves replace a name, never write into its file, so each name keeps its state."""
    staging = target.parent / f".{target.name}.{os.urandom(4).hex()}.tmp"
    if source.is_dir():
        staging.mkdir()
    try:
        parts = sorted(source.iterdir(), key=lambda part: part.name == SHARDED_META) if source.is_dir() else [source]
        for part in parts:  # a folder's meta.pt last: never complete before its shards
            name = staging / part.name if source.is_dir() else staging
            try:
                os.link(part, name)
            except OSError:  # a file system without hard links (some FUSE mounts)
                shutil.copyfile(part, name)
        if source.is_dir():
            _swap_in(staging, target)
        else:
            os.replace(staging, target)  # a no-op, leaving `staging`, where `target` is already this file
    finally:
        _remove(staging)  # if left (a failure, or `target` already this file)


def interrupted_swap(target: str | Path) -> Path | None:
    """The complete checkpoint that a sharded save killed while it replaced `target` left under its temporary name
    (`target` then absent or without meta.pt), or None."""
    target = Path(target)
    if target.is_file() or is_sharded_checkpoint(target):
        return None
    temporaries = target.parent.glob(f".{glob.escape(target.name)}.*.tmp")
    complete = [path for path in temporaries if is_sharded_checkpoint(path)]
    return max(complete, key=lambda path: (path / SHARDED_META).stat().st_mtime, default=None)


class AtomicFSDPStrategy(FSDPStrategy):
    """Lightning's FSDPStrategy writing a sharded checkpoint (`state_dict_type: sharded`) whole or not at all: each
    rank's shard (torch.distributed.checkpoint), then rank 0's meta.pt, into a temporary folder next to the target that
    replaces it once complete (`_swap_in`; Lightning's own writes into the target). Ranks must share the file system."""

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any = None) -> None:
        if self._state_dict_type != "sharded":
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        from torch.distributed.checkpoint import save

        target = Path(self.broadcast(str(filepath)))
        folder = ""  # rank 0 makes it, every rank receives it
        if self.is_global_zero:
            target.parent.mkdir(parents=True, exist_ok=True)
            folder = tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        staging = Path(self.broadcast(folder))
        state = {
            "model": checkpoint.pop("state_dict"),
            **{f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))},
        }
        try:
            save(state, checkpoint_id=staging)  # returns once every rank's shard and `.metadata` are on disk
            if self.is_global_zero:
                _save_atomically(checkpoint, staging / SHARDED_META)
                _swap_in(staging, target)
        except (OSError, RuntimeError, CheckpointException) as err:
            if self.is_global_zero:
                _remove(staging)
            raise _write_error(err, target, _tensor_bytes(state), per_rank=True) from err


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete and return the temporaries that a save killed mid-write left in `folder` (one run's checkpoints folder),
    except a complete one that resume takes (`interrupted_swap`)."""
    folder = Path(folder)
    found = sorted(folder.glob(TEMPORARY_GLOB)) if folder.is_dir() else []
    stale = [path for path in found if path != interrupted_swap(folder / path.name[1:].rsplit(".", 2)[0])]
    for path in stale:
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
        log.warning(
            "removing %s (%.2f GiB): what a checkpoint save that was interrupted had written", path, size / 2**30
        )
        _remove(path)
    return stale


def policy_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The policy's weights (`policy.*` keys, unprefixed) of a tokenrl `.ckpt` file or sharded folder, in host memory; a
    folder read as torch's `dcp_to_torch_save` does (torch/distributed/checkpoint/format_utils.py), its "model" only."""
    path = Path(path)
    if is_sharded_checkpoint(path):
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        loaded: dict[str, Any] = {}
        planner = _EmptyStateDictLoadPlanner(keys={"model"})
        _load_state_dict(loaded, storage_reader=FileSystemReader(path), planner=planner, no_dist=True)
        state = loaded["model"]
    elif path.is_file():
        state = checkpoint_meta(path).get("state_dict", {})
    else:
        raise FileNotFoundError(
            f"no checkpoint at {path}: a tokenrl checkpoint is a .ckpt file or a sharded "
            f"checkpoint's folder holding {SHARDED_META} (logs/train/runs/<time>/checkpoints/)"
        )
    policy = {key.removeprefix("policy."): value for key, value in state.items() if key.startswith("policy.")}
    if not policy:
        raise ValueError(f"{path} holds no `policy.*` weights: is it a tokenrl training checkpoint?")
    return policy


def load_policy(model: torch.nn.Module, path: str | Path, settings: ModelSettings, seed: int) -> None:
    """Load the policy of the tokenrl checkpoint at `path` into `model`, built from the run's `model.*` and `seed`; a
    LoRA checkpoint's adapters go onto `model`'s base, which must be theirs; other models' weights are a ValueError."""
    weights = policy_state_dict(path)  # first: it names a missing checkpoint
    base = checkpoint_meta(path).get("tokenrl", {}).get("base")  # None: a checkpoint with all its weights
    state = with_base(model, weights, base, base_reference(model, settings, seed), path)
    saved = {key: value.shape for key, value in state.items()}
    built = {key: value.shape for key, value in model.state_dict().items()}
    mismatch = checkpoint_mismatch(
        path, saved, built, "evaluate it with the model it was trained with (its run's model.*)"
    )
    if mismatch is not None:
        raise mismatch
    model.load_state_dict(state)


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint writing `stepNNNN.ckpt` every `every_n_steps` optimizer steps, keeping the newest
    `keep_last_k` (None: all) and the best by `monitor` (None: none), and `last.ckpt` once per state, in place: a hard
    link of the step file just written, else its own file (after a final step off the period, or `save_last_now`)."""

    def __init__(
        self, dirpath: str | Path, every_n_steps: int, monitor: str | None, mode: str, keep_last_k: int | None
    ) -> None:
        super().__init__(
            dirpath=dirpath,
            filename="step{step:04d}",
            auto_insert_metric_name=False,
            save_last=True,
            save_top_k=-1,
            monitor=monitor,
            mode=mode,
            every_n_train_steps=every_n_steps,
            enable_version_counter=False,
        )
        self.keep_last_k = keep_last_k

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_global_step_saved != trainer.global_step:  # the final state is not on disk yet
            self.save_last_now(trainer)

    def save_last_now(self, trainer: L.Trainer) -> Path:
        """Write the current state to last.ckpt now; returns its path."""
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        return Path(self.last_model_path)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        """last.ckpt: the step file written at this step under a second name, or (no such file) its own file."""
        last = self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST)
        newest = self._last_checkpoint_saved
        if self._last_global_step_saved != trainer.global_step or newest in ("", last):
            return super()._save_last_checkpoint(trainer, monitor_candidates)
        self.last_model_path = last
        if trainer.is_global_zero:
            _link_atomically(Path(newest), Path(last))
        trainer.strategy.barrier()

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        """A step file, then those beyond the newest `keep_last_k` removed (but the best and the one resumed from)."""
        super()._save_topk_checkpoint(trainer, monitor_candidates)
        if self.keep_last_k is None or self.dirpath is None or not trainer.is_global_zero:
            return
        numbered = sorted(
            (int(match[1]), str(path))
            for path in Path(self.dirpath).iterdir()
            if (match := re.fullmatch(r"step(\d+)\.ckpt", path.name))
        )
        kept = (self.best_model_path, self._last_checkpoint_saved)
        for _, path in numbered[: -self.keep_last_k]:
            if path not in kept and self._should_remove_checkpoint(trainer, path, self._last_checkpoint_saved):
                self._remove_checkpoint(trainer, path)
                self.best_k_models.pop(path, None)


@dataclass
class AdapterCheckpoints:
    """With LoRA, what a `GRPOModule`'s checkpoints hold on every strategy: only what trains (the adapters) and the
    frozen base's reference (models/base_weights.py); loading fills the base back from the module's own once it is
    checked to be the one the adapters were trained on. Without LoRA every method leaves the state alone."""

    base: dict[str, Any] | None = None  # the frozen base's reference; None: not a LoRA run
    trained: frozenset[str] = frozenset()  # the state-dict keys that train, the only ones checkpoints hold

    def remember_base(self, policy: torch.nn.Module, settings: ModelSettings, seed: int) -> None:
        """Record a LoRA `policy`'s base and its adapters' names (before any sharding); nothing without LoRA."""
        if not settings.lora:
            return
        self.base = base_reference(policy, settings, seed)
        self.trained = frozenset(f"policy.{name}" for name in trained_names(policy))

    def saved_state(self, state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        """The module's `state` without the frozen base's entries (`prefix`: the state dict's key prefix)."""
        if self.base is None:
            return state
        frozen = [key for key in state if key.startswith(f"{prefix}policy.") and key[len(prefix) :] not in self.trained]
        for key in frozen:
            del state[key]
        return state

    def loaded_state(self, state_dict: Mapping[str, Any], own: Mapping[str, Any]) -> Mapping[str, Any]:
        """A checkpoint's `state_dict` completed with the frozen entries it leaves out, from the module's `own`."""
        return state_dict if self.base is None else {**own, **state_dict}

    def save(self, checkpoint: dict[str, Any]) -> None:
        """Record the base's reference in the checkpoint's `tokenrl` entry."""
        if self.base is not None:
            checkpoint["tokenrl"]["base"] = self.base

    def check(self, checkpoint: dict[str, Any], ckpt_path: str | Path | None) -> None:
        """A LoRA checkpoint is refused (ValueError naming it) unless this run's base is the one it was trained on."""
        saved = checkpoint["tokenrl"].get("base")
        if saved is not None:  # a LoRA checkpoint (the path is for the message; restored outside a fit, none)
            check_base(saved, self.base, ckpt_path or "the checkpoint")
