"""Per-response-token statistics and log-probs from logits at the sampling temperature, a pure function of tensors
(the pass that runs the policy: step/statistics.py), group by group and chunk by chunk so that at most `chunk_size`
response tokens have logits at a time (peak memory O(chunk × vocab)). With π = softmax(z / T) (docs/algorithms.md
§1.5, §2.2–2.3): log π(o_t); Shannon H = −Σ π log π; Rényi-2 H₂ = −log Σ π²; ICT uniqueness u_{i,t} = JS(π_{i,t} ‖ π̄_t),
π̄_t the mean of π_{j,t} over the group's rollouts j active at position t (`js_peers=all`, j = i included) or over the
others only (`others`), JS(P‖Q) = ½KL(P‖M) + ½KL(Q‖M), M = ½(P+Q), natural log; u = 0 where only one is active."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenrl.records.selection import TASK_MARKS
from tokenrl.records.token_stats import ALL_STATISTICS, TokenStats, zero_statistics

JS_PEERS = ("all", "others")


def needs_js(requires: frozenset[str], selector_name: str, js_diagnostics: bool) -> bool:
    """Whether the statistics pass computes JS (the selector reads it, or `diagnostics.js`); fails at start-up for a
    selector that reads a statistic the pass does not compute (the task's marks it may also require, `TASK_MARKS`,
    are the start-up check's: config/check.py)."""
    with_js = "js" in requires or js_diagnostics
    computed = ALL_STATISTICS if with_js else ALL_STATISTICS - {"js"}
    missing = requires - computed - TASK_MARKS
    if missing:
        raise ValueError(
            f"selector {selector_name} needs statistics {sorted(missing)} that the statistics "
            f"pass does not compute (it computes {sorted(computed)})"
        )
    return with_js


# logits_at(rows, positions) -> (N, V) logits of response token `positions[k]` of rollout `rows[k]`
LogitsAt = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_js_peers(js_peers: str) -> None:
    if js_peers not in JS_PEERS:
        raise ValueError(f"selector.js_peers={js_peers!r} is not one of {JS_PEERS}")


@dataclass(frozen=True)
class LogitStatistics:
    """How the statistics are read from logits: at the sampling `temperature`, at most `chunk_size` response tokens'
    logits at a time, JS over `js_peers` (`JS_PEERS`)."""

    temperature: float
    chunk_size: int
    js_peers: str = "all"

    def __post_init__(self) -> None:
        check_js_peers(self.js_peers)

    def group(
        self,
        logits_at: LogitsAt,
        rows: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        out: dict[str, torch.Tensor],
    ) -> None:
        """Fill `out[name][rows]` for one group of rollouts (the G rows of one prompt), chunk by chunk (JS where `out`
        holds it).

        A chunk covers C = max(1, chunk_size // G) positions; only active tokens get logits, so a chunk holds
        at most G·C ≤ max(chunk_size, G) rows of V logits (plus C rows for the group mean).
        """
        active = response_mask[rows].bool()  # (G, T)
        width = max(1, self.chunk_size // max(len(rows), 1))
        for t0 in range(0, active.shape[1], width):
            block = active[:, t0 : t0 + width]
            if not block.any():
                break  # masks are prefixes: nothing later
            local_row, offset = block.nonzero(as_tuple=True)
            row, pos = rows[local_row], offset + t0
            logp = torch.log_softmax(logits_at(row, pos).float() / self.temperature, dim=-1)  # (N, V)
            p = logp.exp()
            device = logp.device
            out["logprobs"][row, pos] = logp.gather(-1, response_ids[row, pos].to(device)[:, None]).squeeze(-1).cpu()
            out["entropy"][row, pos] = -(p * logp).sum(-1).cpu()
            out["renyi2"][row, pos] = -torch.log((p * p).sum(-1)).cpu()
            if "js" not in out:
                continue
            offset = offset.to(device)
            counts = block.sum(0).to(device)  # active rollouts per position
            total_at = torch.zeros(block.shape[1], p.shape[1], device=device).index_add_(0, offset, p)[offset]  # (N, V)
            count_at = counts[offset][:, None]
            if self.js_peers == "all":
                mean_at = total_at / count_at
            else:  # leave-one-out; clamped because the subtraction can leave −1e-8 where π_i holds all the mass
                mean_at = ((total_at - p) / (count_at - 1).clamp_min(1)).clamp_min(0.0)
            log_mid = torch.log((0.5 * (p + mean_at)).clamp_min(1e-30))
            kl_p = (p * (logp - log_mid)).sum(-1)
            kl_mean = (torch.xlogy(mean_at, mean_at) - mean_at * log_mid).sum(-1)
            js = (0.5 * (kl_p + kl_mean)).clamp_min(0.0)
            out["js"][row, pos] = torch.where(counts[offset] > 1, js, torch.zeros_like(js)).cpu()

    @torch.no_grad()
    def of_logits(
        self,
        logits: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        group_ids: torch.Tensor,
        with_js: bool = True,
    ) -> TokenStats:
        """The same statistics from a given (B, T, V) logits tensor (tests, benchmarks, offline analysis)."""
        out = zero_statistics(response_ids.shape, with_js)
        for group in group_rows(group_ids):
            self.group(lambda row, pos: logits[row, pos], group, response_ids, response_mask, out)
        return TokenStats(**out)


def group_rows(group_ids: torch.Tensor) -> list[torch.Tensor]:
    """The row indices of each group, groups in ascending id order."""
    return [(group_ids == g).nonzero().squeeze(1) for g in group_ids.unique(sorted=True)]
