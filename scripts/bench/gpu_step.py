"""One rollout step of the ICT paper's shape on a GPU: time per phase, generated and trained tokens/s, peak GPU memory
per phase and the update's MFU, for the Qwen2.5-0.5B and 1.5B architectures with random weights (`model.init=random`)
and, by default, the character tokenizer (`--tokenizer char`: no download, GPU machines are often offline; the
preamble is sized in the tokenizer's own tokens, so the step's shape does not depend on it; `--tokenizer hub` uses the
model's Hub tokenizer).

    python scripts/bench/gpu_step.py [--models qwen0.5b qwen1.5b] [--prompts 32] [--group 8] [--max-new-tokens 1024]
                                     [--prompt-tokens 160] [--steps 2] [--engine hf] [--device cuda]
                                     [--fast-path off on] [--gradient-checkpointing on|off] [--tokenizer char]
                                     [--layers N] [--override KEY=VALUE ...]

Each (model, fast path) variant runs in a process of its own, as scripts/bench/step.py does: vLLM refuses a second
engine in one process, and a process's peak memory would carry the previous variant's model. `--layers N` keeps the
architecture but only N decoder layers (a quick check of the script itself).

The step is the real module under the real Lightning Trainer (`trainer=gpu`: bf16-mixed autocast over fp32 master
weights, gradient checkpointing as the presets set it: off at 0.5B and 1.5B, on at 7B), `selector=ict` with
`warmup_steps=0` (the statistics pass computes JS), KL to a frozen reference, one mini-batch. Prompts are the arithmetic
task's questions behind a fixed GSM8K-length preamble (`--prompt-tokens` is approximate); a random model rarely stops,
so responses run to `--max-new-tokens` — the worst case of the paper's shape. `--fast-path off on` runs each model with
every `fast_path.*` shortcut off (the padded layout), then as train.yaml sets them (`layout: auto`, the device's
measured choice; `--override fast_path.layout=packed` names one) (docs/algorithms.md §12); `--gradient-checkpointing
on|off` overrides the preset (on, the update runs the padded layout: `layout_blocker`). The first `--steps − 1` steps
warm up (CUDA context, kernels, allocator); the last is reported. MFU of the update = 6 · parameters · (prompt +
response tokens of the batch) / update time / the GPU's dense bf16 peak (a table below; omitted for unknown GPUs);
attention FLOPs and the gradient-checkpointing recompute are not counted, as MFU is usually quoted. Prints a table;
writes benchmarks/gpu_step.json (GPU, driver, versions, date). `--device cpu --models tiny` is a smoke run of the
script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import lightning as L
import torch
from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from omegaconf import OmegaConf, open_dict  # noqa: E402

from tests.conftest import compose_config  # noqa: E402
from tokenrl.models import build_tokenizer  # noqa: E402
from tokenrl.records.settings import ModelSettings  # noqa: E402
from tokenrl.run.training import build_components  # noqa: E402

DENSE_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}
FAST_PATH_OFF = {"layout": "padded", "fused_statistics": "false", "pack": "false", "fused_head": "false"}
FAST_PATH_ON = {"layout": "auto", "fused_statistics": "true", "pack": "true", "fused_head": "auto"}
PREAMBLE_WORD = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "


def gpu_record() -> dict:
    if not torch.cuda.is_available():
        return {}
    driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "gpu": torch.cuda.get_device_name(),
        "gpu_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
        "driver": driver,
        "cuda": torch.version.cuda,
    }


def peak_tflops(gpu: str) -> float | None:
    return next((value for name, value in DENSE_BF16_TFLOPS.items() if name in gpu), None)


class LastStep(L.Callback):
    """The trainer's logged metrics after each rollout step, and the batch's token counts."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.steps.append({key: float(value) for key, value in trainer.callback_metrics.items()})


