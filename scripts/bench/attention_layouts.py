"""Forward + backward of one micro-batch in the padded, shared-prefix and packed layouts (models/response_forward.py,
models/packed.py): time and peak memory.

    python scripts/bench/attention_layouts.py --device cpu|cuda [--out FILE] [--layouts padded,shared_prefix,...]

Workload: a randomly initialised Qwen2 of the given shape and one micro-batch of `--rows` rows in groups of `--group-
size` (prompts of ~`--prompt-len` tokens, different per group; responses ragged: each stops at a random length in
[len/4, len], one at len). The loss is Σ log π(o_t) over the real response tokens, through the LM head and a float32
log-softmax, as the update computes it (`--body-only`: a random projection of the hidden states instead, to see the
layout without the head). On cuda the defaults are the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14/2 heads,
vocabulary 151,936) in bf16 with 16 rows (2 groups of 8, as a 16 prompts × 8 step cuts them), ~160-token prompts and
512-token responses; on cpu the layers of the offline default SmolLM2-135M (hidden 576, 9/3 heads, vocabulary 49,152;
4 of its 30 layers, for time) in float32, 16 rows, ~48-token prompts and 64-token responses. Layouts: `padded`,
`shared_prefix`, `packed_gather` (the packed layout's SDPA fallback) and, on cuda, `packed_flex` (FlexAttention,
compiled: the warm-up repeats include compilation). Each layout runs in its own process; peak memory is
torch.cuda.max_memory_allocated above the model and inputs on cuda, the process's max RSS above a baseline process
that builds the same model and inputs on cpu. Every layout's last log-probs are compared with the padded layout's (max
|Δ| in the table). Prints a table; writes the results with the machine, date and versions (default
benchmarks/attention_layouts.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from machine import machine_info

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

SHAPES = {
    "cuda": dict(
        hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, rows=16, group_size=8,
        prompt_len=160, response_len=512, dtype="bfloat16", repeats=5, warmup=2,
    ),
    "cpu": dict(
        hidden=576, intermediate=1536, layers=4, heads=9, kv_heads=3, vocab=49152, rows=16, group_size=8,
        prompt_len=48, response_len=64, dtype="float32", repeats=3, warmup=1,
    ),
}  # fmt: skip
LAYOUTS = {
    "cuda": ["padded", "shared_prefix", "packed_gather", "packed_flex"],
    "cpu": ["padded", "shared_prefix", "packed_gather"],
}


def workload(args):
    """(model, batch) of the benchmark's shape, on the device."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tokenrl.records.rollout_batch import RolloutBatch

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(4096, 2 * (args.prompt_len + args.response_len)),
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    dtype = getattr(torch, args.dtype)
    model = Qwen2ForCausalLM(config).to(device=args.device, dtype=dtype).train()
    g = torch.Generator().manual_seed(0)
    B, G, T = args.rows, args.group_size, args.response_len
    n_groups = B // G
    P = args.prompt_len + args.prompt_len // 8  # width of the left-padded prompt block
    prompt_lengths = torch.randint(args.prompt_len * 7 // 8, P + 1, (n_groups,), generator=g)
    prompt_ids = torch.zeros(B, P, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    for k in range(n_groups):
        n = int(prompt_lengths[k])
        tokens = torch.randint(args.vocab, (n,), generator=g)
        prompt_ids[k * G : (k + 1) * G, P - n :] = tokens
        prompt_mask[k * G : (k + 1) * G, P - n :] = 1
    lengths = torch.randint(max(1, T // 4), T + 1, (B,), generator=g)
    lengths[0] = T
    response_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    batch = RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(args.vocab, (B, T), generator=g) * response_mask,
        response_mask=response_mask,
        sampling_logprobs=torch.zeros(B, T),
        group_ids=torch.arange(n_groups).repeat_interleave(G),
        finish_reasons=["stop"] * B,
        texts=[""] * B,
        weights_version=0,
    )
    return model, batch


def step(model, batch, layout: str, body_only: bool):
    """One forward + backward; the detached (b, T) log-probs (or the hidden-state objective's per-token values)."""
    import torch

    from tokenrl.models.response_forward import decoder_and_head, response_hidden

    name, backend = layout.split("_", 1) if layout.startswith("packed") else (layout, "auto")
    hidden, cut = response_hidden(model, batch, trim=True, layout=name, packed_backend=backend)
    mask = cut.response_mask.to(hidden.device).bool()
    if body_only:
        g = torch.Generator(device=hidden.device).manual_seed(1)
        direction = torch.randn(hidden.shape[-1], generator=g, device=hidden.device, dtype=hidden.dtype)
        values = (hidden * direction).sum(-1).float()
    else:
        _, head = decoder_and_head(model)
        logits = head(hidden)
        values = torch.log_softmax(logits.float(), -1).gather(-1, cut.response_ids.to(hidden.device)[..., None])
        values = values.squeeze(-1)
    (values * mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return (values * mask).detach().float().cpu()


def run_layout(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    model, batch = workload(args)
    cuda = args.device == "cuda"
    if args.layout == "baseline":
        print(
            json.dumps({"layout": "baseline", "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
        )
        return
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times = []
    values = None
    for k in range(args.warmup + args.repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        values = step(model, batch, args.layout, args.body_only)
        if cuda:
            torch.cuda.synchronize()
        if k >= args.warmup:
            times.append(time.perf_counter() - start)
    torch.save(values, args.save)
    result = {
        "layout": args.layout,
        "seconds_median": statistics.median(times),
        "seconds_all": [round(t, 4) for t in times],
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if cuda:
        result["peak_above_model_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    print(json.dumps(result))


def tokens_of(args) -> dict:
    """Token counts of the micro-batch in each layout: padded (trimmed) and packed."""
    import torch

    from tokenrl.models.packed import pack
    from tokenrl.models.response_forward import prompt_owners, trimmed

    _, batch = workload(argparse.Namespace(**{**vars(args), "device": "cpu", "vocab": 16, "layers": 1}))
    cut = trimmed(batch)
    first, owner = prompt_owners(cut)
    layout = pack(cut, owner, first, torch.device("cpu"), "gather")
    return {
        "padded": int(cut.prompt_ids.numel() + cut.response_ids.numel()),
        "shared_prefix": int(cut.prompt_ids[first].numel() + cut.response_ids[:, :-1].numel()),
        "packed": layout.length,
        "real_response_tokens": int(cut.response_mask.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "attention_layouts.json")
    parser.add_argument("--layouts", help="comma-separated (default: all of the device's)")
    for key in SHAPES["cpu"]:
        parser.add_argument("--" + key.replace("_", "-"), type=str if key == "dtype" else int)
    parser.add_argument("--body-only", action="store_true", help="objective on the hidden states, no LM head")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--layout", help=argparse.SUPPRESS)
    parser.add_argument("--save", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for key, value in SHAPES[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.layout:
        run_layout(args)
        return

    import torch
    import transformers

    layouts = args.layouts.split(",") if args.layouts else LAYOUTS[args.device]
    tmp = ROOT / "logs" / "bench" / "attention_layouts"
    tmp.mkdir(parents=True, exist_ok=True)
    common = [sys.executable, __file__, "--device", args.device, "--threads", str(args.threads)]
    for key in SHAPES["cpu"]:
        common += ["--" + key.replace("_", "-"), str(getattr(args, key))]
    if args.body_only:
        common.append("--body-only")
    results = {}
    for layout in (["baseline"] if args.device == "cpu" else []) + layouts:
        done = subprocess.run(
            common + ["--layout", layout, "--save", str(tmp / f"{layout}.pt")], capture_output=True, text=True
        )
        if done.returncode != 0:
            results[layout] = {"error": done.stderr.strip().splitlines()[-1][-500:] if done.stderr.strip() else "?"}
            print(f"{layout} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        results[layout] = json.loads(done.stdout.strip().splitlines()[-1])
    reference = torch.load(tmp / "padded.pt") if "seconds_median" in results.get("padded", {}) else None
    for layout in layouts:
        entry = results[layout]
        if "error" in entry:
            continue
        if args.device == "cpu":
            entry["peak_above_baseline_mib"] = entry["max_rss_mib"] - results["baseline"]["max_rss_mib"]
        if reference is not None:
            entry["max_abs_diff_vs_padded"] = float((torch.load(tmp / f"{layout}.pt") - reference).abs().max())
        if "padded" in results and "seconds_median" in results["padded"]:
            entry["time_over_padded"] = entry["seconds_median"] / results["padded"]["seconds_median"]
    peak_key = "peak_above_model_mib" if args.device == "cuda" else "peak_above_baseline_mib"
    tokens = tokens_of(args)
    print(f"{'layout':<15} {'median s':>9} {'/ padded':>9} {'peak MiB':>9} {'max |Δ| vs padded':>18}")
    for layout in layouts:
        entry = results[layout]
        if "error" in entry:
            print(f"{layout:<15} failed: {entry['error']}")
            continue
        print(
            f"{layout:<15} {entry['seconds_median']:>9.3f} {entry.get('time_over_padded', float('nan')):>9.2f} "
            f"{entry[peak_key]:>9.1f} {entry.get('max_abs_diff_vs_padded', float('nan')):>18.2e}"
        )
    print("tokens per forward:", tokens)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else None
    record = {
        "benchmark": "attention_layouts",
        "command": "python scripts/bench/attention_layouts.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "threads": args.threads, "gpu": device_name},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "workload": {key: getattr(args, key) for key in SHAPES["cpu"]}
        | {"device": args.device, "body_only": args.body_only, "tokens_per_forward": tokens},
        "peak_memory": peak_key,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
