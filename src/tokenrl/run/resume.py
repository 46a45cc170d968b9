"""Resuming a run: which checkpoint (`ckpt_path=<file>` or `ckpt_path=auto`), the step it holds, and keeping the
resumed run in its original folder with one `metrics.csv`.

`python train.py <overrides> ckpt_path=<run>/checkpoints/last.ckpt` continues in `<run>/` (`config/command_line.py`
adds `hydra.run.dir=<run>` before Hydra starts): `train.log` is appended to, and `metrics.csv` keeps the rows of the
steps the checkpoint holds (rows of steps after it, which the resumed run redoes, are dropped). `ckpt_path=auto` resumes
from the run folder's own `last.ckpt` when there is one and starts fresh otherwise (a requeued SLURM job); when that
`last.ckpt` already holds `total_steps` (a finished job of a re-run sweep) it raises `RunComplete` and the run ends
without training. A checkpoint is a `.ckpt` file or, under `trainer=fsdp`, a sharded checkpoint's folder of the same
name (run/checkpointing.py). A checkpoint of another model (other shapes) is refused before anything loads
(`check_checkpoint_matches`).

A resume keeps to its run's settings: each checkpoint holds the config of the run that wrote it (`RUN_CONFIG`), and a
resume whose settings differ from it in any key outside `FREE_SETTINGS` is refused naming each key, unless
`resume.allow_changes=true` (`check_resume_settings`). Every resume appends its overrides, the step it starts at and the
keys it changed to `<run>/.hydra/resume_history.yaml` (`record_resume`); the run's record, `.hydra/config.yaml` and
`overrides.yaml`, stays as the run that made the folder wrote it (a resume in it writes no Hydra files:
`continues_run`, configs/hydra/default.yaml). `ckpt_path=auto` needs checkpoints (`checkpoint.enabled`), and skips a
job that finished (its `summary.json` there) whatever they are.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tokenrl.config.command_line import AUTO
from tokenrl.records.settings import ModelSettings
from tokenrl.run.checkpointing import SHARDED_META, checkpoint_mismatch, interrupted_swap, is_sharded_checkpoint

log = logging.getLogger(__name__)
RUN_CONFIG = "tokenrl_config"  # a checkpoint's entry holding its run's config (`RunConfigRecord`)
HISTORY = Path(".hydra") / "resume_history.yaml"  # in the run folder: one entry per resume (`record_resume`)
# The settings a resume may change freely: where files go and what is logged (paths, task_name, logger, the trainer's
# root folder, progress bar and logging interval), how long the run is (total_steps: extending a run is what a resume
# is for; the prompts of step k depend on the seed and k only), which checkpoints, samples and export it writes,
# held-out validation (its own seeds, between steps), extra statistics (diagnostics), what a sweeper reads
# (optimized_metric) and the resume itself (ckpt_path, resume). None changes a step's prompts, samples or update;
# every other key does, or may (the model, algorithm, selector, task, rollout, trainer precision and devices, seed,
# fast_path's kernels), so a resume that changes one is refused unless resume.allow_changes=true.
FREE_SETTINGS = (
    "paths",
    "task_name",
    "logger",
    "trainer.default_root_dir",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",
    "total_steps",
    "checkpoint",
    "samples",
    "export",
    "validation",
    "diagnostics",
    "optimized_metric",
    "ckpt_path",
    "resume",
)
UNSET = object()  # a key one of two configs lacks


class RunComplete(Exception):
    """`ckpt_path=auto` in a run whose own last.ckpt holds every step: nothing to train. The message says so and where
    the summary is; `summary` is the run's summary.json ({} when it stopped before writing it)."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.summary = summary


def checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """The checkpoint at `path` memory-mapped (the weights are not read), or of a sharded checkpoint its meta.pt,
    which holds no weights."""
    source = Path(path) / SHARDED_META if Path(path).is_dir() else path
    return torch.load(source, map_location="cpu", weights_only=True, mmap=True)


def checkpoint_step(path: str | Path) -> int:
    """The rollout steps done in the checkpoint at `path`."""
    try:
        return int(checkpoint_meta(path)["tokenrl"]["rollout_step"])
    except KeyError:
        raise ValueError(f"ckpt_path={path}: not a tokenrl checkpoint (it has no 'tokenrl' state)") from None


