"""`python train.py` as a user runs it, in a subprocess: a kill during a checkpoint save, a preemption signal, and
every row of docs/errors.md (each bad input gets its one-line message and exit status, the traceback in train.log)."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tests.helpers.forked_cli import forked_python
from tokenrl.models import build_model
from tokenrl.records.settings import ModelSettings
from tokenrl.run.checkpointing import SHARDED_META
from tokenrl.run.resume import RUN_CONFIG, check_checkpoint_matches, checkpoint_shapes, policy_shapes

pytestmark = pytest.mark.slow  # multi-process runs (README: `-m "not slow"` is the quick loop)

ROOT = Path(__file__).resolve().parents[2]
TINY_RUN = [
    "debug=default",
    "logger=csv",
    "total_steps=6",
    "checkpoint.enabled=true",
    "checkpoint.every_n_steps=1",
    "task.verifier=tests.helpers.rewards:length_reward",
    "validation.every_n_steps=0",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def train(*args: str, module: str | None = None) -> subprocess.CompletedProcess:
    """`python train.py ARGS` (or `python -m MODULE ARGS`), forked from the worker's process that imported tokenrl
    once (tests/helpers/forked_cli.py)."""
    return forked_python([*(["-m", module] if module else ["train.py"]), *args], env=ENV)


def state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["tokenrl"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict:
    """The uninterrupted 6-step run's final state."""
    run_dir = tmp_path_factory.mktemp("straight")
    done = train(*TINY_RUN, f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-2000:]
    return state(run_dir)


