"""Per-step diagnostics of a token selection (docs/algorithms.md §2.6 "log/monitor", issue: selectors).

Selected fraction; mean π(o_t) of selected tokens (ICT paper: 0.18 ± 0.09); entropy and Rényi-2 of selected
vs all tokens; JS quantiles; Jaccard overlap |A∩B| / |A∪B| with what each reference selector would choose
(`selectors.reference_selectors`: `entropy20`, `stapo`, and `ict` when JS is computed).

Where the task names the true forks (task=forks: data/forks_graph.py), `forks/*` scores each selection against them:
precision |S∩F| / |S|, recall |S∩F| / |F|, the share Σ_{t∈F} w_t / Σ_t w_t of the update's weight on forks, the
fork rate |F| / |response tokens| (a random selection's expected precision), and entropy and JS at forks vs elsewhere.
A ratio with an empty divisor is absent, as are all `forks/*` on tasks that cannot name their forks.
"""

from __future__ import annotations

import torch

from tokenrl.records.selection import SelectionBatch
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors import reference_selectors

JS_QUANTILES = (0.1, 0.5, 0.9)


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.bool(), b.bool()
    union = (a | b).sum()
    return float((a & b).sum() / union) if union > 0 else 1.0


def _mean(values: torch.Tensor, where: torch.Tensor) -> float:
    return float(values[where].mean()) if where.any() else float("nan")


def fork_scores(weights: torch.Tensor, forks: torch.Tensor, valid: torch.Tensor, suffix: str = "") -> dict[str, float]:
    """Precision, recall and (for non-binary weights too) the weight share on the true `forks` of a selection's
    `weights` (B, T) over the `valid` response tokens; keys end with `suffix`."""
    weights = weights.double() * valid
    chosen, forks = weights != 0, forks.bool() & valid
    hits = float((chosen & forks).sum())
    out = {}
    if chosen.any():
        out[f"forks/precision{suffix}"] = hits / float(chosen.sum())
        out[f"forks/weight_on_forks{suffix}"] = float((weights * forks).sum() / weights.sum())
    if forks.any():
        out[f"forks/recall{suffix}"] = hits / float(forks.sum())
    return out


def fork_diagnostics(
    weights: torch.Tensor,
    stats: TokenStats,
    valid: torch.Tensor,
    forks: torch.Tensor,
    references: dict[str, torch.Tensor],
) -> dict[str, float]:
    """`forks/*` of the update's `weights` and of each reference selector's mask (module docstring)."""
    forks = forks.bool() & valid
    other = valid & ~forks
    out = {"forks/rate": float(forks.sum() / valid.sum().clamp_min(1)), **fork_scores(weights, forks, valid)}
    for name, mask in references.items():
        out.update(fork_scores(mask, forks, valid, f"_{name}"))
    signals = {"entropy": stats.entropy, **({"js": stats.js} if stats.js is not None else {})}
    for signal, values in signals.items():
        for where, cells in (("forks", forks), ("other", other)):
            if cells.any():
                out[f"forks/{signal}_{where}"] = float(values[cells].mean())
    return out


def selection_diagnostics(
    mask: torch.Tensor, batch: SelectionBatch, forks: torch.Tensor | None = None
) -> dict[str, float]:
    """Diagnostics of `mask` (B, T) over the whole rollout batch described by `batch`, and its `forks/*` against the
    true `forks` (B, T) when the task names them."""
    stats: TokenStats = batch.stats
    valid = batch.response_mask.bool()
    chosen = mask.bool() & valid
    out = {
        "select/fraction": float(chosen.sum() / valid.sum().clamp_min(1)),
        "select/p_selected": _mean(stats.logprobs.exp(), chosen),
        "select/entropy_selected": _mean(stats.entropy, chosen),
        "select/entropy_all": _mean(stats.entropy, valid),
        "select/renyi2_selected": _mean(stats.renyi2, chosen),
        "select/renyi2_all": _mean(stats.renyi2, valid),
    }
    if stats.js is not None and valid.any():
        values = stats.js[valid]
        for q, value in zip(JS_QUANTILES, torch.quantile(values.float(), torch.tensor(JS_QUANTILES))):
            out[f"select/js_q{int(q * 100)}"] = float(value)
        out["select/js_selected"] = _mean(stats.js, chosen)
    references = {name: selector.mask(batch) for name, selector in reference_selectors(stats.js is not None).items()}
    for name, reference in references.items():
        out[f"select/jaccard_{name}"] = jaccard(chosen, reference)
    if forks is not None:
        out.update(fork_diagnostics(mask, stats, valid, forks, references))
    return out
