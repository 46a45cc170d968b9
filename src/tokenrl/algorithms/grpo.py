"""GRPO math in one place: group advantages, the per-token policy loss (clipped PPO, GSPO or CISPO) with its KL,
entropy and drift terms, and loss aggregation.

Sources: DeepSeekMath (arXiv 2402.03300) §4.1 for GRPO; DAPO (arXiv 2503.14476) for clip-higher and
token-mean; docs/algorithms.md §1.4 for the masked interface and §11 for the token-level terms implemented here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenrl.algorithms.config import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES

NORMALIZERS = ("selected", "all")


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6,
                     std_normalize: bool = True) -> torch.Tensor:
    """Â_i = (R_i − mean_g R) / (std_g R + ε) over the rollouts of the same prompt (unbiased std).

    A group of one has mean 0 and std 1 (verl's rule); a group with equal rewards gets Â = 0, never NaN.
    """
    rewards = rewards.double()
    adv = torch.zeros_like(rewards)
    for group in group_ids.unique():
        rows = group_ids == group
        values = rewards[rows]
        if values.numel() > 1 and bool((values == values[0]).all()):
            continue   # exactly 0: the mean of equal non-dyadic rewards (0.1) is not exactly each of them
        if values.numel() == 1:
            mean, std = torch.zeros((), dtype=values.dtype), torch.ones((), dtype=values.dtype)
        else:
            mean, std = values.mean(), values.std()
        centred = values - mean
        adv[rows] = centred / (std + eps) if std_normalize else centred
    return adv.float()


def denominator_mask(response_mask: torch.Tensor, token_mask: torch.Tensor, norm: str) -> torch.Tensor:
    """D of docs/algorithms.md §1.4: the selected tokens — those of non-zero weight — (`selected`) or every response
    token (`all`)."""
    if norm not in NORMALIZERS:
        raise ValueError(f"loss normaliser {norm!r} is not one of {NORMALIZERS}")
    return (response_mask * (token_mask != 0)).float() if norm == "selected" else response_mask.float()


@dataclass
class LossNormalizer:
    """Divisors of one optimizer step's loss, counted over its whole mini-batch (and all ranks).

    token-mean: pg = Σ tokens of D, kl = Σ_t W_kl (KL-weighted), entropy = Σ tokens of W_H; seq-mean-token-mean: all three
    = kept sequences (those with Σ_t D > 0); seq-mean-token-sum-norm (Dr. GRPO): all three = sequences × the response
    budget, a constant whatever the selection (docs/algorithms.md §11.3).
    """

    pg: float
    kl: float
    entropy: float = 1.0

    def __add__(self, other: "LossNormalizer") -> "LossNormalizer":
        """The divisors of two disjoint sets of rows together (each count is a sum over rows)."""
        return LossNormalizer(self.pg + other.pg, self.kl + other.kl, self.entropy + other.entropy)

    @staticmethod
    def count(response_mask: torch.Tensor, token_mask: torch.Tensor, aggregation: str, norm: str,
              kl_masked: bool, entropy_masked: bool = False, budget: int = 0,
              kl_weights: torch.Tensor | None = None) -> "LossNormalizer":
        """The divisors of the rows given; `kl_weights` (a selection's per-token KL weights) weigh the KL count."""
        denominator = denominator_mask(response_mask, token_mask, norm)
        selected = response_mask * (token_mask != 0)
        if aggregation == "token-mean":
            w_kl = (selected if kl_masked else response_mask) * (1.0 if kl_weights is None else kl_weights)
            w_entropy = selected if entropy_masked else response_mask
            return LossNormalizer(float(denominator.sum()), float(w_kl.sum()), float(w_entropy.sum()))
        if aggregation == "seq-mean-token-mean":
            kept = float((denominator.sum(1) > 0).sum())
            return LossNormalizer(kept, kept, kept)
        if aggregation == "seq-mean-token-sum-norm":
            constant = float(response_mask.shape[0] * budget)
            return LossNormalizer(constant, constant, constant)
        raise ValueError(f"algorithm.aggregation={aggregation!r} is not one of {AGGREGATIONS}")


@dataclass
class LossOutput:
    """The loss share and, summed over the micro-batch's selected (non-zero weight) tokens, how many were clipped,
    dual-clipped and selected (for the clip fractions)."""

    loss: torch.Tensor
    clipped_tokens: torch.Tensor
    selected_tokens: torch.Tensor
    dual_clipped_tokens: torch.Tensor


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, token_mask: torch.Tensor, normalizer: LossNormalizer, *,
                aggregation: str, norm: str, clip_low: float | torch.Tensor, clip_high: float | torch.Tensor,
                ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0,
                kl_masked: bool = True, is_weights: torch.Tensor | None = None,
                dual_clip: float | None = None, kl_estimator: str = "k3", kind: str = "ppo",
                kl_weights: torch.Tensor | None = None, drift_coef: torch.Tensor | None = None,
                entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
                entropy_masked: bool = False) -> LossOutput:
    """This micro-batch's share of the mini-batch loss (to minimise); summing shares gives the full loss.

    Per token (docs/algorithms.md §1.2, §11): pg_t = −min(r_t Â_t, clip(r_t, 1−ε_low,t, 1+ε_high,t) Â_t) (`ppo`),
    r_t = exp(logp − old_logp) (log-ratio clamped to ±20); `gspo` uses r_t = exp(logp − sg(logp) + sg(s_i)), s_i the
    mean log-ratio of the row's selected tokens (GSPO-token, arXiv 2507.18071); `cispo` is
    pg_t = −sg(clip(r_t, 1−ε_low, 1+ε_high)) Â_t logp_t (MiniMax-M1, arXiv 2506.13585). Dual-clip c (arXiv
    1912.09729; verl's `clip_ratio_c`): where Â < 0 the unweighted pg_t is capped at −c·Â. Then pg_t += β_t·|logp −
    old_logp| (`drift_coef`, KL-Cov), pg_t ·= w_t (`is_weights`, TIS) and the token's weight (`token_mask`: 0/1 for a
    mask). kl_t = `kl_estimate` × `kl_weights`; the entropy bonus −α·H_t (`entropy`, with gradient). ε may be a float or
    a (b, T) tensor; `advantages` is (b,) (Â_i on every token) or (b, T) (per-token advantages).
    """
    resp = response_mask.float()
    selected = resp * (token_mask != 0)
    w_pg = resp * token_mask.to(logp.dtype)
    w_kl = (selected if kl_masked else resp) * (1.0 if kl_weights is None else kl_weights.to(logp.dtype))
    w_entropy = selected if entropy_masked else resp
    denominator = denominator_mask(response_mask, token_mask, norm)
    adv = (advantages[:, None] if advantages.dim() == 1 else advantages).to(logp.dtype)
    pg, is_clipped, dual_clipped = surrogate(logp, old_logp, adv, selected, kind, clip_low, clip_high, dual_clip)
    if drift_coef is not None:
        pg = pg + drift_coef.to(pg.dtype) * (logp - old_logp).abs()
    if is_weights is not None:
        pg = pg * is_weights.to(pg.dtype).detach()
    terms = [(pg, w_pg, denominator, normalizer.pg)]
    if ref_logp is not None and kl_coef > 0:
        terms.append((kl_coef * kl_estimate(logp, ref_logp, kl_estimator), w_kl, w_kl, normalizer.kl))
    if entropy is not None and entropy_coef > 0:
        terms.append((-entropy_coef * entropy, w_entropy, w_entropy, normalizer.entropy))
    loss = aggregate(terms, denominator, aggregation)
    return LossOutput(loss, (is_clipped * selected).sum().detach(), selected.sum().detach(),
                      (dual_clipped * selected).sum().detach())


def surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, selected: torch.Tensor, kind: str,
              clip_low: float | torch.Tensor, clip_high: float | torch.Tensor,
              dual_clip: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pg_t, clipped?, dual-clipped?) of `policy_loss`'s policy-gradient term, before any weight."""
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
    if kind == "gspo":
        sequence = (log_ratio * selected).sum(1) / selected.sum(1).clamp_min(1.0)
        log_ratio = logp - logp.detach() + sequence.detach()[:, None]
    elif kind not in POLICY_LOSSES:
        raise ValueError(f"algorithm.policy_loss={kind!r} is not one of {POLICY_LOSSES}")
    ratio = torch.exp(log_ratio)
    bounded = clip_ratio(ratio, clip_low, clip_high)
    if kind == "cispo":
        return -bounded.detach() * adv * logp, (bounded != ratio).to(logp.dtype), torch.zeros_like(logp)
    unclipped, clipped = ratio * adv, bounded * adv
    pg = -torch.minimum(unclipped, clipped)
    dual_clipped = torch.zeros_like(pg)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_clipped = ((adv < 0) & (pg > bound)).to(pg.dtype)
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
    return pg, (clipped < unclipped).to(pg.dtype), dual_clipped   # clipped: the clipped branch is the active minimum


