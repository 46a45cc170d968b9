"""Per-step diagnostics of a token selection (docs/algorithms.md §2.6 "log/monitor"): selected fraction, mean π(o_t) of
selected tokens (ICT paper: 0.18 ± 0.09), entropy and Rényi-2 of selected vs all tokens, JS quantiles, and the Jaccard
overlap |A∩B| / |A∪B| with each reference selector (`selectors.reference_selectors`).

Where the task names the true forks (task=forks), `forks/*` scores a selection S against them (R: response tokens, F:
true forks, D: decisions, F ⊂ D); each metric and its formula is tabled in docs/forks.md. auroc_σ is Mann–Whitney U /
(|F|·|D∖F|); top-k picks tied at the k-th score share the remaining budget equally (the expectation under a random
tie-break), so selectors compare at equal budgets. A ratio with an empty divisor is absent, as are all `forks/*` on
tasks that cannot name their forks.
"""

from __future__ import annotations

import torch

from tokenrl.records.marks import FAILURES, ForkMarks
from tokenrl.records.selection import SelectionBatch
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors import reference_selectors
from tokenrl.selectors.ranking import top_count

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


BUDGETS = (0.1, 0.2, 0.3)  # fractions of the response tokens at which each score's top-k is scored


def score_signals(stats: TokenStats) -> dict[str, torch.Tensor]:
    """The reference scores whose picks are scored against the forks: larger is "more decisive"."""
    signals = {"js": stats.js} if stats.js is not None else {}
    return {**signals, "entropy": stats.entropy, "renyi2": stats.renyi2, "surprisal": -stats.logprobs}


