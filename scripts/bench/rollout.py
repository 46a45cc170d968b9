"""Generated tokens/s of the `vllm` engine vs the `hf` engine, and the vLLM weight-sync time.

    python scripts/bench/rollout.py [--prompts 4 --n 8 --max-new-tokens 64 --repeats 3 --bucket-mb 16 256 4096]

SmolLM2-135M-Instruct (the prepared offline model), chat-formatted arithmetic prompts of the default task, n samples
per prompt at T = 1.0, `max_new_tokens` each (sequences stop at EOS, so both engines are measured on what they
generate). Each engine is timed after one warm-up call; sync = streaming the full state dict into vLLM in
layer-aligned buckets of each --bucket-mb size (one `reload_weights` call each time).
Prints a table; writes benchmarks/rollout.json (machine, date, versions, allocator).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[16, 256, 4096])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "rollout.json")
    args = parser.parse_args()

    import torch
    import transformers
    from omegaconf import OmegaConf

    from tokenrl.data.prompts import PromptFormatter, with_instruction
    from tokenrl.data.tasks import ArithmeticTask
    from tokenrl.models import build_model, build_tokenizer
    from tokenrl.rollout import build_engine
    from tokenrl.rollout.base import SamplingParams

    model_cfg = OmegaConf.load(ROOT / "configs" / "model" / "smollm2_135m.yaml")
    model_cfg.source = str(ROOT / ".cache" / "models" / "smollm2-135m-instruct")
    model_cfg = OmegaConf.to_container(model_cfg)
    policy, tokenizer = build_model(model_cfg), build_tokenizer(model_cfg)
    task = ArithmeticTask(0, 9, ["+"], args.prompts, 1, seed=1234, instruction="Answer with just the number.",
                          verifier="gsm8k_flexible")
    formatter = PromptFormatter(tokenizer)
    prompts = [formatter.token_ids(with_instruction(p.question, task.instruction)) for p in task.problems("train")]
    params = SamplingParams(n=args.n, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens)

    results = {}
    for name in ("hf", "vllm"):
        rollout_cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "rollout" / f"{name}.yaml"))
        rollout_cfg["max_new_tokens"] = args.max_new_tokens
        start = time.perf_counter()
        engine = build_engine(rollout_cfg, policy, tokenizer)
        init = time.perf_counter() - start
        engine.generate(prompts, params, seed=0)                        # warm-up
        runs = []
        for repeat in range(args.repeats):
            start = time.perf_counter()
            batch = engine.generate(prompts, params, seed=repeat + 1)
            seconds = time.perf_counter() - start
            runs.append({"seconds": seconds, "tokens": int(batch.response_mask.sum())})
        tokens = sum(r["tokens"] for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        results[name] = {"init_seconds": init, "tokens_per_second": tokens / seconds, "runs": runs}
        if name == "vllm":
            sync, version = {}, 0
            for bucket_mb in args.bucket_mb:
                engine.bucket_bytes = int(bucket_mb * 2**20)
                seconds_each = []
                for _ in range(args.repeats):
                    version += 1
                    start = time.perf_counter()
                    engine.sync_weights(policy, version)
                    seconds_each.append(time.perf_counter() - start)
                sync[f"{bucket_mb:g}"] = {"buckets": engine.last_sync_buckets, "seconds": seconds_each}
            results[name]["sync"] = sync
        engine.close()
    speedup = results["vllm"]["tokens_per_second"] / results["hf"]["tokens_per_second"]
    import vllm

    record = {"benchmark": "rollout", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "processor": platform.processor() or platform.machine()},
              "allocator": "tcmalloc" if "tcmalloc" in os.environ.get("LD_PRELOAD", "") else "glibc malloc",
              "versions": {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "vllm": vllm.__version__},
              "workload": {"model": "SmolLM2-135M-Instruct", "prompts": args.prompts, "n": args.n,
                           "max_new_tokens": args.max_new_tokens, "temperature": 1.0, "dtype": "float32"},
              "results": results, "vllm_over_hf": speedup}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"\n{'engine':<8}{'init s':>9}{'tokens/s':>11}")
    for name in ("hf", "vllm"):
        print(f"{name:<8}{results[name]['init_seconds']:>9.1f}{results[name]['tokens_per_second']:>11.1f}")
    print(f"vllm / hf = {speedup:.2f}x")
    print(f"\n{'bucket MiB':>10}{'buckets':>9}{'sync s (mean)':>15}")
    for bucket_mb, row in results["vllm"]["sync"].items():
        print(f"{bucket_mb:>10}{row['buckets']:>9}{sum(row['seconds']) / len(row['seconds']):>15.2f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
