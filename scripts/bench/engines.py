"""Generation speed of the rollout engines at one shape: the hf engine decoding with transformers' dynamic KV cache
(`rollout.decoding=dynamic`, today's GPU path), with a static cache (`static`) and with the static cache's decode
step compiled into a CUDA graph (`static_compiled`, what `auto` picks on a GPU), and vLLM (`rollout=vllm_gpu` on a
GPU) where it imports. Each engine runs in a fresh process (vLLM refuses a second engine in one process; a compiled
decode would stay compiled): one warm-up call (compilation, CUDA graph capture, vLLM's start are its time, reported
as `first_call_s`), then `--repeats` timed calls with other seeds. Generated tokens/s = the responses' tokens (to
EOS or `--max-new-tokens`; a random model rarely stops) / the call's time; `ms_per_decode_step` = the call's time /
its longest response. Each engine's sampled log-probs are compared with the trainer's (`response_logprobs`, the
same fp32 model): `logprob_gap_max` / `_mean` over response tokens, the gap the trainer logs as
`train/logprob_gap_*`.

    python scripts/bench/engines.py [--device cpu|cuda] [--engines hf_dynamic hf_static hf_static_compiled vllm]
                                    [--model qwen0.5b] [--layers N] [--prompts 16] [--group 8]
                                    [--prompt-tokens 160] [--max-new-tokens 512] [--repeats 2]
                                    [--out benchmarks/engines.json]

Defaults by device. cuda: the Qwen2.5-0.5B architecture with random weights and the character tokenizer (offline,
as scripts/bench/gpu_step.py), fp32 weights as the trainer holds them (the engine generates with autocast off),
16 prompts × 8, ~160-token prompts (ragged: left padding), 512 new tokens, all four engines (vLLM skipped, with the
reason, where it does not import). cpu: the tiny model (`model=tiny`: 2 layers, vocabulary 128), 4 prompts × 4,
~48-token prompts, 64 new tokens, hf_dynamic and hf_static (compiling on a CPU takes minutes and gains nothing:
compile is GPU-only here; name hf_static_compiled to try it). Prints a table; writes the results with the machine,
versions and date (scripts/bench/machine.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from omegaconf import OmegaConf  # noqa: E402

from tests.conftest import compose_config  # noqa: E402

ENGINES = ("hf_dynamic", "hf_static", "hf_static_compiled", "vllm")
DEFAULTS = {
    "cuda": {"model": "qwen0.5b", "prompts": 16, "group": 8, "prompt_tokens": 160, "max_new_tokens": 512},
    "cpu": {"model": "tiny", "prompts": 4, "group": 4, "prompt_tokens": 48, "max_new_tokens": 64},
}
SENTENCE = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "


def prompts(tokenizer, count: int, tokens: int) -> list[list[int]]:
    """`count` prompts of about `tokens` tokens, each a few tokens longer than the last (ragged: left padding)."""
    base = SENTENCE * (1 + tokens // len(tokenizer(SENTENCE)["input_ids"]))
    ids = tokenizer(base)["input_ids"][: max(1, tokens - count)]
    return [ids + tokenizer(f" Question {i}: what is {i} + {2 * i}?")["input_ids"][: i + 1] for i in range(count)]


def vllm_missing() -> str | None:
    try:
        import vllm  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means: no vLLM here
        return f"vllm does not import: {error!r}"[:300]
    return None


def run_engine(name: str, args: argparse.Namespace) -> dict:
    """One engine's warm-up and timed calls, in this process."""
    from tokenrl.models import build_model, build_tokenizer
    from tokenrl.models.response_forward import response_logprobs
    from tokenrl.records.settings import ModelSettings, RolloutSettings
    from tokenrl.rollout import build_engine
    from tokenrl.rollout.engine import SamplingParams
    from tokenrl.rollout.hf import HFEngine

    overrides = [f"model={args.model}", "model.init=random", "model.tokenizer=char"]
    if args.layers:
        overrides.append(f"model.architecture.num_hidden_layers={args.layers}")
    max_len = args.prompt_tokens + args.max_new_tokens + 64
    if name == "vllm":
        rollout = ["rollout=vllm_gpu" if args.device == "cuda" else "rollout=vllm", f"rollout.max_model_len={max_len}"]
        overrides += rollout + ([] if args.device == "cuda" else ["rollout.dtype=float32"])
    cfg = compose_config(overrides)
    settings = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(settings, seed=0).to(device)
    tokenizer = build_tokenizer(settings)
    if name == "vllm":
        engine = build_engine(RolloutSettings.of(OmegaConf.to_container(cfg.rollout, resolve=True)), model, tokenizer)
    else:
        engine = HFEngine(model, tokenizer, decoding=name.removeprefix("hf_"))
    batch_prompts = prompts(tokenizer, args.prompts, args.prompt_tokens)
    params = SamplingParams(n=args.group, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens)

    def timed(seed: int):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        batch = engine.generate(batch_prompts, params, seed=seed)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return batch, time.perf_counter() - start

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _, first = timed(0)
    calls = [timed(seed) for seed in range(1, args.repeats + 1)]
    batch, seconds = min(calls, key=lambda call: call[1])
    generated = int(batch.response_mask.sum())
    with torch.no_grad():
        trainer = response_logprobs(model, batch, 1.0).float().cpu()
    mask = batch.response_mask.bool()
    gap = (batch.sampling_logprobs - trainer)[mask].abs()
    result = {
        "engine": name,
        "decoding": engine.decoding_on(device) if name != "vllm" else "vllm",
        "first_call_s": round(first, 3),
        "seconds": round(seconds, 3),
        "seconds_all": [round(s, 3) for _, s in calls],
        "rows": batch.response_ids.shape[0],
        "prompt_tokens_max": int(batch.prompt_mask.sum(1).max()),
        "generated_tokens": generated,
        "longest_response": int(batch.response_mask.sum(1).max()),
        "generated_tokens_per_s": round(generated / seconds, 1),
        "ms_per_decode_step": round(1000 * seconds / max(1, int(batch.response_mask.sum(1).max())), 3),
        "logprob_gap_max": float(gap.max()),
        "logprob_gap_mean": float(gap.mean()),
        "stop_reasons": {reason: batch.finish_reasons.count(reason) for reason in set(batch.finish_reasons)},
    }
    if device.type == "cuda":
        result["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if hasattr(engine, "close"):
        engine.close()
    return result


def run_in_own_process(name: str) -> dict:
    """This script with the same arguments for one engine, in a fresh process; its result (or why it failed)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "engine.json"
        done = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--variant", name, "--variant-out", str(out)],
            capture_output=True,
            text=True,
        )
        if done.returncode or not out.exists():
            tail = (done.stdout + done.stderr)[-2000:]
            print(tail, file=sys.stderr)
            return {"engine": name, "status": "failed", "exit_status": done.returncode, "output_tail": tail}
        return {"status": "passed", **json.loads(out.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--engines", nargs="+", choices=ENGINES, help="default: all on cuda, hf_dynamic hf_static on cpu"
    )
    parser.add_argument(
        "--model", help="a configs/model preset, random weights (default: qwen0.5b on cuda, tiny on cpu)"
    )
    parser.add_argument("--layers", type=int, help="decoder layers (default: the model's)")
    parser.add_argument("--prompts", type=int)
    parser.add_argument("--group", type=int)
    parser.add_argument("--prompt-tokens", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls after the warm-up (the fastest reported)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "engines.json")
    parser.add_argument("--variant", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--variant-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for key, value in DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run this on a GPU machine (or --device cpu)")
    if args.variant:  # a child process: one engine
        args.variant_out.write_text(json.dumps(run_engine(args.variant, args)))
        return
    names = args.engines or (list(ENGINES) if args.device == "cuda" else ["hf_dynamic", "hf_static"])
    results = []
    for name in names:
        missing = vllm_missing() if name == "vllm" else None
        result = {"engine": name, "status": "skipped", "reason": missing} if missing else run_in_own_process(name)
        results.append(result)
        print(f"[engines] {name}: {result['status']}", flush=True)
    base = next((r for r in results if r["engine"] == "hf_dynamic" and r["status"] == "passed"), None)
    print(
        f"{'engine':<20} {'status':<8} {'gen tok/s':>10} {'× dynamic':>9} {'ms/step':>8} {'call s':>7} "
        f"{'first s':>8} {'gap max':>9} {'GPU GiB':>8}"
    )
    for r in results:
        if r["status"] != "passed":
            print(f"{r['engine']:<20} {r['status']:<8} {r.get('reason') or r.get('output_tail', '')[-80:]!s}")
            continue
        if base:
            r["speedup_vs_hf_dynamic"] = round(r["generated_tokens_per_s"] / base["generated_tokens_per_s"], 2)
        print(
            f"{r['engine']:<20} {r['status']:<8} {r['generated_tokens_per_s']:>10.0f} "
            f"{r.get('speedup_vs_hf_dynamic', 0):>8.2f}× {r['ms_per_decode_step']:>8.2f} {r['seconds']:>7.2f} "
            f"{r['first_call_s']:>8.2f} {r['logprob_gap_max']:>9.2e} {r.get('peak_gpu_memory_gib', 0):>8.2f}"
        )
    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    try:
        import vllm

        versions["vllm"] = vllm.__version__
    except Exception:  # noqa: BLE001
        versions["vllm"] = None
    machine = machine_info()
    if torch.cuda.is_available():
        machine |= {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
    record = {
        "benchmark": "engines",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "versions": versions,
        "settings": {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
        | {"variant": None, "variant_out": None},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
