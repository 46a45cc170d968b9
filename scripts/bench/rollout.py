"""Generated tokens/s of the `vllm` engine vs the `hf` engine, and the vLLM weight-sync time.

    python scripts/bench/rollout.py [--prompts 4 --n 8 --max-new-tokens 64 --rounds 5 --bucket-mb 16 256 4096]
                                    [--variants vllm vllm-compiled]

SmolLM2-135M-Instruct (the prepared offline model), chat-formatted arithmetic prompts of the default task, n samples
per prompt at T = 1.0, `max_new_tokens` each (sequences stop at EOS, so each engine is measured on what it
generates). Variants: `vllm` is the default engine (eager); `vllm-compiled` is it with `rollout.enforce_eager=false`
(torch.compile, paid at init unless vLLM's compile cache under ~/.cache/vllm already holds the graph).
A shared machine's speed drifts by tens of percent over minutes, so each variant is compared with the `hf` engine in
interleaved rounds (one `hf` call, one variant call, same seed) after one warm-up call each; the speed-up is the
median of the per-round ratios, with their range. Sync = streaming the full state dict into the eager engine in
layer-aligned buckets of each --bucket-mb size (one `reload_weights` call each time). Runs under tcmalloc, as
train.py does. Prints a table; writes benchmarks/rollout.json (machine with CPU model and vector ISA, date, versions).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from tokenrl.run.allocator import reexec_with_tcmalloc  # noqa: E402

VARIANTS = {"vllm": {}, "vllm-compiled": {"enforce_eager": False}}


def timed_generate(engine, prompts, params, seed: int) -> dict:
    start = time.perf_counter()
    batch = engine.generate(prompts, params, seed=seed)
    return {"seconds": time.perf_counter() - start, "tokens": int(batch.response_mask.sum())}


def tokens_per_second(runs: list[dict]) -> float:
    return sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs)


def sync_seconds(engine, policy, bucket_mbs: list[float], repeats: int) -> dict:
    sync, version = {}, 0
    for bucket_mb in bucket_mbs:
        engine.bucket_bytes = int(bucket_mb * 2**20)
        seconds_each = []
        for _ in range(repeats):
            version += 1
            start = time.perf_counter()
            engine.sync_weights(policy, version)
            seconds_each.append(time.perf_counter() - start)
        sync[f"{bucket_mb:g}"] = {"buckets": engine.last_sync_buckets, "seconds": seconds_each}
    return sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[16, 256, 4096])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "rollout.json")
    args = parser.parse_args()

    import torch
    import transformers
    import vllm
    from omegaconf import OmegaConf

    from tokenrl.data.prompts import PromptFormatter, with_instruction
    from tokenrl.data.tasks import ArithmeticTask
    from tokenrl.models import build_model, build_tokenizer
    from tokenrl.records.settings import ModelSettings, RolloutSettings
    from tokenrl.rollout import build_engine
    from tokenrl.rollout.engine import SamplingParams

    node = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "model" / "smollm2_135m.yaml"))
    node.pop("defaults")
    model = ModelSettings.of({**node, "source": str(ROOT / ".cache" / "models" / "smollm2-135m-instruct")})
    policy, tokenizer = build_model(model), build_tokenizer(model)
    task = ArithmeticTask(
        0, 9, ["+"], args.prompts, 1, seed=1234, instruction="Answer with just the number.", verifier="gsm8k_flexible"
    )
    formatter = PromptFormatter(tokenizer)
    prompts = [formatter.token_ids(with_instruction(p.question, task.instruction)) for p in task.problems("train")]
    params = SamplingParams(n=args.n, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens)

    def rollout_config(name: str, **overrides) -> RolloutSettings:
        """The composed `rollout=<name>` preset (the presets pull their sampling keys from
        configs/base/rollout.yaml)."""
        from hydra import compose, initialize_config_dir

        from tokenrl.paths import CONFIG_DIR

        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = OmegaConf.to_container(
                compose(config_name="train", overrides=[f"rollout={name}"]).rollout, resolve=True
            )
        return RolloutSettings.of({**cfg, **overrides, "max_new_tokens": args.max_new_tokens})

    hf = build_engine(rollout_config("hf"), policy, tokenizer)
    hf.generate(prompts, params, seed=0)  # warm-up
    results = {}
    for name in args.variants:
        start = time.perf_counter()
        engine = build_engine(rollout_config("vllm", **VARIANTS[name]), policy, tokenizer)
        init = time.perf_counter() - start
        engine.generate(prompts, params, seed=0)  # warm-up
        rounds = [
            {"hf": timed_generate(hf, prompts, params, seed), name: timed_generate(engine, prompts, params, seed)}
            for seed in range(1, args.rounds + 1)
        ]
        ratios = [tokens_per_second([r[name]]) / tokens_per_second([r["hf"]]) for r in rounds]
        results[name] = {
            "init_seconds": init,
            "tokens_per_second": tokens_per_second([r[name] for r in rounds]),
            "hf_tokens_per_second": tokens_per_second([r["hf"] for r in rounds]),
            "over_hf_median": statistics.median(ratios),
            "over_hf_range": [min(ratios), max(ratios)],
            "rounds": rounds,
        }
        if name == "vllm":
            results[name]["sync"] = sync_seconds(engine, policy, args.bucket_mb, repeats=3)
        engine.close()

    record = {
        "benchmark": "rollout",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "vllm": vllm.__version__,
        },
        "workload": {
            "model": "SmolLM2-135M-Instruct",
            "prompts": args.prompts,
            "n": args.n,
            "max_new_tokens": args.max_new_tokens,
            "temperature": 1.0,
            "dtype": "float32",
            "rounds": args.rounds,
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    machine = record["machine"]
    print(f"\n{machine['cpu_model']} ({machine['cpus']} CPUs; {' '.join(machine['vector_isa']) or 'no AVX2'})")
    print(f"{'engine':<15}{'init s':>8}{'tokens/s':>10}{'hf tokens/s':>13}{'/ hf (median, range)':>24}")
    for name, row in results.items():
        low, high = row["over_hf_range"]
        print(
            f"{name:<15}{row['init_seconds']:>8.1f}{row['tokens_per_second']:>10.1f}{row['hf_tokens_per_second']:>13.1f}"
            f"{row['over_hf_median']:>11.2f}x ({low:.2f}-{high:.2f})"
        )
    if "vllm" in results:
        print(f"\n{'bucket MiB':>10}{'buckets':>9}{'sync s (mean)':>15}")
        for bucket_mb, row in results["vllm"]["sync"].items():
            print(f"{bucket_mb:>10}{row['buckets']:>9}{sum(row['seconds']) / len(row['seconds']):>15.2f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    reexec_with_tcmalloc()
    main()
