"""The ordered GPU verification (scripts/gpu_check.sh runs it), most valuable first, in calls that fit one 15-minute GPU
window: each step in its own process, offline, results in one JSON per call (GPU, driver, versions, date, each step's
status, seconds and output tail, the benchmarks' own result files inline), rewritten after every step so a machine
taken back keeps what ran. A step whose script does not exist yet, or that needs vLLM / TRL where they do not import,
or that would not end within what is left of its call's budget (the clock starts with the process: the probe and the
setup count), is recorded as skipped with the reason; the pass never stops on one. Run it first whenever a GPU is at
hand.

    bash scripts/gpu_check.sh --call 1|2|3|4 [--out FILE] [--logs DIR] [--bundle TAR]
    bash scripts/gpu_check.sh --steps NAME ... (in the order given, whatever their call; 600 s at most)
    python scripts/gpu_check.py --merge FILE ... --out benchmarks/gpu_check.json      (here, after the calls)
    python scripts/gpu_check.py --list                                                (the plan, no GPU)

Every call first runs `setup`: it unpacks the bundle `scripts/gpu_vllm_bundle.sh` builds (.cache/gpu/vllm-0.26.0-
bundle.tar.xz: vLLM 0.26.0 for torch 2.11 / CUDA 13 on its Triton attention backend, kernels for sm_90 only, and the
pure-python packages vLLM, TRL and tokenrl need that the GPU image lacks) into /tmp/tokenrl-gpu-site (once per
machine) and puts it, src/ and the repository on every step's PYTHONPATH; and the GSM8K files (.cache/gpu/gsm8k.tar.xz,
`gpu_vllm_bundle.sh --data DIR`) into TOKENRL_DATA_DIR, for the headline's task. Prove the bundle on CPU first:
`bash scripts/gpu_vllm_bundle.sh --check`.

call 1, the smoke (budget 150 s: a break found here leaves the window's time to fix it on CPU and rerun)
  doctor_vllm     tokenrl-doctor --only vllm: greedy = trainer, the log-prob gap, the model runner in use
call 2, vLLM in the step (budget 370 s)
  vllm_follows    tests/test_gpu.py -k vllm: bf16 engine, sleep level 2 around two optimizer steps, gap after them
  step_0.5b_vllm  scripts/bench/gpu_step.py --engine vllm_gpu at the Qwen2.5-0.5B shape (random weights, character
                  tokenizer; 16 prompts x 8, 512 new tokens): time by phase, peak memory
  step_1.5b_vllm  the same at 1.5B
call 3, the headline, then the step at the hardware's speed (budget 200 s)
  headline        python train.py selector=ict model=qwen1.5b --cfg job, then 2 steps of it (model.init=random
                  model.tokenizer=char, validation off)
  profile_0.5b    scripts/bench/profile_step.py: a torch profiler summary of one update and one generation step
  update_0.5b     gpu_step.py at 0.5B, hf engine: time by phase, the update's MFU
  trl_hf          scripts/bench/trl_side_by_side.py --device cuda --engine hf
call 4, the rest, in the next window (budget 540 s)
  update_1.5b, trl_vllm, engines_hf, engines_vllm, attention, lm_head, update_0.5b_packed, tests (test_gpu.py but
  vLLM's), fsdp_resume, step_1.5b_ckpt (gradient checkpointing), ddp_no_sync (>= 2 GPUs)

A step's budget reservation is its last measured seconds (ESTIMATE_S, overridden by the newest passed run in
benchmarks/gpu_check.json). The device calls, verbatim (one after the other, so the machine stays warm; each call's
JSON and logs come back under $OUT):

    run(command="bash scripts/gpu_check.sh --call 1 --out $OUT/gpu_check_call1.json --logs /tmp/logs1;
                 tar -czf $OUT/logs1.tgz -C /tmp logs1",
        carry=[".cache/gpu/vllm-0.26.0-bundle.tar.xz", ".cache/gpu/gsm8k.tar.xz"], timeout_s=240)
    run(... --call 2 ... gpu_check_call2.json ... logs2 ..., timeout_s=450)
    run(... --call 3 ... gpu_check_call3.json ... logs3 ..., timeout_s=280)

(each command is one line: the line break inside the quotes is only this page's). A step's timeout is what is left of
its call's budget + 30 s; timeout_s leaves room for the machine's transfer and tar. Then here:
`python scripts/gpu_check.py --merge <files_at>/gpu_check_call*.json --out benchmarks/gpu_check.json`, and commit it
(docs/measured.md and the README's GPU table quote it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 600  # one step at most (a device call is 10 minutes)
BUNDLE = ROOT / ".cache" / "gpu" / "vllm-0.26.0-bundle.tar.xz"
GSM8K = ROOT / ".cache" / "gpu" / "gsm8k.tar.xz"
SITE = Path("/tmp/tokenrl-gpu-site")
DATA = Path("/tmp/tokenrl-gpu-data")  # GSM8K (.cache/gpu/gsm8k.tar.xz), unpacked by setup: the headline's task
CALL_BUDGET_S = {1: 150, 2: 370, 3: 200, 4: 540}  # each call's setup and steps; call 1 is the smoke (≤ 3 min with the
# probe); calls 1-3: 12 min + the machine's start ≈ a 15-minute window; call 4: the rest, in a second window
SETUP_S = 25  # the first call's setup, unpacking the bundle: 14-24 s on the H200 (2026-11-28); later ones probe only
# A step's budget reservation: its last measured seconds where one exists (the newest passed run in
# benchmarks/gpu_check.json overrides these), else a guess from its nearest measured relative (marked "guess").
ESTIMATE_S = {
    "doctor_vllm": 75,  # guess: the doctor's hf row took 30 s (2026-11-26); vLLM's start and CUDA graphs on top
    "vllm_follows": 75,  # guess
    "step_0.5b_vllm": 120,  # guess: update_0.5b's 116 s with vLLM's start in place of hf's slower generation
    "step_1.5b_vllm": 150,  # guess
    "headline": 150,  # guess: composing (~10 s) and 2 steps at 1.5B with vLLM
    "profile_0.5b": 60,  # guess
    "update_0.5b": 117,  # measured 116.3 s (H200, 2026-11-28, the hf engine: docs/measured.md)
    "trl_hf": 150,  # its target (issue #47): it did not end within 157 s on 2026-11-28
    "update_1.5b": 200,  # guess: update_0.5b scaled
    "trl_vllm": 150,  # guess
    "engines_hf": 120,
    "engines_vllm": 100,
    "attention": 40,
    "lm_head": 40,
    "update_0.5b_packed": 117,
    "tests": 120,
    "fsdp_resume": 90,
    "step_1.5b_ckpt": 200,
    "ddp_no_sync": 60,
}
GPU_STEP = ["scripts/bench/gpu_step.py", "--prompts", "16", "--max-new-tokens", "512", "--steps", "2"]
ENV = {  # every step: offline, no FlashInfer sampler (not in the bundle)
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass
class Step:
    name: str
    call: int
    estimate_s: int  # what the budget reserves for it (a first run's guess; the JSON records the real seconds)
    commands: list[list[str]]
    needs: tuple[str, ...] = ()  # modules that must import (vllm, trl)
    scripts: tuple[str, ...] = ()  # files that must exist (benchmarks written by others)
    skip: str | None = None  # why this machine cannot run it
    outputs: list[str] = field(default_factory=list)


def steps(gpus: int, work: Path) -> list[Step]:
    """Every step, in order of value."""
    py = sys.executable
    tiny = [
        "debug=default",
        "trainer=fsdp",
        f"trainer.devices={gpus}",
        "checkpoint.enabled=true",
        "checkpoint.every_n_steps=1",
        "validation.every_n_steps=0",
    ]
    headline = [py, "train.py", "selector=ict", "model=qwen1.5b"]
    engines = [py, "scripts/bench/engines.py", "--device", "cuda", "--repeats", "1"]

    def bench(name: str, call: int, script: str, *args: str, needs: tuple[str, ...] = ()) -> Step:
        """A benchmark script's step, writing `name`.json into the work folder."""
        command = [py, script, *args, "--out", str(work / f"{name}.json")]
        return Step(name, call, ESTIMATE_S[name], [command], needs=needs, scripts=(script,))

    def gpu_step(name: str, call: int, model: str, *args: str, needs: tuple[str, ...] = ()) -> Step:
        return bench(name, call, "scripts/bench/gpu_step.py", *GPU_STEP[1:], "--models", model, *args, needs=needs)

    return [
        Step(
            "doctor_vllm",
            1,
            ESTIMATE_S["doctor_vllm"],
            [[py, "-m", "tokenrl.cli.doctor", "--only", "vllm", "--out", str(work / "doctor_vllm.json")]],
            needs=("vllm",),
        ),
        Step(
            "vllm_follows",
            2,
            ESTIMATE_S["vllm_follows"],
            [[py, "-m", "pytest", "-q", "-n", "0", "tests/test_gpu.py", "-k", "vllm"]],
            needs=("vllm",),
        ),
        gpu_step("step_0.5b_vllm", 2, "qwen0.5b", "--engine", "vllm_gpu", needs=("vllm",)),
        gpu_step("step_1.5b_vllm", 2, "qwen1.5b", "--engine", "vllm_gpu", needs=("vllm",)),
        Step(  # the README's headline as a user types it: composed for this machine, then 2 steps of it
            "headline",
            3,
            ESTIMATE_S["headline"],
            [
                [*headline, "--cfg", "job"],
                [
                    *headline,
                    "model.init=random",
                    "model.tokenizer=char",
                    "total_steps=2",
                    "validation.every_n_steps=0",
                    f"hydra.run.dir={work / 'headline'}",
                ],
            ],
            needs=("vllm",),
            skip=None if (DATA / "gsm8k").is_dir() else f"no GSM8K files at {DATA} (gpu_vllm_bundle.sh --data DIR)",
        ),
        bench("profile_0.5b", 3, "scripts/bench/profile_step.py", "--models", "qwen0.5b"),
        gpu_step("update_0.5b", 3, "qwen0.5b"),
        bench("trl_hf", 3, "scripts/bench/trl_side_by_side.py", "--device", "cuda", "--engine", "hf", needs=("trl",)),
        gpu_step("update_1.5b", 4, "qwen1.5b"),
        bench(
            "trl_vllm",
            4,
            "scripts/bench/trl_side_by_side.py",
            "--device",
            "cuda",
            "--engine",
            "vllm",
            needs=("trl", "vllm"),
        ),
        bench(
            "engines_hf", 4, "scripts/bench/engines.py", *engines[2:], "--engines", "hf_dynamic", "hf_static_compiled"
        ),
        bench("engines_vllm", 4, "scripts/bench/engines.py", *engines[2:], "--engines", "vllm", needs=("vllm",)),
        bench("attention", 4, "scripts/bench/attention_layouts.py", "--device", "cuda"),
        bench("lm_head", 4, "scripts/bench/lm_head.py", "--device", "cuda", "--liger"),
        gpu_step("update_0.5b_packed", 4, "qwen0.5b", "--override", "fast_path.layout=packed"),
        Step(
            "tests",
            4,
            ESTIMATE_S["tests"],
            [[py, "-m", "pytest", "-q", "-n", "0", "tests/test_gpu.py", "-k", "not vllm"]],
        ),
        Step(
            "fsdp_resume",
            4,
            ESTIMATE_S["fsdp_resume"],
            [
                [py, "train.py", *tiny, "total_steps=2", f"hydra.run.dir={work / 'fsdp'}"],
                [py, "train.py", *tiny, "total_steps=3", f"ckpt_path={work / 'fsdp' / 'checkpoints' / 'last.ckpt'}"],
            ],
        ),
        gpu_step("step_1.5b_ckpt", 4, "qwen1.5b", "--gradient-checkpointing", "on"),
        Step(
            "ddp_no_sync",
            4,
            ESTIMATE_S["ddp_no_sync"],
            [
                [
                    "env",
                    "DDP_STEP_ACCELERATOR=gpu",
                    py,
                    "-m",
                    "pytest",
                    "-q",
                    "tests/step/test_distributed.py",
                    "-k",
                    "all_reduces_once",
                ]
            ],
            skip=None if gpus >= 2 else "needs 2 GPUs",
        ),
    ]