def run_model(name: str, args: argparse.Namespace, out_dir: Path, fast_path: str, callbacks: tuple = ()) -> dict:
    trainer = ["trainer=gpu"] if args.device == "cuda" else ["trainer=cpu"]
    cfg = compose_config(
        [
            f"model={name}",
            "model.init=random",
            "task=arithmetic",
            *([] if args.tokenizer == "hub" else ["model.tokenizer=char"]),
            *([f"model.architecture.num_hidden_layers={args.layers}"] if args.layers else []),
            f"task.max_new_tokens={args.max_new_tokens}",
            f"rollout={args.engine}",
            "rollout.max_prompt_length=4096",
            "selector=ict",
            "selector_warmup_steps=0",
            f"algorithm.prompts_per_step={args.prompts}",
            f"algorithm.group_size={args.group}",
            f"total_steps={args.steps}",
            "logger=none",
            "checkpoint.enabled=false",
            "validation.every_n_steps=0",
            "samples.every_n_steps=0",
            "trainer.enable_progress_bar=false",
            *trainer,
            *(
                f"fast_path.{key}={value}"
                for key, value in (FAST_PATH_ON if fast_path == "on" else FAST_PATH_OFF).items()
            ),
            *(
                [f"model.gradient_checkpointing={args.gradient_checkpointing == 'on'}"]
                if args.gradient_checkpointing
                else []
            ),
            *args.override,
            f"paths.output_dir={out_dir / f'{name}_{fast_path}'}",
        ]
    )
    tokenizer = build_tokenizer(ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True)))
    sentence_tokens = len(tokenizer(PREAMBLE_WORD)["input_ids"])  # in the tokenizer used
    preamble = (PREAMBLE_WORD * max(1, args.prompt_tokens // sentence_tokens)).strip()
    with open_dict(cfg):
        cfg.task.instruction = f"{preamble} Answer with the number."
    L.seed_everything(0)
    module, datamodule, fit_trainer = build_components(cfg)
    recorder = LastStep()
    fit_trainer.callbacks.extend([recorder, *callbacks])
    fit_trainer.fit(module, datamodule=datamodule)
    last = recorder.steps[-1]
    rows = args.prompts * args.group
    generated = last["train/response_len"] * rows
    trained = generated + rows * last["train/prompt_len"] if "train/prompt_len" in last else None
    params = sum(p.numel() for p in module.policy.parameters())
    result = {
        "model": name,
        "fast_path": fast_path,
        "layouts": {"no_grad": module.passes.plan.layout(False), "update": module.passes.plan.layout(True)},  # as run
        "pid": os.getpid(),
        "parameters": params,
        "rows": rows,
        "generated_tokens": generated,
        "trained_tokens": trained,
        **{key: value for key, value in last.items() if key.startswith(("time/", "memory/"))},
        "generated_tokens_per_s": generated / last["time/generate"],
    }
    if trained is not None:
        result["trained_tokens_per_s"] = trained / last["time/update"]
        peak = peak_tflops(gpu_record().get("gpu", ""))
        if peak:
            result["update_mfu"] = 6 * params * trained / last["time/update"] / (peak * 1e12)
    return result


def run_in_own_process(name: str, fast_path: str) -> dict:
    """This script with the same arguments, for one variant, in a fresh process; its result."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "variant.json"
        done = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--variant", name, fast_path, "--variant-out", str(out)]
        )
        if done.returncode:
            sys.exit(f"variant {name} (fast path {fast_path}) failed with exit status {done.returncode}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["qwen0.5b", "qwen1.5b"])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--prompt-tokens", type=int, default=160)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm_gpu"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--fast-path", nargs="+", default=["on"], choices=["off", "on"])
    parser.add_argument("--gradient-checkpointing", choices=["on", "off"], help="default: the model preset's")
    parser.add_argument("--tokenizer", default="char", choices=["char", "hub"])
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    parser.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Hydra overrides for every variant, after the script's own (e.g. fast_path.layout=packed)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "gpu_step.json")
    parser.add_argument("--variant", nargs=2, metavar=("MODEL", "FAST_PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--variant-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run this on a GPU machine (or --device cpu --models tiny for a smoke run)")
    if args.variant:  # a child process: one variant
        name, fast_path = args.variant
        args.variant_out.write_text(json.dumps(run_model(name, args, args.out.parent / "gpu_step_runs", fast_path)))
        return
    results = [run_in_own_process(name, fast_path) for name in args.models for fast_path in args.fast_path]
    phases = ("generate", "reward", "statistics", "update", "sync")
    print(
        f"{'model':<10} {'fast':>4} "
        + " ".join(f"{p + ' s':>12}" for p in phases)
        + f" {'gen tok/s':>10} {'train tok/s':>11} {'MFU':>6} "
        + " ".join(f"{p + ' GiB':>15}" for p in phases)
    )
    for r in results:
        print(
            f"{r['model']:<10} {r['fast_path']:>4} "
            + " ".join(f"{r.get(f'time/{p}', 0.0):>12.2f}" for p in phases)
            + f" {r['generated_tokens_per_s']:>10.0f} {r.get('trained_tokens_per_s', 0.0):>11.0f}"
            + f" {r.get('update_mfu', 0.0):>6.1%} "
            + " ".join(f"{r.get(f'memory/{p}_peak_gib', 0.0):>15.1f}" for p in phases)
        )
    record = {
        "benchmark": "gpu_step",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), **gpu_record()},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "lightning": L.__version__,
        },
        "settings": vars(args) | {"out": str(args.out), "variant_out": None},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