def top_k_shares(scores: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """(B, T) float64: each `valid` token's expected membership in the top `k` of `scores` when ties at the k-th
    score are broken at random (1 above it, (k − #above) / #tied at it, 0 below)."""
    out = torch.zeros(scores.shape, dtype=torch.float64)
    values = scores[valid].double()
    k = min(k, values.numel())
    if k == 0:
        return out
    threshold = values.sort(descending=True).values[k - 1]
    above, tied = values > threshold, values == threshold
    out[valid] = above.double() + tied.double() * (k - float(above.sum())) / float(tied.sum())
    return out


def precision_in_decisions(chosen: torch.Tensor, forks: torch.Tensor, decisions: torch.Tensor) -> float | None:
    """|S∩F∩D| / |S∩D| for a 0/1 (or expected-membership) `chosen`; None when S∩D is empty."""
    among = (chosen.double() * decisions).sum()
    return float((chosen.double() * (forks & decisions)).sum() / among) if among > 0 else None


def auroc(scores: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> float | None:
    """P(score of a positive > score of a negative) + ½ P(tie), by average ranks (Mann–Whitney U); None when either
    class is empty."""
    pos, neg = scores[positive].double(), scores[negative].double()
    if pos.numel() == 0 or neg.numel() == 0:
        return None
    _, inverse, counts = torch.unique(torch.cat([pos, neg]), return_inverse=True, return_counts=True)
    ranks = (counts.cumsum(0) - (counts - 1) / 2.0)[inverse]  # 1-based, ties at their average rank
    u = float(ranks[: pos.numel()].sum()) - pos.numel() * (pos.numel() + 1) / 2
    return u / (pos.numel() * neg.numel())


def decision_scores(
    chosen: torch.Tensor, forks: torch.Tensor, decisions: torch.Tensor, null: float | None, suffix: str = ""
) -> dict[str, float]:
    """precision_in_decisions of the selection `chosen`, and its lift over a `null`; keys end with `suffix`."""
    precision = precision_in_decisions(chosen, forks, decisions)
    if precision is None:
        return {}
    out = {f"forks/precision_in_decisions{suffix}": precision}
    if null is not None:
        out[f"forks/lift_in_decisions{suffix}"] = precision - null
    return out


def failure_anatomy(marks: ForkMarks, chosen: torch.Tensor) -> dict[str, float]:
    """`forks/fail_*` over the responses that fail, and the same counts over every response (`forks/fail_rate`,
    `forks/fail_*_of_all`: absolute rates beside the shares; docs/forks.md)."""
    failed = marks.failure != FAILURES.index("none")
    count, responses = int(failed.sum()), failed.numel()
    decisive = marks.decisive & failed[:, None]
    at_fork = (decisive & marks.forks).any(1)
    at_decision = (decisive & marks.decisions & ~marks.forks).any(1)
    invalid_letter = marks.failure == FAILURES.index("invalid_letter")
    rows_by_way = {f"forks/fail_{way}": marks.failure == i for i, way in enumerate(FAILURES) if way != "none"}
    for kind, rows in (("fork", at_fork), ("decision", at_decision), ("forced", ~at_fork & ~at_decision)):
        rows_by_way[f"forks/fail_invalid_letter_{kind}"] = invalid_letter & rows
    out = {}
    if responses:
        out["forks/fail_rate"] = count / responses
        out.update({f"{key}_of_all": float(rows.sum()) / responses for key, rows in rows_by_way.items()})
    if count == 0:
        return out
    out.update({key: float(rows.sum()) / count for key, rows in rows_by_way.items()})
    out["forks/fail_at_fork"] = float(at_fork.sum()) / count
    decided = decisive.any(1)
    if decided.any():
        out["forks/fail_decided_updated"] = float((decisive & chosen).any(1).sum()) / float(decided.sum())
    return out


def fork_diagnostics(
    weights: torch.Tensor, stats: TokenStats, valid: torch.Tensor, marks: ForkMarks, references: dict[str, torch.Tensor]
) -> dict[str, float]:
    """`forks/*` of the update's `weights`, each reference selector's mask and each reference score (docs/forks.md)."""
    forks, decisions = marks.forks.bool() & valid, marks.decisions.bool() & valid
    out = {"forks/rate": float(forks.sum() / valid.sum().clamp_min(1)), **fork_scores(weights, forks, valid)}
    for name, mask in references.items():
        out.update(fork_scores(mask, forks, valid, f"_{name}"))
    signals = {"entropy": stats.entropy, **({"js": stats.js} if stats.js is not None else {})}
    for signal, values in signals.items():
        for where, cells in (("forks", forks), ("other", valid & ~forks)):
            if cells.any():
                out[f"forks/{signal}_{where}"] = float(values[cells].mean())
    out["forks/decision_rate"] = float(decisions.sum()) / max(float(valid.sum()), 1.0)
    null = precision_in_decisions(decisions, forks, decisions)
    if null is not None:
        out["forks/rate_in_decisions"] = null
    chosen = (weights != 0) & valid
    out.update(decision_scores(chosen, forks, decisions, null))
    for name, mask in references.items():
        out.update(decision_scores(mask.bool(), forks, decisions, null, f"_{name}"))
    budgets = {"run": int(chosen.sum())} | {f"{round(f * 100)}": top_count(f, int(valid.sum())) for f in BUDGETS}
    for score, values in score_signals(stats).items():
        area = auroc(values, forks & decisions, decisions & ~forks)
        if area is not None:
            out[f"forks/auroc_{score}"] = area
        for budget, k in budgets.items():
            shares = top_k_shares(values, valid, k)
            run_null = null if budget == "run" else None  # the lift only at the run's own budget
            out.update(decision_scores(shares, forks, decisions, run_null, f"_{score}@{budget}"))
    on_graph = marks.on_graph.bool() & valid
    invalid = marks.invalid.bool() & valid
    kinds = {
        "invalid_at_forks": forks,
        "invalid_at_decisions": decisions & ~forks,
        "invalid_at_forced": on_graph & ~decisions,
        "invalid_nonfork": on_graph & ~forks,
    }
    for key, cells in kinds.items():
        if cells.any():
            out[f"forks/{key}"] = float((invalid & cells).sum()) / float(cells.sum())
    out.update(failure_anatomy(marks, chosen))
    return out


def selection_diagnostics(
    mask: torch.Tensor, batch: SelectionBatch, forks: ForkMarks | None = None
) -> dict[str, float]:
    """Diagnostics of `mask` (B, T) over the whole rollout batch described by `batch`, and its `forks/*` against the
    task's marks (`forks`, or the batch's own: `SelectionBatch.forks`) when the task names them."""
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
        for q, value in zip(JS_QUANTILES, torch.quantile(stats.js[valid].float(), torch.tensor(JS_QUANTILES))):
            out[f"select/js_q{int(q * 100)}"] = float(value)
        out["select/js_selected"] = _mean(stats.js, chosen)
    references = {name: selector.mask(batch) for name, selector in reference_selectors(stats.js is not None).items()}
    for name, reference in references.items():
        out[f"select/jaccard_{name}"] = jaccard(chosen, reference)
    forks = batch.forks if forks is None else forks
    if forks is not None:
        out.update(fork_diagnostics(mask, stats, valid, forks, references))
    return out