def resolve_checkpoint(
    ckpt_path: str | None, output_dir: str | Path, total_steps: int, checkpoints: bool = True
) -> tuple[str | None, int]:
    """The checkpoint to resume from and the rollout steps it holds ((None, 0): start fresh), checked: it exists, is a
    tokenrl checkpoint, and leaves steps to train (else `ckpt_path=auto` raises `RunComplete`, a path ValueError).
    `checkpoints`: whether this run writes them (`checkpoint.enabled`). `ckpt_path=auto` without them is refused (a
    requeued job would find nothing to resume from and start again from step 0 over its own folder), except in a
    finished job: its summary.json there and no own last.ckpt to extend (to a larger total_steps) raise `RunComplete`
    whatever the checkpoints."""
    if ckpt_path is None:
        return None, 0
    auto = str(ckpt_path) == AUTO
    if auto:
        own = Path(output_dir) / "checkpoints" / "last.ckpt"
        resumable = checkpoints and (own.exists() or interrupted_swap(own) is not None)
        summary_path = Path(output_dir) / "summary.json"
        if not resumable and summary_path.is_file():
            raise RunComplete(
                f"ckpt_path=auto: the run is already complete, nothing to train (its summary: {summary_path})",
                json.loads(summary_path.read_text()),
            )
        if not checkpoints:
            raise ValueError(
                "ckpt_path=auto with checkpoint.enabled=false: a requeued job would find no checkpoint to resume "
                "from and train again from step 0 over its own run folder; set checkpoint.enabled=true"
            )
        if not resumable:
            log.info("ckpt_path=auto: no %s yet, starting from step 0", own)
            return None, 0
        ckpt_path = str(own)
    path = Path(ckpt_path).expanduser()
    swapped = interrupted_swap(path)
    if swapped is not None:
        log.warning(
            "%s was being replaced when its run stopped: resuming from the new checkpoint, complete under its "
            "temporary name %s",
            path,
            swapped,
        )
        path = swapped
    elif path.is_dir() and not is_sharded_checkpoint(path):
        raise ValueError(
            f"ckpt_path={ckpt_path}: a folder without {SHARDED_META}, so not a complete sharded "
            "checkpoint (a save that was cut short?); resume from another checkpoint of the run"
        )
    elif not path.exists():
        raise FileNotFoundError(
            f"ckpt_path={ckpt_path}: no such file or folder (a run's checkpoints are in "
            "logs/train/runs/<time>/checkpoints/: last.ckpt, stepNNNN.ckpt)"
        )
    step = checkpoint_step(path)
    if step >= total_steps and auto:
        summary_path = Path(output_dir) / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        where = f"its summary: {summary_path}" if summary else f"it stopped before writing {summary_path}"
        raise RunComplete(
            f"ckpt_path=auto: the run is already complete, nothing to train ({path} holds {step} of "
            f"total_steps={total_steps} rollout steps; {where})",
            summary,
        )
    if step >= total_steps:  # an explicit checkpoint: the user's mistake
        raise ValueError(
            f"ckpt_path={ckpt_path} holds {step} rollout steps and total_steps={total_steps}: nothing is "
            f"left to train; set total_steps above {step} to continue training"
        )
    log.info("resuming from %s: %d of total_steps=%d rollout steps done", path, step, total_steps)
    return str(path), step


def continues_run(ckpt_path: str | None, output_dir: str | Path) -> bool:
    """Whether a run of `ckpt_path` in `output_dir` continues the run already there: `auto` where the folder holds its
    last.ckpt or summary.json, or a checkpoint in the folder's checkpoints/ (a resume `config/command_line.py` pointed
    at its run folder). Such a run leaves the folder's `.hydra/` record as the run that made it wrote it."""
    if ckpt_path is None:
        return False
    folder = Path(output_dir)
    if str(ckpt_path) == AUTO:
        own = folder / "checkpoints" / "last.ckpt"
        return own.exists() or interrupted_swap(own) is not None or (folder / "summary.json").is_file()
    return Path(ckpt_path).expanduser().resolve().parent == (folder / "checkpoints").resolve()


