"""Time and peak memory of the chunked statistics pass vs a naive full-materialisation version.

    python scripts/bench/token_stats.py [--rows 16 --group-size 8 --length 512 --vocab 151936 --chunk 256]

Workload: a random 2-layer Qwen2 body (hidden 64) with the real Qwen2.5 vocabulary, so the logits dominate;
16 responses (2 prompts × G = 8) of 512 tokens (ragged: each rollout stops at a random length ≥ 384).
Both variants compute log π, Shannon, Rényi-2 and ICT's JS and must agree (checked). Each variant runs in
its own process; peak memory is that process's max RSS minus a baseline process that builds the same model
and inputs. Prints a table; writes benchmarks/token_stats.json (machine with CPU model and vector ISA, date, versions,
allocator).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))


def workload(args):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tokenrl.records.rollout_batch import RolloutBatch

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(0)
    B, T, P = args.rows, args.length, 16
    response = torch.randint(0, args.vocab, (B, T), generator=g)
    lengths = torch.randint(T * 3 // 4, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, args.vocab, (B, P), generator=g),
        prompt_mask=torch.ones(B, P, dtype=torch.long),
        response_ids=response * mask,
        response_mask=mask,
        sampling_logprobs=torch.zeros(B, T),
        group_ids=torch.arange(B // args.group_size).repeat_interleave(args.group_size),
        finish_reasons=["stop"] * B,
        texts=[""] * B,
        weights_version=0,
    )
    return model, batch


def naive_stats(model, batch, temperature=1.0):
    """The straightforward version: full (B, T, V) logits, then vectorised statistics per group."""
    import torch

    from tokenrl.records.token_stats import TokenStats

    with torch.no_grad():
        ids, att = batch.input_ids, batch.attention_mask
        logits = model(input_ids=ids, attention_mask=att, position_ids=(att.cumsum(-1) - 1).clamp_min(0)).logits[
            :, batch.prompt_ids.shape[1] - 1 : -1
        ]
        logits = logits.float() / temperature  # (B, T, V)
        resp = batch.response_mask.bool()
        out = {k: torch.zeros(resp.shape) for k in ("logprobs", "entropy", "renyi2", "js")}
        for group in batch.group_ids.unique():
            rows = (batch.group_ids == group).nonzero().squeeze(1)
            logp = torch.log_softmax(logits[rows], -1)  # (G, T, V)
            p = logp.exp()
            a = resp[rows].float()
            out["logprobs"][rows] = logp.gather(-1, batch.response_ids[rows][..., None]).squeeze(-1)
            out["entropy"][rows] = -(p * logp).sum(-1)
            out["renyi2"][rows] = -torch.log((p * p).sum(-1))
            n = a.sum(0)
            mean = (p * a[..., None]).sum(0) / n.clamp_min(1)[:, None]  # (T, V)
            log_mid = torch.log((0.5 * (p + mean[None])).clamp_min(1e-30))
            js = 0.5 * ((p * (logp - log_mid)).sum(-1) + (torch.xlogy(mean, mean)[None] - mean[None] * log_mid).sum(-1))
            out["js"][rows] = torch.where(n[None] > 1, js.clamp_min(0), torch.zeros_like(js))
        for k in out:
            out[k] = out[k] * resp
    return TokenStats(**out)


def run_variant(args) -> None:
    import torch

    from tokenrl.step.fast_path import ForwardPlan
    from tokenrl.step.statistics import compute_token_stats

    torch.set_num_threads(args.threads)
    model, batch = workload(args)
    start = time.perf_counter()
    if args.variant == "chunked":
        stats = compute_token_stats(model, batch, ForwardPlan(1.0, args.rows, args.chunk, with_js=True))
    elif args.variant == "naive":
        stats = naive_stats(model, batch)
    else:
        stats = None
    seconds = time.perf_counter() - start
    result = {
        "variant": args.variant,
        "seconds": seconds,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if stats is not None:
        torch.save({k: getattr(stats, k) for k in ("logprobs", "entropy", "renyi2", "js")}, args.save)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--chunk", type=int, default=256, help="response tokens per chunk (model.stats_chunk_size)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variant", choices=["baseline", "chunked", "naive"])
    parser.add_argument("--save", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "token_stats.json")
    args = parser.parse_args()
    if args.variant:
        run_variant(args)
        return

    import torch

    tmp = ROOT / "logs" / "bench"
    tmp.mkdir(parents=True, exist_ok=True)
    common = [
        sys.executable,
        __file__,
        "--rows",
        str(args.rows),
        "--group-size",
        str(args.group_size),
        "--length",
        str(args.length),
        "--vocab",
        str(args.vocab),
        "--chunk",
        str(args.chunk),
        "--threads",
        str(args.threads),
    ]
    runs = []
    for repeat in range(args.repeats):
        for variant in ("baseline", "chunked", "naive"):
            save = tmp / f"{variant}.pt"
            done = subprocess.run(common + ["--variant", variant, "--save", str(save)], capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{variant} failed:\n{done.stderr[-2000:]}")
            runs.append({**json.loads(done.stdout.strip().splitlines()[-1]), "repeat": repeat})
    chunked, naive = torch.load(tmp / "chunked.pt"), torch.load(tmp / "naive.pt")
    max_diff = {k: float((chunked[k] - naive[k]).abs().max()) for k in chunked}
    base = min(r["max_rss_mib"] for r in runs if r["variant"] == "baseline")
    summary = {}
    for variant in ("chunked", "naive"):
        mine = [r for r in runs if r["variant"] == variant]
        summary[variant] = {
            "seconds_best": min(r["seconds"] for r in mine),
            "seconds_all": [round(r["seconds"], 3) for r in mine],
            "peak_rss_mib": max(r["max_rss_mib"] for r in mine),
            "peak_above_baseline_mib": max(r["max_rss_mib"] for r in mine) - base,
        }
    ratios = {
        "memory_chunked_over_naive": summary["chunked"]["peak_above_baseline_mib"]
        / summary["naive"]["peak_above_baseline_mib"],
        "time_chunked_over_naive": summary["chunked"]["seconds_best"] / summary["naive"]["seconds_best"],
    }
    import transformers

    record = {
        "benchmark": "token_stats",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "threads": args.threads},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "workload": {
            "rows": args.rows,
            "group_size": args.group_size,
            "length": args.length,
            "vocab": args.vocab,
            "chunk_tokens": args.chunk,
            "model": "random Qwen2, 2 layers, hidden 64",
        },
        "baseline_rss_mib": base,
        "results": summary,
        "ratios": ratios,
        "max_abs_diff": max_diff,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"\n{'variant':<10}{'best s':>10}{'peak MiB':>12}{'above base MiB':>16}")
    for variant in ("chunked", "naive"):
        r = summary[variant]
        print(f"{variant:<10}{r['seconds_best']:>10.2f}{r['peak_rss_mib']:>12.0f}{r['peak_above_baseline_mib']:>16.0f}")
    print(
        f"memory chunked/naive = {ratios['memory_chunked_over_naive']:.3f}   "
        f"time chunked/naive = {ratios['time_chunked_over_naive']:.2f}   max |diff| = {max(max_diff.values()):.2e}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
