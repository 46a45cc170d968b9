"""Read a Hydra multirun folder: one `Run` per job, with its status, swept overrides and logged curves.

A job folder `<sweep>/<n>/` holds `.hydra/{config,overrides}.yaml`, `csv/metrics.csv`, `samples/` and, once training
finished, `summary.json`. Status: `complete` (summary with every rollout step), `failed` (a traceback in the job log,
or nothing logged), `incomplete` (stopped or still running). Runs the sweep asked for but never started are listed
by `missing_runs`.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


@dataclass
class Run:
    job: str
    folder: Path
    overrides: dict[str, str]
    seed: int
    total_steps: int
    status: str = "incomplete"
    reason: str = ""
    steps: dict[int, dict[str, float]] = field(default_factory=dict)  # rollout step → train/select/time metrics
    validation: dict[int, dict[str, float]] = field(default_factory=dict)  # updates applied → val metrics
    label: str = ""
    lr: float = math.nan  # algorithm.optimizer.lr as resolved in the run's own config

    @property
    def updated_share(self) -> float:
        """The share of response tokens the selection updated (`select/fraction`), mean over the logged steps."""
        return window_mean(self, "select/fraction", "all")

    @property
    def complete(self) -> bool:
        return self.status == "complete"


ROLLOUT_STEP = "train/rollout_step"
SWEEP_FOLDER = "a report is over a sweep's folder, logs/<task_name>/multiruns/<time> (`python train.py -m ...`)"


def rollout_step_index(logged: float | str) -> int:
    """The 0-based index of the rollout step a metrics.csv row describes, from its `train/rollout_step`.

    The module logs `train/rollout_step` after counting the step (1 … N: steps done), as the console and the sample
    files (`step_NNNN.jsonl`) count; the report keys steps by this index and shows them counted from 1 (step k + 1)."""
    return int(float(logged)) - 1


def _overrides(folder: Path) -> dict[str, str]:
    lines = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) or []
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _read_metrics(path: Path) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """Train metrics keyed by rollout step (0-based) and validation metrics keyed by `val/at_step`."""
    steps: dict[int, dict[str, float]] = {}
    validation: dict[int, dict[str, float]] = {}
    if not path.is_file():
        return steps, validation
    with path.open() as handle:
        for row in csv.DictReader(handle):
            values = {k: float(v) for k, v in row.items() if v not in ("", None) and k not in ("epoch", "step")}
            if ROLLOUT_STEP in values:
                steps[rollout_step_index(values[ROLLOUT_STEP])] = {
                    k: v
                    for k, v in values.items()
                    if k.startswith(("train/", "select/", "forks/", "time/")) and k != "time/validate"
                }
            if "val/at_step" in values:
                validation.setdefault(
                    int(values["val/at_step"]), {k: v for k, v in values.items() if k.startswith("val/")}
                )
    return steps, validation


def _failure(folder: Path) -> str:
    """The last line of a traceback in the job's log files, or ''."""
    for log in sorted(folder.glob("*.log")):
        text = log.read_text(errors="replace")
        if "Traceback" in text or "Error executing job" in text:
            lines = [line for line in text.splitlines() if line.strip()]
            return lines[-1][:300] if lines else "traceback"
    return ""


def _resolved_lr(config: DictConfig) -> float:
    """algorithm.optimizer.lr of a saved config, its interpolations (`${forks_tuned.lr.oracle}`) resolved; nan where
    it has none or it does not resolve."""
    try:
        value = OmegaConf.select(config, "algorithm.optimizer.lr", default=None)
        return math.nan if value is None else float(value)
    except (OmegaConfBaseException, ValueError, TypeError):
        return math.nan


def load_run(folder: Path) -> Run:
    config = OmegaConf.load(folder / ".hydra" / "config.yaml")
    assert isinstance(config, DictConfig)  # a job's saved config is a mapping
    run = Run(
        job=folder.name,
        folder=folder,
        overrides=_overrides(folder),
        seed=int(config["seed"]),
        total_steps=int(config["total_steps"]),
        lr=_resolved_lr(config),
    )
    run.steps, run.validation = _read_metrics(folder / "csv" / "metrics.csv")
    summary_path = folder / "summary.json"
    failure = _failure(folder)
    if summary_path.is_file():
        done = json.loads(summary_path.read_text()).get("rollout_steps", 0)
        if done >= run.total_steps:
            run.status = "complete"
        else:
            run.status, run.reason = "incomplete", f"summary.json after {done} of {run.total_steps} steps"
    elif failure:
        run.status, run.reason = "failed", failure
    elif not run.steps:
        run.status, run.reason = "failed", "nothing logged (csv/metrics.csv missing or empty)"
    else:
        run.status, run.reason = "incomplete", f"{len(run.steps)} of {run.total_steps} steps logged, no summary.json"
    return run


