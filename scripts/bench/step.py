"""One GRPO step of the project's CPU anchor, with the update's fast path (`fast_path.*`, docs/algorithms.md §12) on
and off: time per phase and peak memory.

    python scripts/bench/step.py [--rounds 2] [--steps 3]
                                 [--variants baseline shared_prefix packed fused_statistics pack all all_packed ...]

The anchor (issue #15): SmolLM2-135M-Instruct in fp32, 4 prompts × 8 samples, ≤ 64 new tokens, vLLM rollouts
colocated (`rollout=vllm`), `selector=ict` with `selector_warmup_steps=0` (JS computed every step), lr 1e-6, no KL,
token-mean. Prompts: simple arithmetic word problems ending in "Put the final answer after ####.", through the chat
template (`task=dataset` on a generated jsonl). Variants: `baseline` = every shortcut off (the path before the fast
path: `fast_path.layout=padded`, the rest false), `shared_prefix` / `packed` = that layout alone, `fused_statistics` /
`pack` = that switch alone, `all` = the default (`fast_path.layout=auto` and both switches), `all_<layout>` = both
switches with that layout.
Each run is a fresh process (tcmalloc, as train.py); its first step warms up and the mean of the others is reported;
peak memory is the process's peak RSS. `trainer` time = statistics + update, the phases the fast path changes
(generation does the same work in every variant). Variants alternate within a round and each round reverses the order,
so a drifting machine biases none; speed-ups are per-round ratios to `baseline` of the same round. Prints a table;
writes benchmarks/step.json (machine with CPU model and vector ISA, date, versions).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

BASELINE = {"layout": "padded", "fused_statistics": "false", "pack": "false"}  # every fast_path.* shortcut off
VARIANTS = {
    "baseline": {},
    "shared_prefix": {"layout": "shared_prefix"},
    "packed": {"layout": "packed"},
    "fused_statistics": {"fused_statistics": "true"},
    "pack": {"pack": "true"},
    "all": {"layout": "auto", "fused_statistics": "true", "pack": "true"},
    "all_padded": {"layout": "padded", "fused_statistics": "true", "pack": "true"},
    "all_shared_prefix": {"layout": "shared_prefix", "fused_statistics": "true", "pack": "true"},
    "all_packed": {"layout": "packed", "fused_statistics": "true", "pack": "true"},
}
PHASES = ("generate", "reward", "statistics", "update", "sync")
KEPT = ("time/", "train/response_len", "train/prompt_len", "train/fused_statistics", "train/loss")
NAMES = ("Tom", "Ana", "Wei", "Sara", "Omar", "Lena", "Ravi", "Mia")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells")


def word_problems(count: int, seed: int = 0) -> list[dict]:
    """Two-step arithmetic word problems with GSM8K-style answers ("#### n")."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        start, more, given = rng.randint(10, 60), rng.randint(5, 40), rng.randint(1, 9)
        question = (
            f"{name} has {start} {item}. {name} buys {more} more and then gives {given} to a friend. "
            f"How many {item} does {name} have now?"
        )
        rows.append({"question": question, "answer": f"#### {start + more - given}"})
    return rows


def overrides(data: Path, variant: str, steps: int, out_dir: Path) -> list[str]:
    return [
        "model=smollm2_135m",
        "task=dataset",
        f"task.source={data}",
        "task.answer_extractor=gsm8k",
        "task.instruction='Put the final answer after ####.'",
        "task.verifier=gsm8k_flexible",
        "task.max_new_tokens=64",
        "rollout=vllm",
        "selector=ict",
        "selector_warmup_steps=0",
        "algorithm.prompts_per_step=4",
        "algorithm.group_size=8",
        "algorithm.micro_batch_size=32",
        "algorithm.kl_coef=0",
        "algorithm.aggregation=token-mean",
        "algorithm.optimizer.lr=1e-6",
        f"total_steps={steps}",
        "logger=none",
        "checkpoint.enabled=false",
        "validation.every_n_steps=0",
        "samples.every_n_steps=0",
        "trainer.enable_progress_bar=false",
        f"paths.output_dir={out_dir}",
        *(f"fast_path.{key}={value}" for key, value in {**BASELINE, **VARIANTS[variant]}.items()),
    ]


