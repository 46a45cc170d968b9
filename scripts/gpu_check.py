"""The ordered GPU verification (scripts/gpu_check.sh runs it): each step in its own process under a 10-minute limit,
offline, with the hf engine unless a step says otherwise; results in benchmarks/gpu_check.json (GPU, driver,
versions, date, each step's status, seconds and output tail), rewritten after every step. Run it first whenever a
GPU is at hand.

    bash scripts/gpu_check.sh [--steps doctor tests ...] [--out benchmarks/gpu_check.json] [--logs DIR]

1. doctor       tokenrl-doctor: versions, devices, hf / vLLM / DDP steps on the GPU(s)
2. tests        the GPU tests (tests/test_gpu.py: bf16-mixed steps, FSDP on one GPU = plain, FSDP export, vLLM)
3. ddp_no_sync  DDP over NCCL all-reduces once per optimizer step (tests/step/test_distributed.py's check; ≥ 2 GPUs)
4. step_0.5b    scripts/bench/gpu_step.py, Qwen2.5-0.5B shape: fast path off / on (the preset: no checkpointing)
5. step_0.5b_ckpt     the same with gradient checkpointing (the memory it saves, the time it costs)
6. step_1.5b    Qwen2.5-1.5B shape, fast path on, gradient checkpointing on and off
7. fsdp_resume  trainer=fsdp on the GPUs: 2 steps with a checkpoint, then a resume to step 3
8. autocast_hf  one bf16-mixed step generating with the hf engine under autocast (tests/test_gpu.py's step test)
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 600
BENCH = [sys.executable, "scripts/bench/gpu_step.py", "--prompts", "16", "--max-new-tokens", "512", "--steps", "2"]


def steps(gpus: int, work: Path) -> dict[str, list[list[str]] | str]:
    """Each step's commands (run in order), or why this machine skips it."""
    tiny = [
        "debug=default",
        "trainer=fsdp",
        f"trainer.devices={gpus}",
        "checkpoint.enabled=true",
        "checkpoint.every_n_steps=1",
        "validation.every_n_steps=0",
    ]
    return {
        "doctor": [[sys.executable, "-m", "tokenrl.cli.doctor", "--out", str(work / "doctor.json")]],
        "tests": [[sys.executable, "-m", "pytest", "-q", "tests/test_gpu.py"]],
        "ddp_no_sync": (
            [
                [
                    "env",
                    "DDP_STEP_ACCELERATOR=gpu",
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "tests/step/test_distributed.py",
                    "-k",
                    "all_reduces_once",
                ]
            ]
            if gpus >= 2
            else "needs 2 GPUs"
        ),
        "step_0.5b": [
            [*BENCH, "--models", "qwen0.5b", "--fast-path", "off", "on", "--out", str(work / "step_0.5b.json")]
        ],
        "step_0.5b_ckpt": [
            [
                *BENCH,
                "--models",
                "qwen0.5b",
                "--gradient-checkpointing",
                "on",
                "--out",
                str(work / "step_0.5b_ckpt.json"),
            ]
        ],
        "step_1.5b": [
            [*BENCH, "--models", "qwen1.5b", "--out", str(work / "step_1.5b.json")],
            [
                *BENCH,
                "--models",
                "qwen1.5b",
                "--gradient-checkpointing",
                "on",
                "--out",
                str(work / "step_1.5b_ckpt.json"),
            ],
        ],
        "fsdp_resume": [
            [sys.executable, "train.py", *tiny, "total_steps=2", f"hydra.run.dir={work / 'fsdp'}"],
            [
                sys.executable,
                "train.py",
                *tiny,
                "total_steps=3",
                f"ckpt_path={work / 'fsdp' / 'checkpoints' / 'last.ckpt'}",
            ],
        ],
        "autocast_hf": [[sys.executable, "-m", "pytest", "-q", "tests/test_gpu.py", "-k", "bf16_mixed_step"]],
    }


def run_step(commands: list[list[str]], log: Path | None) -> dict:
    """Run a step's commands in order, stopping at the first failure; each command's whole output is appended to
    `log` when given."""
    start, tails = time.monotonic(), []
    for command in commands:
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S)
        except subprocess.TimeoutExpired:
            return {
                "status": "failed",
                "seconds": round(time.monotonic() - start, 1),
                "reason": f"over {LIMIT_S} s: {' '.join(command)}",
            }
        if log is not None:
            with log.open("a") as out:
                out.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}\n[exit status {done.returncode}]\n")
        tails.append((done.stdout + done.stderr)[-1500:])
        if done.returncode:
            return {
                "status": "failed",
                "seconds": round(time.monotonic() - start, 1),
                "command": command,
                "exit_status": done.returncode,
                "output_tail": tails[-1],
            }
    return {"status": "passed", "seconds": round(time.monotonic() - start, 1), "output_tail": tails[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", nargs="+", help="run only these steps (default: all, in order)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpu_check.json")
    parser.add_argument("--logs", type=Path, help="write each step's whole output to LOGS/<step>.log")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA GPU here (torch.cuda.is_available() is false); run it on a GPU machine", file=sys.stderr
        )
        return 2
    gpus = torch.cuda.device_count()
    work = Path(tempfile.mkdtemp(prefix="tokenrl-gpu-check-"))
    driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    record = {
        "check": "gpu_check",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)],
            "driver": driver,
            "cuda": torch.version.cuda,
            "platform": platform.platform(),
        },
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "steps": {},
        "benchmarks": {},
    }
    results = record["steps"]
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    for name, commands in steps(gpus, work).items():
        if args.steps and name not in args.steps:
            continue
        print(f"[gpu_check] {name} ...", flush=True)
        results[name] = (
            {"status": "skipped", "reason": commands}
            if isinstance(commands, str)
            else run_step(commands, args.logs / f"{name}.log" if args.logs else None)
        )
        print(f"[gpu_check] {name}: {results[name]['status']} ({results[name].get('seconds', 0)} s)", flush=True)
        if results[name]["status"] == "failed":
            print(results[name].get("output_tail", results[name].get("reason")), flush=True)
        record["benchmarks"] = {path.name: json.loads(path.read_text()) for path in work.glob("*.json")}
        args.out.write_text(json.dumps(record, indent=2))  # after every step: a machine taken back keeps what ran
    shutil.rmtree(work, ignore_errors=True)
    failed = [name for name, result in results.items() if result["status"] == "failed"]
    print(f"[gpu_check] {'FAILED: ' + ', '.join(failed) if failed else 'all steps passed'}; wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
