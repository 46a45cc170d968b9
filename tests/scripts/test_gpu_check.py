"""scripts/gpu_check.py: the GPU steps in order of value, partitioned into calls that fit their budgets (each a
command this checkout has, or skipped with the reason), the calls' files merged, and a clear refusal without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from gpu_check import (  # noqa: E402
    CALL_BUDGET_S,
    ESTIMATE_S,
    SETUP_S,
    Step,
    chosen,
    measured_estimates,
    merge,
    missing,
    run_step,
    steps,
)


def test_the_steps_are_in_order_of_value_and_the_first_calls_fit_a_window(tmp_path):
    plan = steps(1, tmp_path)
    assert [step.name for step in plan] == [
        "doctor_vllm",  # the smoke: vLLM generates on the GPU
        "vllm_follows",
        "step_0.5b_vllm",
        "step_1.5b_vllm",
        "headline",
        "profile_0.5b",
        "update_0.5b",
        "trl_hf",
        "update_1.5b",
        "trl_vllm",
        "engines_hf",
        "engines_vllm",
        "attention",
        "lm_head",
        "update_0.5b_packed",
        "tests",
        "fsdp_resume",
        "step_1.5b_ckpt",
        "ddp_no_sync",
    ]
    assert [step.call for step in plan] == sorted(step.call for step in plan)  # calls in order, values within
    assert sum(CALL_BUDGET_S[call] for call in (1, 2, 3)) <= 12 * 60  # + the machine's start: one 15-minute window
    assert CALL_BUDGET_S[1] + 30 <= 180  # the smoke, its probe included, ends within 3 minutes
    for call in (1, 2):  # the most valuable calls hold all their steps and the setup at their estimates
        assert SETUP_S + sum(step.estimate_s for step in plan if step.call == call) <= CALL_BUDGET_S[call]
    by_name = {step.name: step for step in plan}
    assert by_name["ddp_no_sync"].skip == "needs 2 GPUs" and steps(2, tmp_path)[-1].skip is None
    for step in plan:
        for command in step.commands:
            files = [part for part in command if part.endswith((".py", ".sh")) and "/" in part]
            assert all((ROOT / part).is_file() or part in step.scripts for part in files), files
    resume = by_name["fsdp_resume"].commands[1]
    assert any(part.startswith("ckpt_path=") for part in resume) and "total_steps=3" in resume
    composed, ran = by_name["headline"].commands
    assert composed[2:] == ["selector=ict", "model=qwen1.5b", "--cfg", "job"] and ran[2:4] == composed[2:4]


def test_named_steps_run_in_the_order_given_with_their_last_measured_estimates(tmp_path):
    plan = steps(1, tmp_path)
    assert [step.name for step in chosen(plan, None, ["trl_hf", "doctor_vllm", "update_0.5b"])] == [
        "trl_hf",
        "doctor_vllm",
        "update_0.5b",
    ]
    assert [step.name for step in chosen(steps(1, tmp_path), 1, None)] == ["doctor_vllm"]
    with pytest.raises(SystemExit, match="no step nosuch"):
        chosen(plan, None, ["nosuch"])
    record = tmp_path / "gpu_check.json"
    record.write_text(
        json.dumps(
            {
                "runs": [
                    {"date": "2026-11-26", "steps": {"update_0.5b": {"status": "passed", "seconds": 80.4}}},
                    {"date": "2026-11-28", "steps": {"update_0.5b": {"status": "passed", "seconds": 116.3}}},
                    {"date": "2026-11-29", "steps": {"update_0.5b": {"status": "failed", "seconds": 3.0}}},
                ]
            }
        )
    )
    estimates = measured_estimates(record)
    assert estimates["update_0.5b"] == 116 and estimates["trl_hf"] == ESTIMATE_S["trl_hf"]
    assert measured_estimates(tmp_path / "absent.json") == ESTIMATE_S


def test_what_is_missing_is_a_skip_with_the_reason():
    imports = {"vllm": "absent: ModuleNotFoundError('vllm')", "trl": "1.16.0"}
    assert missing(Step("a", 1, 1, [], needs=("trl",)), imports) is None
    assert "vllm does not import" in missing(Step("b", 1, 1, [], needs=("trl", "vllm")), imports)
    assert missing(Step("c", 1, 1, [], scripts=("scripts/bench/nothing.py",)), imports) == (
        "scripts/bench/nothing.py does not exist yet"
    )
    assert missing(Step("d", 1, 1, [], skip="needs 2 GPUs"), imports) == "needs 2 GPUs"


def test_a_step_stops_at_its_first_failing_command_and_logs_each_whole_output(tmp_path):
    log = tmp_path / "step.log"
    commands = [
        [sys.executable, "-c", "print('first')"],
        [sys.executable, "-c", "import sys; sys.exit('second broke')"],
        [sys.executable, "-c", "print('never')"],
    ]
    result = run_step(commands, log, 120)
    assert result["status"] == "failed" and result["exit_status"] == 1 and "second broke" in result["output_tail"]
    text = log.read_text()
    assert "first" in text and "second broke" in text and "never" not in text and "[exit status 1]" in text
    assert run_step(commands[:1], None, 120)["status"] == "passed"
    slow = run_step([[sys.executable, "-c", "import time; time.sleep(30)"]], log, 2)
    assert slow["status"] == "failed" and slow["reason"].startswith("over 2 s")


def test_the_calls_files_merge_into_one_record(tmp_path):
    files = []
    for call, step in ((1, "doctor_vllm"), (2, "lm_head")):
        record = {
            "call": call,
            "date": f"2026-11-26T0{call}:00:00+00:00",
            "machine": {"gpus": ["H200"]},
            "versions": {"torch": "2.11.0"},
            "steps": {"setup": {"status": "passed"}, step: {"status": "passed"}},
            "benchmarks": {f"{step}.json": {"call": call}},
        }
        files.append(tmp_path / f"call{call}.json")
        files[-1].write_text(json.dumps(record))
    merge(files, tmp_path / "merged.json")
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert list(merged["steps"]) == ["setup", "doctor_vllm", "lm_head"]
    assert merged["benchmarks"] == {"doctor_vllm.json": {"call": 1}, "lm_head.json": {"call": 2}}
    assert [run["call"] for run in merged["runs"]] == [1, 2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2():
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--call", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "no CUDA GPU here" in done.stderr
