"""The start-up memory plan (src/tokenrl/run/memory_plan.py) against the measured peak: each configuration trains 2
rollout steps in a fresh `python train.py` process, whose summary.json holds both the plan's peak and the process's peak
resident memory (ru_maxrss). On CPU the plan's device is the host, so the two compare directly.

    python scripts/bench/memory_plan.py [--out benchmarks/memory_plan.json]

Configurations: the default model (SmolLM2-135M, pretrained, and the same architecture with random weights, whose
responses run to the budget like the plan's worst case; also in micro-batches of at most 256 tokens,
`algorithm.micro_batch_tokens`) and a larger CPU-sized one (Qwen2.5-0.5B's architecture, random weights). Prints a
table; writes the results file (machine, date, versions).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
COMMON = [
    "total_steps=2",
    "validation.every_n_steps=0",
    "checkpoint.enabled=false",
    "samples.every_n_steps=0",
    "logger=none",
    "trainer.enable_progress_bar=false",
]
CONFIGS = {
    "smollm2_135m (default)": [],
    "smollm2_135m random": ["model.init=random", "model.tokenizer=char"],
    "smollm2_135m random, 256-token budget": [
        "model.init=random",
        "model.tokenizer=char",
        "algorithm.micro_batch_tokens=256",
    ],
    "qwen0.5b random": [
        "model=qwen0.5b",
        "task=arithmetic",  # not the preset's paper task (GSM8K: the benchmark files)
        "model.init=random",
        "model.tokenizer=char",
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=4",
        "task.max_new_tokens=48",
    ],
}


def measure(overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        done = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), *COMMON, *overrides, f"hydra.run.dir={run_dir}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            sys.exit(f"{' '.join(overrides)} failed:\n{done.stderr[-3000:]}")
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    planned, measured = summary["memory_plan_peak_gib"], summary["peak_host_memory_gib"]
    return {
        "overrides": overrides,
        "planned_gib": planned,
        "measured_gib": measured,
        "error": planned / measured - 1,
        "response_len": summary.get("train/response_len"),
        "prompt_len": summary.get("train/prompt_len"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "memory_plan.json")
    args = parser.parse_args()
    results = {name: measure(overrides) for name, overrides in CONFIGS.items()}
    print(f"{'config':<38} {'planned GiB':>12} {'measured GiB':>13} {'error':>7}")
    for name, r in results.items():
        print(f"{name:<38} {r['planned_gib']:>12.2f} {r['measured_gib']:>13.2f} {r['error']:>+7.1%}")
    import lightning
    import torch
    import transformers

    record = {
        "benchmark": "memory_plan",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "lightning": lightning.__version__,
        },
        "common_overrides": COMMON,
        "results": results,
    }
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