def clip_ratio(ratio: torch.Tensor, clip_low: float | torch.Tensor, clip_high: float | torch.Tensor) -> torch.Tensor:
    """clip(r, 1 − ε_low, 1 + ε_high) with ε a float or a per-token tensor (ε_high = inf: no upper bound)."""
    if not isinstance(clip_low, torch.Tensor) and not isinstance(clip_high, torch.Tensor):
        return torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    low, high = (1.0 + sign * torch.as_tensor(eps, dtype=ratio.dtype, device=ratio.device)
                 for sign, eps in ((-1.0, clip_low), (1.0, clip_high)))
    return torch.minimum(torch.maximum(ratio, low), high)


def aggregate(terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]], denominator: torch.Tensor,
              aggregation: str) -> torch.Tensor:
    """Σ over (per-token value, weight, per-row divisor mask, normaliser) terms of docs/algorithms.md §1.4: token-mean
    and seq-mean-token-sum-norm divide Σ_t value·weight by the normaliser; seq-mean-token-mean averages each row over
    its divisor mask first and sums the rows that have selected tokens."""
    if aggregation in ("token-mean", "seq-mean-token-sum-norm"):
        return sum((value * weight).sum() / (norm if norm > 0 else 1.0) for value, weight, _, norm in terms)
    if aggregation == "seq-mean-token-mean":   # a row whose divisor is 0 has nothing to divide
        per_seq = sum((value * weight).sum(1) / torch.where(rows.sum(1) > 0, rows.sum(1), 1.0)
                      for value, weight, rows, _ in terms)
        keep = denominator.sum(1) > 0
        return per_seq[keep].sum() / max(terms[0][3], 1.0)
    raise ValueError(f"algorithm.aggregation={aggregation!r} is not one of {AGGREGATIONS}")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) at the sampled token, d = ref − logp (Schulman 2020, "Approximating KL
    divergence"; verl's `kl_penalty`): `k1` = −d; `k2` = d²/2; `k3` = exp(d) − d − 1; `low_var_kl` = k3 with d clamped
    to ±20 and the result to [−10, 10] (verl)."""
    d = ref_logp - logp
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1.0
    if estimator == "low_var_kl":
        d = d.clamp(-20.0, 20.0)
        return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"algorithm.kl_estimator={estimator!r} is not one of {KL_ESTIMATORS}")


def truncated_is_weights(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Token-level truncated importance sampling for a rollout engine that disagrees with the trainer:
    w_t = min(π_trainer(o_t) / π_engine(o_t), C) (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
    You Off-Policy RL Training"; verl's rollout TIS), computed in log space with the ratio clamped to e^±20."""
    return torch.exp(torch.clamp(trainer_logp - engine_logp, -20.0, 20.0)).clamp(max=cap)
