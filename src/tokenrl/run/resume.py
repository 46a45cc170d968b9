"""Resuming a run: which checkpoint (`ckpt_path=<file>` or `ckpt_path=auto`), the step it holds, and keeping the
resumed run in its original folder with one `metrics.csv`.

`python train.py <overrides> ckpt_path=<run>/checkpoints/last.ckpt` continues in `<run>/` (`config/command_line.py`
adds `hydra.run.dir=<run>` before Hydra starts): `train.log` is appended to, and `metrics.csv` keeps the rows of the
steps the checkpoint holds (rows of steps after it, which the resumed run redoes, are dropped). `ckpt_path=auto` resumes
from the run folder's own `last.ckpt` when there is one and starts fresh otherwise (a requeued SLURM job); when that
`last.ckpt` already holds `total_steps` (a finished job of a re-run sweep) it raises `RunComplete` and the run ends
without training. A checkpoint is a `.ckpt` file or, under `trainer=fsdp`, a sharded checkpoint's folder of the same
name (run/checkpointing.py). A checkpoint of another model (other shapes) is refused before anything loads
(`check_checkpoint_matches`). `ckpt_path=auto` needs checkpoints (`checkpoint.enabled`), and skips a job that finished
(its `summary.json` there) whatever they are.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tokenrl.config.command_line import AUTO
from tokenrl.run.checkpointing import SHARDED_META, checkpoint_mismatch, interrupted_swap, is_sharded_checkpoint

log = logging.getLogger(__name__)


class RunComplete(Exception):
    """`ckpt_path=auto` in a run whose own last.ckpt holds every step: nothing to train. The message says so and where
    the summary is; `summary` is the run's summary.json ({} when it stopped before writing it)."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.summary = summary


def checkpoint_step(path: str | Path) -> int:
    """The rollout steps done in the checkpoint at `path` (memory-mapped: the weights are not read; of a sharded
    checkpoint its meta.pt, which holds no weights)."""
    source = Path(path) / SHARDED_META if Path(path).is_dir() else path
    checkpoint = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
    try:
        return int(checkpoint["tokenrl"]["rollout_step"])
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


def checkpoint_shapes(path: str | Path) -> tuple[dict[str, list[int]], bool]:
    """The shapes of the `policy.*` weights of the checkpoint at `path` (a `.ckpt` file, memory-mapped, or a sharded
    folder's index: no weights are read), and whether it holds them all (False: a LoRA checkpoint's adapters)."""
    path = Path(path)
    if path.is_dir():
        from torch.distributed.checkpoint import FileSystemReader

        index = FileSystemReader(path).read_metadata().state_dict_metadata
        shapes = {
            key.removeprefix("model."): list(item.size)
            for key, item in index.items()
            if key.startswith("model.policy.")
        }
        meta = torch.load(path / SHARDED_META, map_location="cpu", weights_only=True)
    else:
        meta = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        shapes = {
            key: list(value.shape) for key, value in meta.get("state_dict", {}).items() if key.startswith("policy.")
        }
    return shapes, meta.get("tokenrl", {}).get("base") is None


def policy_shapes(model_cfg: Mapping[str, Any]) -> dict[str, list[int]]:
    """The shapes of the `policy.*` weights a run of `model.*` = `model_cfg` checkpoints, from its architecture
    built on the meta device (no memory, no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tokenrl.models import _load_pretrained

    if model_cfg["init"] == "random":
        arch = dict(model_cfg["architecture"])
        config = AutoConfig.for_model(arch.pop("model_type"), **arch)
    else:
        config = _load_pretrained(model_cfg["source"], AutoConfig)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if model_cfg.get("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **dict(model_cfg["lora"])))
    return {f"policy.{key}": list(value.shape) for key, value in model.state_dict().items()}


def check_checkpoint_matches(path: str | Path, model_cfg: Mapping[str, Any]) -> None:
    """Raise ValueError (one line naming `path`, how many weights differ and one of them) unless the checkpoint at
    `path` holds weights of the shapes the model of `model_cfg` has."""
    saved, complete = checkpoint_shapes(path)
    mismatch = checkpoint_mismatch(
        path, saved, policy_shapes(model_cfg), "resume with the model it was trained with", complete
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