def measured_estimates(record: Path) -> dict[str, int]:
    """ESTIMATE_S with each step's seconds from its newest passed run in `record` (benchmarks/gpu_check.json)."""
    estimates = dict(ESTIMATE_S)
    if not record.is_file():
        return estimates
    data = json.loads(record.read_text())
    runs = sorted(data.get("runs", []), key=lambda run: run.get("date", ""))
    for found in [run.get("steps", {}) for run in runs] + [data.get("steps", {})]:
        for name, result in found.items() if isinstance(found, dict) else ():
            if name in estimates and result.get("status") == "passed" and result.get("seconds"):
                estimates[name] = round(result["seconds"])
    return estimates


def chosen(plan: list[Step], call: int | None, names: list[str] | None) -> list[Step]:
    """The steps to run: `names` in the order given (an unknown name is an error), else the call's in order of value;
    each with its estimate from the last measured run."""
    estimates = measured_estimates(ROOT / "benchmarks" / "gpu_check.json")
    by_name = {step.name: step for step in plan}
    unknown = [name for name in names or () if name not in by_name]
    if unknown:
        raise SystemExit(f"gpu_check: no step {', '.join(unknown)} (the steps: {', '.join(by_name)})")
    picked = [by_name[name] for name in names] if names else [step for step in plan if step.call == call]
    for step in picked:
        step.estimate_s = estimates.get(step.name, step.estimate_s)
    return picked


