"""scripts/gpu_check.py: the ordered GPU steps (each a command this checkout has), and a clear refusal without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from gpu_check import run_step, steps  # noqa: E402


def test_the_steps_are_in_order_and_point_at_what_exists(tmp_path):
    plan = steps(1, tmp_path)
    assert list(plan) == [
        "doctor",
        "tests",
        "ddp_no_sync",
        "step_0.5b",
        "step_0.5b_ckpt",
        "step_1.5b",
        "fsdp_resume",
        "autocast_hf",
    ]
    assert plan["ddp_no_sync"] == "needs 2 GPUs" and isinstance(steps(2, tmp_path)["ddp_no_sync"], list)
    for commands in plan.values():
        for command in commands if isinstance(commands, list) else []:
            files = [part for part in command if part.endswith((".py", ".sh")) and "/" in part]
            assert all((ROOT / part).is_file() for part in files), files
    resume = plan["fsdp_resume"][1]
    assert any(part.startswith("ckpt_path=") for part in resume) and "total_steps=3" in resume


def test_a_step_stops_at_its_first_failing_command_and_logs_each_whole_output(tmp_path):
    log = tmp_path / "step.log"
    commands = [
        [sys.executable, "-c", "print('first')"],
        [sys.executable, "-c", "import sys; sys.exit('second broke')"],
        [sys.executable, "-c", "print('never')"],
    ]
    result = run_step(commands, log)
    assert result["status"] == "failed" and result["exit_status"] == 1 and "second broke" in result["output_tail"]
    text = log.read_text()
    assert "first" in text and "second broke" in text and "never" not in text and "[exit status 1]" in text
    assert run_step(commands[:1], None)["status"] == "passed"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2():
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no CUDA GPU here" in done.stderr
