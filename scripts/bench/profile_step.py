"""A torch profile of one rollout step (the last of `--steps`) at the ICT paper's shape, summarised: each phase's
wall time and the share of it the GPU was busy (the rest is launch overhead, host work and syncs), the host syncs in
each phase, each phase's peak memory, and the kernels (on a CPU: the operators) that take the time. The next change to
the step is chosen from this table (issue #47), not from CPU timings.

    python scripts/bench/profile_step.py [--models qwen0.5b] [--prompts 16] [--group 8] [--max-new-tokens 512]
        [--prompt-tokens 160] [--steps 2] [--engine hf] [--device cuda] [--layers N] [--override K=V ...]
        [--trace FILE] [--out FILE]

The step is scripts/bench/gpu_step.py's (random weights, character tokenizer, `selector=ict`, the fast path as
train.yaml sets it), in a process of its own per model; the profiler records the last step only, from the start of
`training_step` to the end of its batch (the phases `utils.StepTimer` marks as `phase/<name>` ranges). GPU busy =
the union of the kernels' and copies' intervals within a phase over its wall time. A host sync is a
`cudaStreamSynchronize` / `cudaDeviceSynchronize` / `cudaEventSynchronize` call or an `aten::_local_scalar_dense`
(`.item()`, which waits for the device). `--trace FILE` also writes the Chrome trace. `--device cpu --models tiny` is a
smoke run. Writes benchmarks/profile_step.json (machine, versions, date).
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

import lightning as L
import torch
from gpu_step import gpu_record, run_model
from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::_local_scalar_dense")
TOP = 15


class ProfileLastStep(L.Callback):
    """Profiles the `last`-th rollout step (counted from 1): from its batch's start to its end."""

    def __init__(self, last: int, device: str) -> None:
        self.last, self.seen, self.profile = last, 0, None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.activities = activities

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.seen += 1
        if self.seen == self.last:
            self.profile = torch.profiler.profile(activities=self.activities)
            self.profile.__enter__()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self.seen == self.last and self.profile is not None:
            self.profile.__exit__(None, None, None)


def busy_us(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Microseconds of [start, end] covered by the union of `intervals` (each clipped to it)."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end)
    covered, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered


def summary(profile: torch.profiler.profile, device: str) -> dict:
    """Phases (wall, GPU busy share, host syncs) and the top kernels or operators of a finished profile."""
    events = profile.events()
    on_device = [
        (event.time_range.start, event.time_range.end)
        for event in events
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    syncs = [event.time_range.start for event in events if event.name in SYNCS]
    ranges: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        if event.name.startswith("phase/"):
            ranges.setdefault(event.name.removeprefix("phase/"), []).append(
                (event.time_range.start, event.time_range.end)
            )
    phases = {}
    for name, spans in ranges.items():  # a phase's ranges merged: a nested range of the same name counts once
        merged: list[list[float]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        phases[name] = {
            "wall_s": sum(end - start for start, end in merged) / 1e6,
            "busy_s": sum(busy_us(on_device, start, end) for start, end in merged) / 1e6,
            "syncs": sum(any(start <= t < end for start, end in merged) for t in syncs),
        }
    for phase in phases.values():
        phase["gpu_busy"] = phase["busy_s"] / phase["wall_s"] if device == "cuda" and phase["wall_s"] else None
    averages = profile.key_averages()
    if device == "cuda":
        timed = [(e.key, e.count, e.self_device_time_total) for e in averages if e.self_device_time_total > 0]
    else:  # the operators (the phases' own ranges are markers, not work)
        timed = [
            (e.key, e.count, e.self_cpu_time_total)
            for e in averages
            if e.self_cpu_time_total > 0 and not e.key.startswith("phase/")
        ]
    total = sum(us for _, _, us in timed) or 1.0
    top = sorted(timed, key=lambda row: -row[2])[:TOP]
    return {
        "phases": phases,
        "top": [{"name": name, "calls": calls, "ms": us / 1e3, "share": us / total} for name, calls, us in top],
        "timed_by": "self device time" if device == "cuda" else "self CPU time",
    }


def profile_model(name: str, args: argparse.Namespace) -> dict:
    """One model's step, profiled (in this process)."""
    recorder = ProfileLastStep(args.steps, args.device)
    with tempfile.TemporaryDirectory() as folder:
        step = run_model(name, args, Path(folder), "on", callbacks=(recorder,))
    if args.trace:
        recorder.profile.export_chrome_trace(str(args.trace.with_name(f"{args.trace.stem}_{name}.json")))
    peaks = {key.removeprefix("memory/").removesuffix("_peak_gib"): v for key, v in step.items() if "peak_gib" in key}
    found = summary(recorder.profile, args.device)
    for phase, record in found["phases"].items():
        record["peak_gib"] = peaks.get(phase)
    return {"model": name, "step": step, **found}


def table(result: dict) -> str:
    lines = [
        f"{result['model']}: phases of the profiled step",
        f"{'phase':<12} {'wall s':>8} {'GPU busy':>9} {'syncs':>6} {'peak GiB':>9}",
    ]
    for phase, r in result["phases"].items():
        busy = f"{r['gpu_busy']:.0%}" if r["gpu_busy"] is not None else "-"
        peak = f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else "-"
        lines.append(f"{phase:<12} {r['wall_s']:>8.2f} {busy:>9} {r['syncs']:>6} {peak:>9}")
    lines += ["", f"top {TOP} by {result['timed_by']}", f"{'share':>6} {'ms':>9} {'calls':>7}  name"]
    lines += [f"{r['share']:>6.1%} {r['ms']:>9.1f} {r['calls']:>7}  {r['name'][:90]}" for r in result["top"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["qwen0.5b"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--prompt-tokens", type=int, default=160)
    parser.add_argument("--steps", type=int, default=2, help="the last one is profiled; the others warm up")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm_gpu"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    parser.add_argument("--override", nargs="+", default=[], metavar="KEY=VALUE", help="Hydra overrides")
    parser.add_argument("--trace", type=Path, help="also write the Chrome trace (FILE_<model>.json)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "profile_step.json")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--variant-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.tokenizer, args.gradient_checkpointing = "char", None  # gpu_step.run_model's settings
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run this on a GPU machine (or --device cpu --models tiny for a smoke run)")
    if args.variant:  # a child process: one model
        args.variant_out.write_text(json.dumps(profile_model(args.variant, args)))
        return
    results = []
    for name in args.models:  # each in a fresh process: a process's peak memory would carry the previous model
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "variant.json"
            done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", name, "--variant-out", out])
            if done.returncode:
                sys.exit(f"{name} failed with exit status {done.returncode}")
            results.append(json.loads(out.read_text()))
    for result in results:
        print(table(result), end="\n\n")
    record = {
        "benchmark": "profile_step",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), **gpu_record()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "lightning": L.__version__},
        "settings": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
