"""Time and peak memory of the fused, chunked LM head (models/lm_head.py) against the update's materialised head.

    python scripts/bench/lm_head.py --device cpu|cuda [--tokens 1024,2048,16384] [--out benchmarks/lm_head.json]

Workload: N response tokens (rows of `--length` tokens, ragged: each stops at a random length ≥ ¾ of it, groups of
`--group-size` rows) whose final hidden states (N, d) are random, a random head (V, d) at Qwen2.5-0.5B's shape (V
151,936, d 896), temperature 1. Each variant computes log π(o_t) and H_t with gradient and H₂ and ICT's JS (peers
`all`) detached, then back-propagates Σ g·log π + Σ g'·H to the hidden states and the head:
- `materialised`: today's update (step/passes.py): the (N, V) logits, their float32 log-softmax, log π and H from it,
  the statistics from the logits (algorithms/logit_statistics.py, `--stats-chunk` tokens at a time), autograd backward;
- `fused`: `fused_head` (vocabulary chunks of `vocab_chunk(N, V)` columns), its chunked backward.
With `--liger`, two more variants compare the fused head with Liger-Kernel's chunked selective log-prob (the
log-prob head of its fused PPO/GRPO losses, `liger_kernel.chunked_loss.fused_linear_ppo`; plain torch, so it runs on
the CPU too), on the one thing both compute, log π, back-propagating Σ g·log π only:
- `liger_logp`: Liger's head (sequence × vocabulary chunks, log-sum-exp streamed, logits recomputed in backward);
- `fused_logp`: `fused_head` without JS peers (it computes H and H₂ too: Liger has no entropy).
Each (variant, N) runs in its own process. Peak memory: on the CPU the process's max RSS minus its RSS once the inputs
(hidden states, head) exist; on a GPU `max_memory_allocated` minus the memory allocated then. Both include the head's
gradient (V × d). `--materialised-max` skips the materialised head above that many tokens (on the CPU its logits
alone are N × V × 4 bytes per copy). Where both run, their outputs are compared. Prints a table; writes the results
with the machine, date and versions (scripts/bench/machine.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))


def current_rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def workload(args, device):
    import torch

    g = torch.Generator().manual_seed(0)
    n, length = args.tokens, args.length
    rows = max(1, n // length)
    hidden = (torch.randn(rows * length, args.hidden, generator=g) * 0.5).to(device)
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * 0.02).to(device)
    lengths = torch.randint(length * 3 // 4, length + 1, (rows,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    targets = torch.randint(0, args.vocab, (rows, length), generator=g) * mask
    group_ids = torch.arange(rows) // args.group_size
    coef = torch.randn(2, rows, length, generator=g).to(device) * mask.to(device)
    return hidden, weight, targets, mask, group_ids, coef


def materialised(hidden, weight, targets, mask, group_ids, args):
    import torch

    from tokenrl.algorithms.logit_statistics import LogitStatistics

    rows, length = targets.shape
    logits = (hidden @ weight.t()).view(rows, length, -1)
    log_pi = torch.log_softmax(logits.float() / args.temperature, dim=-1)
    logp = log_pi.gather(-1, targets.to(logits.device)[..., None]).squeeze(-1)
    entropy = -(log_pi.exp() * log_pi).sum(-1)
    statistics = LogitStatistics(args.temperature, args.stats_chunk, "all")
    stats = statistics.of_logits(logits.detach(), targets, mask, group_ids, True)
    return logp, entropy, stats.renyi2, stats.js


def fused(hidden, weight, targets, mask, group_ids, args):
    from tokenrl.models.lm_head import ChunkedHead, fused_head, response_slots

    rows, length = targets.shape
    slots = response_slots(group_ids, length, mask, "all")
    out = fused_head(hidden, ChunkedHead(weight, args.temperature), targets.reshape(-1), slots)
    shape = (rows, length)
    return out.logprobs.view(shape), out.entropy.view(shape), out.renyi2.view(shape), out.js.view(shape)


def fused_logp(hidden, weight, targets, mask, group_ids, args):
    from tokenrl.models.lm_head import ChunkedHead, fused_head

    rows, length = targets.shape
    out = fused_head(hidden, ChunkedHead(weight, args.temperature), targets.reshape(-1))
    return out.logprobs.view(rows, length), out.entropy.view(rows, length), out.renyi2.view(rows, length), None


def liger_logp(hidden, weight, targets, mask, group_ids, args):
    from liger_kernel.chunked_loss.fused_linear_ppo import _ChunkedSelectiveLogProbFunction

    rows, length = targets.shape
    vocab_chunk = 4096  # Liger's default (_SELECTIVE_LOGPROB_VOCAB_CHUNK_SIZE)
    logp = _ChunkedSelectiveLogProbFunction.apply(
        hidden, weight, targets.reshape(-1).to(hidden.device), None, args.temperature, vocab_chunk
    )
    return logp.view(rows, length), None, None, None


VARIANTS = {"materialised": materialised, "fused": fused, "fused_logp": fused_logp, "liger_logp": liger_logp}


def run_variant(args) -> None:
    import torch

    import tokenrl.algorithms.logit_statistics  # noqa: F401  (imports outside the timed region)
    import tokenrl.models.lm_head  # noqa: F401

    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    hidden, weight, targets, mask, group_ids, coef = workload(args, device)
    hidden.requires_grad_()
    weight.requires_grad_()
    cuda = device.type == "cuda"
    step = VARIANTS[args.variant]
    logp_only = args.variant.endswith("_logp")
    seconds = []
    for _ in range(args.repeats):
        hidden.grad = weight.grad = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            base = current_rss_mib()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and args.bf16):
            logp, entropy, renyi2, js = step(hidden, weight, targets, mask, group_ids, args)
        loss = (coef[0] * logp).sum() + (0.0 if logp_only else (coef[1] * entropy).sum())
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        peak = (
            (torch.cuda.max_memory_allocated() - base) / 2**20
            if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
        )
    active = mask.bool().to(device)
    values = {
        name: tensor.detach().float().cpu()[active.cpu()]
        for name, tensor in (("logprobs", logp), ("entropy", entropy), ("renyi2", renyi2), ("js", js))
        if tensor is not None
    }
    values["grad_hidden_norm"] = hidden.grad.double().norm().cpu()
    values["grad_head_norm"] = weight.grad.double().norm().cpu()
    torch.save(values, args.save)
    print(json.dumps({"variant": args.variant, "tokens": args.tokens, "seconds": seconds, "peak_mib": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--tokens", default=None, help="comma-separated N (default: 1024,2048,16384)")
    parser.add_argument("--length", type=int, default=512, help="tokens per row")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--stats-chunk", type=int, default=512, help="the materialised statistics' model.stats_chunk_size"
    )
    parser.add_argument("--materialised-max", type=int, default=None, help="default: 2048 on the CPU, 16384 on a GPU")
    parser.add_argument("--bf16", action="store_true", help="on a GPU: under bf16 autocast (the trainer's bf16-mixed)")
    parser.add_argument("--repeats", type=int, default=None, help="default: 1 on the CPU, 3 on a GPU (the best)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    parser.add_argument("--liger", action="store_true", help="also Liger-Kernel's log-prob head against fused_logp")
    parser.add_argument("--variant", choices=list(VARIANTS))
    parser.add_argument("--save", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "lm_head.json")
    args = parser.parse_args()
    if args.variant:
        args.tokens = int(args.tokens)
        run_variant(args)
        return
    cuda = args.device == "cuda"
    tokens = [int(n) for n in (args.tokens or "1024,2048,16384").split(",")]
    limit = args.materialised_max if args.materialised_max is not None else (16384 if cuda else 2048)
    repeats = args.repeats or (3 if cuda else 1)
    tmp = ROOT / "logs" / "bench" / "lm_head"
    tmp.mkdir(parents=True, exist_ok=True)
    common = [sys.executable, __file__, "--device", args.device, "--length", str(args.length)]
    common += ["--group-size", str(args.group_size), "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
    common += ["--temperature", str(args.temperature), "--stats-chunk", str(args.stats_chunk)]
    common += ["--repeats", str(repeats), "--threads", str(args.threads)] + (["--bf16"] if args.bf16 else [])

    import torch

    results = []
    variants = ("fused", "materialised") + (("fused_logp", "liger_logp") if args.liger else ())
    for n in tokens:
        saved = {}
        for variant in variants:
            if variant == "materialised" and n > limit:
                continue
            save = tmp / f"{variant}_{n}.pt"
            done = subprocess.run(
                common + ["--variant", variant, "--tokens", str(n), "--save", str(save)], capture_output=True, text=True
            )
            if done.returncode != 0:
                results.append({"variant": variant, "tokens": n, "error": done.stderr[-1500:]})
                print(f"{variant} N={n} failed:\n{done.stderr[-1500:]}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["seconds_best"] = min(row["seconds"])
            results.append(row)
            saved[variant] = torch.load(save)
            print(f"{variant:<13}N={n:<7}{row['seconds_best']:>9.2f} s{row['peak_mib']:>10.0f} MiB", flush=True)
        for a, b in (("fused", "materialised"), ("liger_logp", "fused_logp")):
            if a in saved and b in saved:
                diff = {
                    name: float((saved[a][name] - saved[b][name]).abs().max())
                    for name in ("logprobs", "entropy", "renyi2", "js")
                    if name in saved[a] and name in saved[b]
                }
                for name in ("grad_hidden_norm", "grad_head_norm"):
                    x, y = float(saved[a][name]), float(saved[b][name])
                    diff[name + "_rel"] = abs(x - y) / max(abs(y), 1e-30)
                next(row for row in reversed(results) if row["variant"] == b)[f"{a}_vs_{b}_max_abs_diff"] = diff
    import transformers

    record = {
        "benchmark": "lm_head",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "threads": args.threads, "device": args.device},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            **({"liger_kernel": importlib.metadata.version("liger-kernel")} if args.liger else {}),
            **({"cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name()} if cuda else {}),
        },
        "workload": {
            "vocab": args.vocab,
            "hidden": args.hidden,
            "tokens_per_row": args.length,
            "group_size": args.group_size,
            "temperature": args.temperature,
            "dtype": "bf16 autocast, fp32 weights" if cuda and args.bf16 else "fp32",
            "stats_chunk_tokens_materialised": args.stats_chunk,
            "statistics": "log π and H with gradient; H₂ and JS (peers all) detached; backward to hidden and head"
            + ("; *_logp: log π only in the backward, no JS" if args.liger else ""),
            "peak": "above the inputs (hidden states, head), the head's gradient included",
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(f"\n{'variant':<14}{'tokens':>8}{'fwd+bwd s':>12}{'peak MiB':>11}")
    for row in results:
        if "error" in row:
            print(f"{row['variant']:<14}{row['tokens']:>8}{'failed':>12}")
        else:
            print(f"{row['variant']:<14}{row['tokens']:>8}{row['seconds_best']:>12.2f}{row['peak_mib']:>11.0f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