def test_a_kill_during_a_save_resumes_in_the_same_folder_to_the_same_result(tmp_path, straight):
    run_dir = tmp_path / "run"
    killed = train("3", *TINY_RUN, f"hydra.run.dir={run_dir}", module="tests.helpers.kill_mid_save")
    assert killed.returncode == -signal.SIGKILL
    checkpoints = run_dir / "checkpoints"
    assert state(run_dir)["rollout_step"] == 2  # the save of step 3 never replaced last.ckpt
    assert list(checkpoints.glob(".*.tmp")), "the killed save leaves its partial temporary file"

    resumed = train(*TINY_RUN, f"ckpt_path={checkpoints / 'last.ckpt'}", f"paths.log_dir={tmp_path / 'logs'}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not (tmp_path / "logs").exists(), "the resumed run writes into the run it continues"
    assert not list(checkpoints.glob(".*.tmp")), "stale temporaries are removed at start-up"
    final = state(run_dir)
    assert final["rollout_step"] == 6 and final["reward_history"] == straight["reward_history"]
    with open(run_dir / "csv" / "metrics.csv", newline="") as handle:
        steps = [float(row["train/rollout_step"]) for row in csv.DictReader(handle) if row.get("train/rollout_step")]
    assert steps == [1, 2, 3, 4, 5, 6]  # one metrics.csv: steps 1-2 kept, step 3 onwards from the resumed run
    assert "resuming from" in (run_dir / "train.log").read_text()


def test_sigterm_mid_run_writes_last_ckpt_promptly_and_a_resume_completes_the_run(tmp_path, straight):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *TINY_RUN, f"hydra.run.dir={run_dir}"],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in process.stdout:
        if "step 2/6 |" in line:
            break
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    output = process.stdout.read()
    process.wait(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert time.monotonic() - sent < 60
    stopped = state(run_dir)
    assert 2 <= stopped["rollout_step"] < 6
    assert "stopped by SIGTERM" in output and "ckpt_path=" in output

    resumed = train(*TINY_RUN, f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = state(run_dir)
    assert final["rollout_step"] == 6 and final["reward_history"] == straight["reward_history"]


def error_table() -> list[tuple[str, int, str]]:
    """(overrides, exit status, message) of each row of docs/errors.md's table."""
    rows = []
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        match = re.match(r"\| `python train\.py (.*?)` \| (\d+) \| `(.*?)` \|", line)
        if match:
            rows.append((match.group(1), int(match.group(2)), match.group(3)))
    return rows


def test_the_error_table_has_its_rows():
    assert len(error_table()) >= 10


def model_config(name: str) -> ModelSettings:
    return ModelSettings.of(OmegaConf.to_container(compose_config([f"model={name}"]).model, resolve=True))


def write_forks_tiny_checkpoint(path: Path) -> Path:
    """A checkpoint with model=forks_tiny's weight names and shapes (each a stride-0 view of one zero: a few KB) after
    one rollout step: the table's checkpoint of another model."""
    zero = torch.zeros(1)
    weights = {key: zero.expand(shape) for key, shape in policy_shapes(model_config("forks_tiny")).items()}
    torch.save({"state_dict": weights, "tokenrl": {"rollout_step": 1}}, path)
    return path


def write_tiny_checkpoint(path: Path) -> Path:
    """A checkpoint of a `debug=default` run after one rollout step, with its config (no weights: a resume with other
    settings stops before it reads them): the table's checkpoint of a run with other settings."""
    config = OmegaConf.to_container(compose_config(["debug=default"]))
    torch.save({"tokenrl": {"rollout_step": 1}, RUN_CONFIG: config}, path)
    return path


CHECKPOINTS = {"forks_tiny.ckpt": write_forks_tiny_checkpoint, "tiny.ckpt": write_tiny_checkpoint}


def with_paths(words: str, folder: Path) -> str:
    """A row's words with its checkpoints (`=forks_tiny.ckpt`) as written in `folder`."""
    for name in CHECKPOINTS:
        words = words.replace(f"={name}", f"={folder / name}")
    return words


@pytest.fixture(scope="module")
def table_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every row of the table, each `python train.py` forked from the worker's process that imported tokenrl once
    (tests/helpers/forked_cli.py; `test_tokenrl_debug_prints_the_traceback` starts the real CLI). The files a row
    names that the repository does not hold (`CHECKPOINTS`) are written for it, and the row's words read with
    their paths."""
    base = tmp_path_factory.mktemp("table")
    for name, write in CHECKPOINTS.items():
        write(base / name)
    return {
        overrides: (
            train("debug=default", *with_paths(overrides, base).split(), f"hydra.run.dir={base / str(n)}"),
            base / str(n),
        )
        for n, (overrides, _, _) in enumerate(error_table())
    }


@pytest.mark.parametrize("overrides,status,message", error_table(), ids=[row[0] for row in error_table()])
def test_each_bad_input_gets_its_message_and_no_traceback(table_runs, overrides, status, message):
    done, run_dir = table_runs[overrides]
    message = with_paths(message, run_dir.parent)
    assert done.returncode == status, done.stderr[-3000:]
    assert message in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    if status == 2 and "the traceback is in" not in done.stderr:  # refused on the command line: no run folder made
        assert not run_dir.exists()
    elif status == 2:  # tokenrl's own errors: the traceback is in the run's train.log
        assert "Traceback" in (run_dir / "train.log").read_text()


def test_the_other_models_checkpoint_of_the_table_is_one_of_model_forks_tiny(tmp_path):
    """The table's forks_tiny.ckpt: model=forks_tiny's weights' names and shapes (`policy_shapes`) and
    `tokenrl.rollout_step=1`; a sharded checkpoint is checked by its index."""
    fixture = write_forks_tiny_checkpoint(tmp_path / "forks_tiny.ckpt")
    forks_tiny, tiny = model_config("forks_tiny"), model_config("tiny")
    assert checkpoint_shapes(fixture) == (policy_shapes(forks_tiny), True)
    check_checkpoint_matches(fixture, forks_tiny)
    with pytest.raises(
        ValueError,
        match=r"27 of 27 weights differ in shape, e.g. `policy.lm_head.weight` \[128, 128\] "
        r"in the checkpoint vs \[128, 64\] here\): resume with the model it",
    ):
        check_checkpoint_matches(fixture, tiny)
    sharded = tmp_path / "last.ckpt"
    dcp.save({"model": {key: torch.zeros(shape) for key, shape in policy_shapes(tiny).items()}}, checkpoint_id=sharded)
    torch.save({"tokenrl": {"rollout_step": 1}}, sharded / SHARDED_META)
    check_checkpoint_matches(sharded, tiny)
    with pytest.raises(ValueError, match=rf"ckpt_path={sharded}: a checkpoint of another model \(27 of 27 weights"):
        check_checkpoint_matches(sharded, forks_tiny)
    lora = replace(tiny, lora={"r": 2, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]})
    built = {f"policy.{key}": list(value.shape) for key, value in build_model(lora).state_dict().items()}
    assert policy_shapes(lora) == built and any(".lora_A." in key for key in built)  # the meta build's names


def test_tokenrl_debug_prints_the_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "debug=default", "total_steps=-1", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        env={**ENV, "TOKENRL_DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and "Traceback" in done.stderr  # the table's first row, from a real start-up
    assert done.stderr.startswith("error:") and "total_steps=-1: must be an integer >= 1" in done.stderr