def load_sweep(folder: Path) -> list[Run]:
    """Every job folder (a numbered folder with `.hydra/`) under a multirun folder, labelled by its swept overrides."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: {'not a folder' if folder.exists() else 'no such folder'}; {SWEEP_FOLDER}")
    if (folder / ".hydra" / "config.yaml").is_file():
        raise ValueError(f"{folder} is a single run's folder; {SWEEP_FOLDER}; a run's samples: --samples")
    jobs = sorted(
        (p for p in folder.iterdir() if p.is_dir() and (p / ".hydra" / "config.yaml").is_file()),
        key=lambda p: (len(p.name), p.name),
    )
    if not jobs:
        raise ValueError(f"{folder} has no job folders (<n>/.hydra/config.yaml); {SWEEP_FOLDER}")
    runs = [load_run(job) for job in jobs]
    varying = sorted(set(sweep_grid(folder)) - {"seed"}) or sorted(
        {k for run in runs for k in run.overrides if len({r.overrides.get(k) for r in runs}) > 1} - {"seed"}
    )
    for run in runs:
        parts = [run.overrides.get(k, "default") for k in varying]
        run.label = (
            ",".join(parts) if len(varying) == 1 else ",".join(f"{k}={v}" for k, v in zip(varying, parts)) or "all"
        )
    return runs


def sweep_grid(folder: Path) -> dict[str, list[str]]:
    """The swept keys and the values the sweep ran, as Hydra's basic sweeper expands `multirun.yaml`: the sweeper
    params, then the command-line overrides (`hydra.overrides.task`), each replacing what came before for its key, so
    `seed=0` narrows a swept seed to one value. Keys no sweep names are left out, and so is a glob sweep (its options
    need Hydra's config loader)."""
    path = Path(folder) / "multirun.yaml"
    if not path.is_file():
        return {}
    hydra = (yaml.safe_load(path.read_text()) or {}).get("hydra", {})
    params = (hydra.get("sweeper") or {}).get("params") or {}
    lines = [f"{key}={value}" for key, value in params.items()] + ((hydra.get("overrides") or {}).get("task") or [])
    grid: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(lines):
        key = override.get_key_element()
        if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
            grid.pop(key, None)
        elif override.is_discrete_sweep():
            grid[key] = list(override.sweep_string_iterator())
        elif key in grid:
            grid[key] = [override.get_value_element_as_str()]
    return grid


def missing_runs(folder: Path, runs: list[Run]) -> list[dict[str, str]]:
    """Combinations of the sweep grid that no job folder holds (runs that never started)."""
    grid = sweep_grid(folder)
    if not grid:
        return []
    present = [{k: run.overrides.get(k) for k in grid} for run in runs]
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    return [combo for combo in combos if combo not in present]


def last_mean(run: Run, key: str, last: int = 3) -> float:
    """Mean of `key` over the run's last `last` logged rollout steps (nan if never logged)."""
    values = [run.steps[s][key] for s in sorted(run.steps)[-last:] if key in run.steps[s]]
    return sum(values) / len(values) if values else math.nan


WINDOW = 50  # steps in a time series' first, middle and last window


def window_mean(run: Run, key: str, window: str) -> float:
    """Mean of `key` over the `first`, `middle` or `last` WINDOW of the run's steps that logged it (fewer steps: all
    of them), or over `all` of them; nan where none did."""
    steps = sorted(step for step, values in run.steps.items() if key in values)
    if window != "all":
        start = {"first": 0, "middle": (len(steps) - WINDOW) // 2, "last": len(steps) - WINDOW}[window]
        steps = steps[max(start, 0) :][:WINDOW]
    return sum(run.steps[step][key] for step in steps) / len(steps) if steps else math.nan


def final_validation(run: Run) -> dict[str, float]:
    """The validation after the last update (`val/at_step` = total_steps), or {}."""
    return run.validation.get(run.total_steps, {})
