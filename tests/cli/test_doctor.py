"""cli/doctor.py: `python -m tokenrl.cli.doctor` passes on this CPU machine (hf, vLLM when installed, DDP over two
processes), writes its report into a folder of its own (or `--out`), and exits non-zero when a check fails."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers.forked_cli import forked_python
from tokenrl.cli.doctor import main
from tokenrl.run.machine_check import checks, environment


@pytest.fixture(autouse=True)
def forked_checks(monkeypatch):
    """Each check's `python train.py ...` forked from the worker's server (tests/helpers/forked_cli.py): what the
    doctor makes of a run is tested here, a fresh start-up elsewhere. DDP's rank 1 still starts fresh."""
    fresh = subprocess.run

    def run(command, **kwargs):
        if command[0] != sys.executable:
            return fresh(command, **kwargs)
        return forked_python(command[1:], cwd=kwargs["cwd"], timeout=kwargs["timeout"], env=kwargs.get("env"))

    monkeypatch.setattr(subprocess, "run", run)


def doctor(tmp_path, capsys, *args: str) -> tuple[int, str, dict]:
    """`python -m tokenrl.cli.doctor` in this process (its checks still run `train.py` in processes of their own): the
    exit status, what it printed and its report."""
    out = tmp_path / "reports" / "doctor.json"  # --out's folder is made
    status = main(["--out", str(out), *args])
    return status, capsys.readouterr().out, json.loads(out.read_text())


@pytest.mark.slow
def test_the_doctor_passes_here_and_reports_every_check(tmp_path, capsys):
    status, printed, report = doctor(tmp_path, capsys)
    assert status == 0, printed[-3000:]
    assert report["ok"] and report["environment"]["torch"] and report["memory_plan"]["peak_gib"] > 0
    statuses = {check["check"]: check["status"] for check in report["checks"]}
    expected_vllm = "passed" if report["environment"]["vllm"] else "skipped"
    assert statuses == {
        "hf, one CPU process": "passed",
        "vllm, one CPU process": expected_vllm,
        "hf, DDP over 2 CPU processes": "passed",
    }
    for check in report["checks"]:
        if check["status"] == "passed":
            assert check["logprob_gap_max"] <= 1e-3 and check["weights_finite"]
    assert "all checks passed" in printed


@pytest.mark.slow
def test_a_failing_check_fails_the_doctor(tmp_path, capsys):
    status, _, report = doctor(tmp_path, capsys, "--only", "hf", "--extra", "algorithm.optimizer.lr=1e39")
    assert status == 1 and not report["ok"]
    [check] = report["checks"]
    assert check["status"] == "failed" and check["reason"]


def test_a_machine_without_gpus_runs_ddp_on_two_cpu_processes():
    env = {**environment(), "gpus": [], "vllm": None}
    found = {check.kind: check for check in checks(env)}
    assert found["vllm"].skipped.startswith("vLLM is not installed")
    assert "trainer.devices=2" in found["ddp"].overrides and not found["ddp"].skipped
    two_gpus = {**env, "gpus": [{"name": "GPU", "memory_gib": 80.0}] * 2}
    assert "trainer.devices=2" in {check.kind: check for check in checks(two_gpus)}["ddp"].overrides


def test_each_report_gets_a_folder_of_its_own_and_the_doctor_says_where(tmp_path, monkeypatch, capsys):
    """Without --out: logs/doctor/<time>_<pid>-<4 hex>/doctor.json, a new folder also for two reports in the same
    second (no checks run here: the tests above run them)."""
    monkeypatch.setattr("tokenrl.run.machine_check.LOG_DIR", tmp_path / "doctor")
    monkeypatch.setattr("tokenrl.run.machine_check.checks", lambda env: [])
    monkeypatch.setattr(time, "time", lambda: 1.8e9)
    reports = []
    for _ in range(2):
        assert main([]) == 0
        reports.append(capsys.readouterr().out.splitlines()[-1].split("report: ")[1])
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(1.8e9))
    folders = sorted((tmp_path / "doctor").iterdir())
    assert len(folders) == 2 and all(folder.name.startswith(f"{stamp}_") for folder in folders)
    assert sorted(reports) == [str(folder / "doctor.json") for folder in folders]
    assert all(json.loads((folder / "doctor.json").read_text())["ok"] for folder in folders)
