"""The ordered GPU verification (scripts/gpu_check.sh runs it), most valuable first, in three calls that fit one
15-minute GPU window: each step in its own process, offline, results in one JSON per call (GPU, driver, versions,
date, each step's status, seconds and output tail, the benchmarks' own result files inline), rewritten after every
step so a machine taken back keeps what ran. A step whose script does not exist yet, or that needs vLLM / TRL where
they do not import, or that would not end within its call's budget, is recorded as skipped with the reason; the pass
never stops on one. Run it first whenever a GPU is at hand.

    bash scripts/gpu_check.sh --call 1|2|3 [--steps NAME ...] [--out FILE] [--logs DIR] [--bundle TAR]
    python scripts/gpu_check.py --merge FILE ... --out benchmarks/gpu_check.json      (here, after the calls)

Every call first runs `setup`: it unpacks the bundle `scripts/gpu_vllm_bundle.sh` builds
(.cache/gpu/vllm-0.26.0-bundle.tar.xz, 49 MiB: vLLM 0.26.0 for torch 2.11 / CUDA 13 without its FA2/FA3, MoE, MLA
and qutlass kernels — its Triton attention backend serves — and its other kernels for sm_90 only, plus the
pure-python packages vLLM, TRL and tokenrl need that the GPU image lacks: hydra-core, omegaconf, datasets, trl,
pydantic, msgspec, ...) into /tmp/tokenrl-gpu-site (once per machine) and puts it, src/ and the repository on every
step's PYTHONPATH.

call 1, vLLM on the GPU (budget 270 s)
  doctor_vllm     tokenrl-doctor --only vllm: greedy = trainer, the log-prob gap, the model runner in use
  vllm_follows    tests/test_gpu.py -k vllm: bf16 engine, sleep level 2 around two optimizer steps, gap after them
  engines_hf      scripts/bench/engines.py: hf decoding dynamic vs static_compiled (Qwen2.5-0.5B shape, 16 × 8,
                  ~160-token prompts, 512 new tokens; tokens/s, ms per decode step, gap to the trainer)
call 2, the step's pieces (budget 240 s)
  engines_vllm    scripts/bench/engines.py --engines vllm (rollout=vllm_gpu: CUDA graphs, bf16) at the same shape
  attention       scripts/bench/attention_layouts.py --device cuda
  lm_head         scripts/bench/lm_head.py --device cuda
  update_0.5b     scripts/bench/gpu_step.py at 0.5B: time by phase, the update's MFU (hf engine, decoding auto)
call 3, the 1.5B update and TRL beside tokenrl (budget 210 s)
  update_1.5b     scripts/bench/gpu_step.py at 1.5B
  trl_hf          scripts/bench/trl_side_by_side.py --device cuda --engine hf
  trl_vllm        scripts/bench/trl_side_by_side.py --device cuda --engine vllm (likely over the budget: next window)
call 4, the rest, in a second window (budget 540 s)
  update_0.5b_packed  update_0.5b with fast_path.layout=packed (FlexAttention): does it beat the padded layout?
  tests           tests/test_gpu.py without the vLLM test (bf16-mixed steps, FSDP on one GPU = plain, FSDP export)
  step_0.5b_vllm  scripts/bench/gpu_step.py --engine vllm_gpu at 0.5B (a real rollout step with vLLM)
  fsdp_resume     trainer=fsdp: 2 steps with a checkpoint, then a resume to step 3
  step_1.5b_ckpt  gpu_step.py at 1.5B with gradient checkpointing
  ddp_no_sync     DDP over NCCL all-reduces once per optimizer step (≥ 2 GPUs)

The device calls, verbatim (one after the other, so the machine stays warm; the bundle travels as a carried path,
built here first with `bash scripts/gpu_vllm_bundle.sh`; each call's JSON and logs come back under $OUT):

    run(command="bash scripts/gpu_check.sh --call 1 --out $OUT/gpu_check_call1.json --logs /tmp/logs1;
                 tar -czf $OUT/logs1.tgz -C /tmp logs1", carry=[".cache/gpu/vllm-0.26.0-bundle.tar.xz"], timeout_s=420)
    run(command="bash scripts/gpu_check.sh --call 2 --out $OUT/gpu_check_call2.json --logs /tmp/logs2;
                 tar -czf $OUT/logs2.tgz -C /tmp logs2", carry=[".cache/gpu/vllm-0.26.0-bundle.tar.xz"], timeout_s=390)
    run(command="bash scripts/gpu_check.sh --call 3 --out $OUT/gpu_check_call3.json --logs /tmp/logs3;
                 tar -czf $OUT/logs3.tgz -C /tmp logs3", carry=[".cache/gpu/vllm-0.26.0-bundle.tar.xz"], timeout_s=360)

(each command is one line: the line break inside the quotes is only this page's). A step's timeout is what is left of
its call's budget + 30 s, so a call ends within budget + 30 s + setup; timeout_s leaves room for the probe and tar.

then here: `python scripts/gpu_check.py --merge <files_at>/gpu_check_call*.json --out benchmarks/gpu_check.json`
and commit it (docs/measured.md and the README's GPU table quote it). A step's budget estimate is in STEPS below;
steps that were skipped for the budget run in a later window with `--steps NAME ...` (any call's).
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
SITE = Path("/tmp/tokenrl-gpu-site")
CALL_BUDGET_S = {1: 270, 2: 240, 3: 210, 4: 540}  # calls 1-3: 12 min of steps + the start ≈ a 15-minute window;
# call 4: the rest, in a second window
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
    engines = [py, "scripts/bench/engines.py", "--device", "cuda", "--repeats", "1"]
    return [
        Step(
            "doctor_vllm",
            1,
            75,
            [[py, "-m", "tokenrl.cli.doctor", "--only", "vllm", "--out", str(work / "doctor_vllm.json")]],
            needs=("vllm",),
        ),
        Step(
            "vllm_follows",
            1,
            75,
            [[py, "-m", "pytest", "-q", "-n", "0", "tests/test_gpu.py", "-k", "vllm"]],
            needs=("vllm",),
        ),
        Step(
            "engines_hf",
            1,
            120,
            [[*engines, "--engines", "hf_dynamic", "hf_static_compiled", "--out", str(work / "engines_hf.json")]],
            scripts=("scripts/bench/engines.py",),
        ),
        Step(
            "engines_vllm",
            2,
            100,
            [[*engines, "--engines", "vllm", "--out", str(work / "engines_vllm.json")]],
            needs=("vllm",),
            scripts=("scripts/bench/engines.py",),
        ),
        Step(
            "attention",
            2,
            40,
            [
                [
                    py,
                    "scripts/bench/attention_layouts.py",
                    "--device",
                    "cuda",
                    "--out",
                    str(work / "attention_layouts.json"),
                ]
            ],
            scripts=("scripts/bench/attention_layouts.py",),
        ),
        Step(
            "lm_head",
            2,
            40,
            [[py, "scripts/bench/lm_head.py", "--device", "cuda", "--out", str(work / "lm_head.json")]],
            scripts=("scripts/bench/lm_head.py",),
        ),
        Step(
            "update_0.5b",
            2,
            60,
            [[py, *GPU_STEP, "--models", "qwen0.5b", "--out", str(work / "update_0.5b.json")]],
            scripts=("scripts/bench/gpu_step.py",),
        ),
        Step(
            "update_1.5b",
            3,
            90,
            [[py, *GPU_STEP, "--models", "qwen1.5b", "--out", str(work / "update_1.5b.json")]],
            scripts=("scripts/bench/gpu_step.py",),
        ),
        *(
            Step(
                f"trl_{engine}",
                3,
                110,
                [
                    [
                        py,
                        "scripts/bench/trl_side_by_side.py",
                        "--device",
                        "cuda",
                        "--engine",
                        engine,
                        "--out",
                        str(work / f"trl_{engine}.json"),
                    ]
                ],
                needs=("trl", "vllm") if engine == "vllm" else ("trl",),
                scripts=("scripts/bench/trl_side_by_side.py",),
            )
            for engine in ("hf", "vllm")
        ),
        Step(
            "update_0.5b_packed",
            4,
            60,
            [
                [
                    py,
                    *GPU_STEP,
                    "--models",
                    "qwen0.5b",
                    "--override",
                    "fast_path.layout=packed",
                    "--out",
                    str(work / "update_0.5b_packed.json"),
                ]
            ],
            scripts=("scripts/bench/gpu_step.py",),
        ),
        Step("tests", 4, 120, [[py, "-m", "pytest", "-q", "-n", "0", "tests/test_gpu.py", "-k", "not vllm"]]),
        Step(
            "step_0.5b_vllm",
            4,
            120,
            [
                [
                    py,
                    *GPU_STEP,
                    "--models",
                    "qwen0.5b",
                    "--engine",
                    "vllm_gpu",
                    "--out",
                    str(work / "step_0.5b_vllm.json"),
                ]
            ],
            needs=("vllm",),
        ),
        Step(
            "fsdp_resume",
            4,
            90,
            [
                [py, "train.py", *tiny, "total_steps=2", f"hydra.run.dir={work / 'fsdp'}"],
                [py, "train.py", *tiny, "total_steps=3", f"ckpt_path={work / 'fsdp' / 'checkpoints' / 'last.ckpt'}"],
            ],
        ),
        Step(
            "step_1.5b_ckpt",
            4,
            120,
            [
                [
                    py,
                    *GPU_STEP,
                    "--models",
                    "qwen1.5b",
                    "--gradient-checkpointing",
                    "on",
                    "--out",
                    str(work / "step_1.5b_ckpt.json"),
                ]
            ],
        ),
        Step(
            "ddp_no_sync",
            4,
            60,
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


def step_env() -> dict[str, str]:
    """The children's environment: offline, the bundle's site, src/ and the repository on PYTHONPATH."""
    paths = [str(SITE)] if SITE.is_dir() else []
    paths += [str(ROOT / "src"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(paths)}


def setup(bundle: Path) -> dict:
    """Unpack the bundle into SITE (once per machine: a stamp records which bundle is there), then probe what imports
    in the steps' environment (a machine with its own vLLM or TRL needs no bundle)."""
    start, unpacked = time.monotonic(), None
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--call", type=int, choices=sorted(CALL_BUDGET_S), help="run this call's steps")
    parser.add_argument("--steps", nargs="+", help="run only these steps, whatever their call (no budget)")
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
            print(f"call {step.call}  {step.name:<16} ~{step.estimate_s:>3} s  needs {list(step.needs + step.scripts)}")
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
    start = time.monotonic()
    results["setup"] = setup(args.bundle)
    imports = results["setup"].get("imports", {})
    record["versions"].update({k: v for k, v in imports.items() if not str(v).startswith("absent")})
    print(f"[gpu_check] setup: {results['setup']['status']} {imports or results['setup'].get('reason')}", flush=True)
    budget = args.budget or (CALL_BUDGET_S[args.call] if args.call and not args.steps else LIMIT_S)
    for step in steps(gpus, work):
        if (args.steps and step.name not in args.steps) or (not args.steps and step.call != args.call):
            continue
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