def worker(args: argparse.Namespace) -> None:
    """One run in this process: the trainer's metrics of every step, written to `args.result`."""
    from tokenrl.run.allocator import reexec_with_tcmalloc

    reexec_with_tcmalloc()
    import lightning as L

    from tests.conftest import compose_config
    from tokenrl.run.training import build_components

    class Steps(L.Callback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            self.steps.append({key: float(value) for key, value in trainer.callback_metrics.items()})

    cfg = compose_config(overrides(args.data, args.variant, args.steps, args.result.parent / args.variant))
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    recorder = Steps()
    trainer.callbacks.append(recorder)
    trainer.fit(module, datamodule=datamodule)
    args.result.write_text(json.dumps({"allocator": machine_info()["allocator"], "steps": recorder.steps}))


def run(variant: str, data: Path, steps: int, workdir: Path) -> dict:
    """A fresh process running `variant`; its metrics averaged over the steps after the first, and its peak RSS
    (GiB)."""
    result = workdir / f"{variant}_{len(list(workdir.glob(f'{variant}_*.json')))}.json"
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "--variant",
            variant,
            "--data",
            str(data),
            "--steps",
            str(steps),
            "--result",
            str(result),
        ],
        cwd=ROOT,
    )
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"variant {variant} failed (exit status {status})")
    written = json.loads(result.read_text())
    measured = written["steps"][1:]
    mean = {key: statistics.mean(step[key] for step in measured) for key in measured[0] if key.startswith(KEPT)}
    return {
        "variant": variant,
        **mean,
        "time/trainer": mean["time/statistics"] + mean["time/update"],
        "peak_rss_gib": usage.ru_maxrss / 2**20,
        "allocator": written["allocator"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(  # the default: each shortcut alone and all of them (`all_<layout>` on request)
        "--variants",
        nargs="+",
        default=["baseline", "shared_prefix", "packed", "fused_statistics", "pack", "all"],
        choices=list(VARIANTS),
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "step.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2 (the first step warms up)")
    if "baseline" not in args.variants:
        raise SystemExit("--variants must include baseline (speed-ups are ratios to it)")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        data = workdir / "word_problems.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in word_problems(64)))
        rounds = []
        for index in range(args.rounds):
            order = args.variants if index % 2 == 0 else args.variants[::-1]
            rounds.append({variant: run(variant, data, args.steps, workdir) for variant in order})
            print(
                f"round {index + 1}: " + ", ".join(f"{v} {r['time/step']:.1f} s" for v, r in rounds[-1].items()),
                flush=True,
            )
    summary = {}
    for variant in args.variants:
        runs = [r[variant] for r in rounds]
        speedups = [r["baseline"]["time/step"] / r[variant]["time/step"] for r in rounds]
        trainer_speedups = [r["baseline"]["time/trainer"] / r[variant]["time/trainer"] for r in rounds]
        summary[variant] = {
            **{f"{phase}_s": statistics.mean(run.get(f"time/{phase}", 0.0) for run in runs) for phase in PHASES},
            "step_s": statistics.mean(run["time/step"] for run in runs),
            "trainer_s": statistics.mean(run["time/trainer"] for run in runs),
            "speedup": statistics.mean(speedups),
            "speedups": speedups,
            "trainer_speedup": statistics.mean(trainer_speedups),
            "trainer_speedups": trainer_speedups,
            "peak_rss_gib": max(run["peak_rss_gib"] for run in runs),
            "fused_statistics": runs[0].get("train/fused_statistics", 0.0),
        }
    print(
        f"{'variant':<17}" + "".join(f"{p + ' s':>13}" for p in PHASES) + f"{'step s':>9}{'speed-up':>10}"
        f"{'trainer s':>11}{'speed-up':>10}{'peak GiB':>10}"
    )
    for variant, s in summary.items():
        print(
            f"{variant:<17}" + "".join(f"{s[f'{p}_s']:>13.2f}" for p in PHASES) + f"{s['step_s']:>9.2f}"
            f"{s['speedup']:>9.2f}x{s['trainer_s']:>11.2f}{s['trainer_speedup']:>9.2f}x{s['peak_rss_gib']:>10.2f}"
        )
    import lightning
    import torch
    import transformers
    import vllm

    record = {
        "benchmark": "step",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "allocator": rounds[0]["baseline"]["allocator"]},  # the runs' own
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "lightning": lightning.__version__,
            "vllm": vllm.__version__,
        },
        "settings": {
            "rounds": args.rounds,
            "steps": args.steps,
            "overrides": overrides(Path("<word_problems.jsonl>"), "all", args.steps, Path("<tmp>")),
        },
        "summary": summary,
        "rounds": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