class RunConfigRecord(L.Callback):
    """Writes the run's config into each checkpoint (`RUN_CONFIG`), as composed: interpolations unresolved, so a
    resume on another machine (other paths, another model cache) compares the settings, not where files lie."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[RUN_CONFIG] = self.config


def changed_settings(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, str]:
    """The settings outside `FREE_SETTINGS` whose values differ between the configs `saved` and `current` (as composed),
    by dotted key in config order: "old → new". Both are resolved here, with this run's `paths`, so that where files
    lie (`model.source: ${paths.model_cache}/...`, `${oc.env:...}`) is no difference, nor a value that moved to
    another key and is interpolated there. A key one of them lacks is one (a `+` override, a preset's own keys)."""

    def leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
        if isinstance(node, Mapping) and node:
            return [leaf for name, child in node.items() for leaf in leaves(child, f"{prefix}{name}.")]
        return [(prefix.removesuffix("."), node)]

    def values(config: Mapping[str, Any]) -> dict[str, Any]:
        resolvable = OmegaConf.create(dict(config))
        found = {}
        for key, written in leaves(config):
            if any(key == free or key.startswith(f"{free}.") for free in FREE_SETTINGS):
                continue
            try:
                value = OmegaConf.select(resolvable, key, throw_on_resolution_failure=True)
                found[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            except OmegaConfBaseException:  # resolvable in a Hydra job only (${hydra:...}): compared as written
                found[key] = written
        return found

    def shown(value: Any) -> str:
        return "(not set)" if value is UNSET else value if isinstance(value, str) else json.dumps(value)

    old, new = values({**saved, "paths": current.get("paths")}), values(current)
    return {
        key: f"{shown(old.get(key, UNSET))} → {shown(new.get(key, UNSET))}"
        for key in dict.fromkeys([*new, *old])
        if old.get(key, UNSET) != new.get(key, UNSET)
    }


def check_resume_settings(
    path: str | Path, config: Mapping[str, Any], steps_done: int, output_dir: str | Path
) -> dict[str, str]:
    """The settings this resume (of the run `config`, from the checkpoint at `path`) changes against the checkpoint's
    run (`changed_settings`); any is a ValueError (one line naming each, old → new) unless `config` allows changes
    (`resume.allow_changes`). A checkpoint written before checkpoints held their config: nothing to compare, {}."""
    saved = checkpoint_meta(path).get(RUN_CONFIG)
    if saved is None:
        log.warning("%s does not record its run's settings (written by an older tokenrl): not compared", path)
        return {}
    changed = changed_settings(saved, config)
    if changed and not config.get("resume", {}).get("allow_changes", False):
        listed = ", ".join(f"{key}: {change}" for key, change in changed.items())
        raise ValueError(
            f"ckpt_path={config['ckpt_path']}: its run was trained with other settings ({listed}); resume with "
            f"those, or add resume.allow_changes=true to train on with these from step {steps_done + 1} (recorded "
            f"in {Path(output_dir) / HISTORY})"
        )
    return changed


def record_resume(
    output_dir: str | Path, path: str | Path, steps_done: int, overrides: list[str], changed: dict[str, str]
) -> None:
    """Append this resume to the run folder's history (`HISTORY`, a YAML list; rank 0 only): when, from which
    checkpoint, the first step it trains, its command line's overrides and the settings it changed."""
    if rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # Lightning sets it on its decorator at import
        return
    entry = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "ckpt_path": str(path),
        "from_step": steps_done + 1,
        "overrides": list(overrides),
        "changed": changed,
    }
    history = Path(output_dir) / HISTORY
    history.parent.mkdir(parents=True, exist_ok=True)
    with history.open("a") as handle:
        handle.write(yaml.safe_dump([entry], sort_keys=False, allow_unicode=True))


def checkpoint_shapes(path: str | Path) -> tuple[dict[str, list[int]], bool]:
    """The shapes of the `policy.*` weights of the checkpoint at `path` (a `.ckpt` file, memory-mapped, or a sharded
    folder's index: no weights are read), and whether it holds them all (False: a LoRA checkpoint's adapters)."""
    path = Path(path)
    if path.is_dir():
        from torch.distributed.checkpoint import FileSystemReader, TensorStorageMetadata

        index = FileSystemReader(path).read_metadata().state_dict_metadata
        shapes = {
            key.removeprefix("model."): list(item.size)
            for key, item in index.items()
            if key.startswith("model.policy.") and isinstance(item, TensorStorageMetadata)
        }
        meta = torch.load(path / SHARDED_META, map_location="cpu", weights_only=True)
    else:
        meta = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        shapes = {
            key: list(value.shape) for key, value in meta.get("state_dict", {}).items() if key.startswith("policy.")
        }
    return shapes, meta.get("tokenrl", {}).get("base") is None


def policy_shapes(settings: ModelSettings) -> dict[str, list[int]]:
    """The shapes of the `policy.*` weights a run of `model.*` checkpoints, from its architecture built on the meta
    device (no memory, no weights read)."""
    from tokenrl.models import meta_model

    return {f"policy.{key}": list(value.shape) for key, value in meta_model(settings).state_dict().items()}


def check_checkpoint_matches(path: str | Path, settings: ModelSettings) -> None:
    """Raise ValueError (one line naming `path`, how many weights differ and one of them) unless the checkpoint at
    `path` holds weights of the shapes the model of `settings` has."""
    saved, complete = checkpoint_shapes(path)
    mismatch = checkpoint_mismatch(
        path, saved, policy_shapes(settings), "resume with the model it was trained with", complete
    )
    if mismatch is not None:
        raise mismatch


def kept_metric_rows(metrics_csv: str | Path, steps_done: int) -> list[dict[str, Any]]:
    """The rows of an interrupted run's metrics.csv that a resume from step `steps_done` keeps: training rows of
    steps 1..steps_done (`train/rollout_step`) and validations before step `steps_done` (`val/at_step`)."""
    path = Path(metrics_csv)
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))

    def kept(row: dict[str, str]) -> bool:
        if row.get("train/rollout_step"):
            return float(row["train/rollout_step"]) <= steps_done
        if row.get("val/at_step"):
            return float(row["val/at_step"]) < steps_done
        return True

    return [{key: value for key, value in row.items() if value != ""} for row in rows if kept(row)]
