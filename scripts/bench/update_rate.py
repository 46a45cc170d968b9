"""The update's arithmetic rate against what this machine's matrix products reach: how far a CPU update is from its
compute bound (issue #38's CPU goal), from a `scripts/bench/trl_side_by_side.py` record.

    python scripts/bench/update_rate.py [--record benchmarks/trl_side_by_side_cpu_hf.json] [--out FILE]

The update's least work: every distinct token through the decoder once forward and twice backward (6 · decoder
parameters · (one prompt per group + every response token)) and the LM head over the response tokens (6 · hidden ·
vocabulary · response tokens); attention's score products and the optimizer are left out, so the rate is a lower
bound. The rate = that work / the update's measured seconds, per framework. The reference: fp32 matrix products of
the model's own shapes (a micro-batch's tokens × hidden against the projections, the MLP and a quarter of the head),
timed here in this process with torch's threads, best of `--repeats`; "at matmul speed" = each kind of work at its
product's rate, the update's floor on this machine, and "of matmul" = that floor / the measured update. Prints a
table; writes `--out` (machine, date, versions, the record it read).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def least_update_flops(config: dict, groups: int, prompt_tokens_per_row: float, response_tokens: float) -> dict:
    """The update's least work by kind of product: 6 · (attention projections, MLP) parameters · (groups' prompts
    once + responses), and 6 · hidden · vocabulary · responses for the head."""
    hidden, inner, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    tokens = groups * prompt_tokens_per_row + response_tokens
    return {
        "attention": 6 * layers * (2 * hidden * hidden + 2 * hidden * kv) * tokens,
        "mlp": 6 * layers * 3 * hidden * inner * tokens,
        "head": 6 * hidden * config["vocab_size"] * response_tokens,
    }


def matmul_rate(config: dict, tokens: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of fp32 (tokens × hidden) @ (hidden × n) for the model's projection widths (the head: a quarter of the
    vocabulary), best of `repeats`."""
    hidden = config["hidden_size"]
    widths = {"attention": hidden, "mlp": config["intermediate_size"], "head": config["vocab_size"] // 4}
    rates = {}
    for name, width in widths.items():
        a, b = torch.randn(tokens, hidden), torch.randn(hidden, width)
        a @ b  # warm-up
        best = min(timed_product(a, b) for _ in range(repeats))
        rates[name] = 2 * tokens * hidden * width / best / 1e9
    return rates


def timed_product(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    a @ b
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, default=ROOT / "benchmarks" / "trl_side_by_side_cpu_hf.json")
    parser.add_argument("--tokens", type=int, default=2048, help="rows of the timed products (a micro-batch's tokens)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "update_rate_cpu.json")
    args = parser.parse_args()
    record = json.loads(args.record.read_text())
    settings, summary = record["settings"], record["summary"]
    config = json.loads((Path(settings["model"]) / "config.json").read_text())
    rates = matmul_rate(config, args.tokens, args.repeats)
    sides = {}
    for framework, work in summary["work"].items():
        parts = least_update_flops(
            config,
            work["prompts"],
            work["prompt_tokens"] / work["rows"],
            summary["mean"][framework]["completion_tokens"],
        )
        flops = sum(parts.values())
        seconds = summary["mean"][framework]["update_s"]
        floor = sum(part / (rates[kind] * 1e9) for kind, part in parts.items())  # each kind at its product's rate
        sides[framework] = {
            "update_s": seconds,
            "least_tflop": flops / 1e12,
            "gflop_per_s": flops / seconds / 1e9,
            "matmul_bound_s": floor,
            "of_matmul": floor / seconds,
        }
    print(
        f"fp32 matmul here ({torch.get_num_threads()} threads, {args.tokens} rows): "
        + ", ".join(f"{name} {rate:.0f}" for name, rate in rates.items())
        + " GFLOP/s"
    )
    print(f"{'':<10}{'update s':>10}{'least TFLOP':>13}{'GFLOP/s':>10}{'at matmul speed s':>19}{'of matmul':>11}")
    for framework, side in sides.items():
        print(
            f"{framework:<10}{side['update_s']:>10.2f}{side['least_tflop']:>13.2f}{side['gflop_per_s']:>10.0f}"
            f"{side['matmul_bound_s']:>19.2f}{side['of_matmul']:>11.0%}"
        )
    from importlib.metadata import version

    args.out.write_text(
        json.dumps(
            {
                "benchmark": "update_rate",
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": "python scripts/bench/update_rate.py " + " ".join(sys.argv[1:]),
                "machine": machine_info(),
                "versions": {"python": platform.python_version(), "torch": version("torch")},
                "record": str(args.record.relative_to(ROOT)) if args.record.is_relative_to(ROOT) else str(args.record),
                "record_date": record["date"],
                "threads": torch.get_num_threads(),
                "matmul_gflop_per_s": rates,
                "update": sides,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