def step_env() -> dict[str, str]:
    """The children's environment: offline, the bundle's site, src/ and the repository on PYTHONPATH."""
    paths = [str(SITE)] if SITE.is_dir() else []
    paths += [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    data = {"TOKENRL_DATA_DIR": str(DATA)} if DATA.is_dir() else {}
    return {**os.environ, **ENV, **data, "PYTHONPATH": os.pathsep.join(paths)}


def setup(bundle: Path, data: Path) -> dict:
    """Unpack the bundle into SITE (once per machine: a stamp records which bundle is there) and the GSM8K files into
    DATA, then probe what imports in the steps' environment (a machine with its own vLLM or TRL needs no bundle)."""
    start, unpacked = time.monotonic(), None
    if data.is_file() and not DATA.is_dir():
        DATA.mkdir(parents=True)
        subprocess.run(["tar", "-xJf", str(data), "-C", str(DATA)], check=False)
    if bundle.is_file():
        stamp = SITE / ".bundle"
        mark = f"{bundle.name} {bundle.stat().st_size}"
        unpacked = "already there"
        if not (stamp.is_file() and stamp.read_text() == mark):
            shutil.rmtree(SITE, ignore_errors=True)
            SITE.mkdir(parents=True)
            done = subprocess.run(["tar", "-xJf", str(bundle), "-C", str(SITE)], capture_output=True, text=True)
            if done.returncode:
                shutil.rmtree(SITE, ignore_errors=True)
                return {"status": "failed", "reason": f"tar: {done.stderr[-500:]}"}
            stamp.write_text(mark)
            unpacked = f"unpacked in {time.monotonic() - start:.1f} s"
    probe = (
        "import importlib, json\nout = {}\n"
        "for name in ('vllm', 'trl', 'hydra', 'omegaconf', 'datasets', 'math_verify', 'transformers', 'torch'):\n"
        "    try:\n        out[name] = getattr(importlib.import_module(name), '__version__', 'imported')\n"
        "    except Exception as error:\n        out[name] = 'absent: ' + repr(error)[:200]\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=step_env(), capture_output=True, text=True, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    versions = json.loads(lines[-1]) if done.returncode == 0 and lines else {"probe": done.stderr[-500:]}
    return {
        "status": "passed",
        "seconds": round(time.monotonic() - start, 1),
        "bundle": unpacked or f"no bundle at {bundle}",
        "site": str(SITE),
        "imports": versions,
    }


def missing(step: Step, imports: dict[str, str]) -> str | None:
    """Why `step` cannot run here, or None."""
    if step.skip:
        return step.skip
    for script in step.scripts:
        if not (ROOT / script).is_file():
            return f"{script} does not exist yet"
    for module in step.needs:
        found = str(imports.get(module, "absent: not probed"))
        if found.startswith("absent"):
            return f"{module} does not import ({found})"
    return None


def run_step(commands: list[list[str]], log: Path | None, limit: float) -> dict:
    """Run a step's commands in order, stopping at the first failure; each command's whole output is appended to
    `log` when given."""
    start, tails = time.monotonic(), []
    for command in commands:
        left = limit - (time.monotonic() - start)
        try:
            done = subprocess.run(
                command, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, left), env=step_env()
            )
        except subprocess.TimeoutExpired as error:
            if log is not None:
                with log.open("a") as out:
                    out.write(f"$ {' '.join(command)}\n{error.stdout or ''}{error.stderr or ''}\n[timed out]\n")
            return {
                "status": "failed",
                "seconds": round(time.monotonic() - start, 1),
                "reason": f"over {limit:.0f} s: {' '.join(command)}",
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


def merge(files: list[Path], out: Path) -> int:
    """The calls' JSON files as one record: machine and versions of the first, every call's steps and benchmarks."""
    records = [json.loads(path.read_text()) for path in files]
    merged = {
        "check": "gpu_check",
        "date": records[0]["date"],
        "machine": records[0]["machine"],
        "versions": records[0]["versions"],
        "steps": {},
        "benchmarks": {},
        "runs": [],
    }
    for record in records:
        merged["steps"].update(record["steps"])
        merged["benchmarks"].update(record["benchmarks"])
        merged["runs"].append({"call": record.get("call"), "date": record["date"], "steps": list(record["steps"])})
    out.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"[gpu_check] merged {len(files)} calls into {out}")
    return 0


def main() -> int:
    start = time.monotonic()  # a call's budget counts from here: the probe, setup and every step
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--call", type=int, choices=sorted(CALL_BUDGET_S), help="run this call's steps")
    parser.add_argument("--steps", nargs="+", help="run only these steps, in this order, whatever their call")
    parser.add_argument("--budget", type=float, help="seconds for this call's steps (default: the call's)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpu_check.json")
    parser.add_argument("--logs", type=Path, help="write each step's whole output to LOGS/<step>.log")
    parser.add_argument("--bundle", type=Path, default=BUNDLE)
    parser.add_argument("--merge", nargs="+", type=Path, help="merge these calls' JSON files into --out (no GPU)")
    parser.add_argument("--list", action="store_true", help="print the steps by call and exit (no GPU)")
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    if args.list:
        for step in steps(1, Path("WORK")):
            estimate = measured_estimates(ROOT / "benchmarks" / "gpu_check.json")[step.name]
            print(f"call {step.call}  {step.name:<18} ~{estimate:>3} s  needs {list(step.needs + step.scripts)}")
        return 0
    if not args.call and not args.steps:
        parser.error("name --call 1|2|3 or --steps")
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
        "call": args.call,
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    results["setup"] = setup(args.bundle, GSM8K)
    imports = results["setup"].get("imports", {})
    record["versions"].update({k: v for k, v in imports.items() if not str(v).startswith("absent")})
    print(f"[gpu_check] setup: {results['setup']['status']} {imports or results['setup'].get('reason')}", flush=True)
    budget = args.budget or (CALL_BUDGET_S[args.call] if args.call and not args.steps else LIMIT_S)
    for step in chosen(steps(gpus, work), args.call, args.steps):
        left = budget - (time.monotonic() - start)
        reason = missing(step, imports)
        if reason is None and left < step.estimate_s:
            reason = f"call budget: {left:.0f} s left of {budget:.0f}, the step needs ~{step.estimate_s} s"
        print(f"[gpu_check] {step.name} ...", flush=True)
        if reason:
            results[step.name] = {"status": "skipped", "reason": reason}
        else:
            log = args.logs / f"{step.name}.log" if args.logs else None
            results[step.name] = run_step(step.commands, log, min(LIMIT_S, left + 30))
        result = results[step.name]
        print(f"[gpu_check] {step.name}: {result['status']} ({result.get('seconds', 0)} s)", flush=True)
        if result["status"] != "passed":
            print(result.get("output_tail", result.get("reason")), flush=True)
        record["benchmarks"] = {path.name: json.loads(path.read_text()) for path in work.glob("*.json")}
        args.out.write_text(json.dumps(record, indent=2) + "\n")  # after every step: a machine taken back keeps it
    shutil.rmtree(work, ignore_errors=True)
    failed = [name for name, result in results.items() if result["status"] == "failed"]
    print(f"[gpu_check] {'FAILED: ' + ', '.join(failed) if failed else 'no step failed'}; wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
