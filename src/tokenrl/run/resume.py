"""Resuming a run (docs/running.md#resume-and-preemption): which checkpoint (`ckpt_path=<file>` or `ckpt_path=auto`)
and the steps it holds, a checkpoint of another model or of other settings refused before anything loads, and the
resumed run kept in its own folder: one `metrics.csv`, its run record untouched, each resume in `HISTORY`."""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tokenrl.config.command_line import AUTO
from tokenrl.records.settings import ModelSettings
from tokenrl.run.checkpointing import (
    SHARDED_META,
    checkpoint_meta,
    checkpoint_mismatch,
    interrupted_swap,
    is_sharded_checkpoint,
)

log = logging.getLogger(__name__)
RUN_CONFIG = "tokenrl_config"  # a checkpoint's entry holding its run's config (`RunConfigRecord`)
HISTORY = Path(".hydra") / "resume_history.yaml"  # in the run folder: one entry per resume (`record_resume`)
# The settings a resume may change freely: none changes a step's prompts, samples or update (the prompts of step k
# depend on the seed and k only, so total_steps may grow; validation draws its own seeds). Every other key does, or
# may, so a resume that changes one is refused unless resume.allow_changes=true.
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
    `checkpoints` (`checkpoint.enabled`): without them `ckpt_path=auto` is refused (a requeued job would train again
    from step 0 over its own folder), except in a finished job (its summary.json, no own last.ckpt): `RunComplete`."""
    if ckpt_path is None:
        return None, 0
    auto = str(ckpt_path) == AUTO
    own, summary_path = Path(output_dir) / "checkpoints" / "last.ckpt", Path(output_dir) / "summary.json"
    if auto:
        resumable = checkpoints and (own.exists() or interrupted_swap(own) is not None)
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
    """Whether a run of `ckpt_path` in `output_dir` continues the run there (and leaves its `.hydra/` record as it is):
    `auto` with the folder's last.ckpt or summary.json there, or a checkpoint of the folder's checkpoints/."""
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
    """The settings outside `FREE_SETTINGS` whose values differ between the composed configs `saved` and `current`, by
    dotted key: "old → new". Both are resolved with this run's `paths`, so where files lie (`${paths.model_cache}/...`,
    `${oc.env:...}`) is no difference, nor a value moved to another key; a key only one of them has is one."""

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
    """The settings this resume changes against its checkpoint's run (`changed_settings`): a ValueError naming each
    unless `resume.allow_changes`. A checkpoint from before checkpoints held their config: nothing compared, {}."""
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
    """Append this resume (when, its checkpoint and first step, its overrides, the settings it changed) to `HISTORY`."""
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
    meta = checkpoint_meta(path)
    if Path(path).is_dir():
        from torch.distributed.checkpoint import FileSystemReader, TensorStorageMetadata

        index = FileSystemReader(path).read_metadata().state_dict_metadata
        shapes = {
            key.removeprefix("model."): list(item.size)
            for key, item in index.items()
            if key.startswith("model.policy.") and isinstance(item, TensorStorageMetadata)
        }
    else:
        state = meta.get("state_dict", {})
        shapes = {key: list(value.shape) for key, value in state.items() if key.startswith("policy.")}
    return shapes, meta.get("tokenrl", {}).get("base") is None


def policy_shapes(settings: ModelSettings) -> dict[str, list[int]]:
    """The shapes of the `policy.*` weights a run of `model.*` checkpoints, from its architecture on the meta device."""
    from tokenrl.models import meta_model

    return {f"policy.{key}": list(value.shape) for key, value in meta_model(settings).state_dict().items()}


def check_checkpoint_matches(path: str | Path, settings: ModelSettings) -> None:
    """Raise ValueError (one line naming `path`) unless its weights have the shapes of the model of `settings`."""
    (saved, complete), built = checkpoint_shapes(path), policy_shapes(settings)
    mismatch = checkpoint_mismatch(path, saved, built, "resume with the model it was trained with", complete)
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
