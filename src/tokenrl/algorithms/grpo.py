"""GRPO math in one place: group advantages, the per-token policy loss (clipped PPO, GSPO-token or -sequence, CISPO,
DPPO or SAPO) with its KL, entropy and drift terms, loss aggregation, and the engine's importance weights.

Sources: DeepSeekMath (arXiv 2402.03300) §4.1 for GRPO; DAPO (arXiv 2503.14476) for clip-higher and
token-mean; docs/algorithms.md §1.4 for the masked interface and §11 for the token-level terms implemented here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenrl.algorithms.config import AGGREGATIONS, DPPO_DIVERGENCES, KL_ESTIMATORS, POLICY_LOSSES, TIS_MODES

NORMALIZERS = ("selected", "all")


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, std_normalize: bool = True
) -> torch.Tensor:
    """Â_i = (R_i − mean_g R) / (std_g R + ε) over the rollouts of the same prompt (unbiased std).

    A group of one has mean 0 and std 1 (verl's rule); a group with equal rewards gets Â = 0, never NaN.
    """
    rewards = rewards.double()
    adv = torch.zeros_like(rewards)
    for group in group_ids.unique():
        rows = group_ids == group
        values = rewards[rows]
        if values.numel() > 1 and bool((values == values[0]).all()):
            continue  # exactly 0: the mean of equal non-dyadic rewards (0.1) is not exactly each of them
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

    token-mean: pg = Σ tokens of D, kl = Σ_t W_kl (KL-weighted), entropy = Σ tokens of W_H; seq-mean-token-mean: all
    three = kept sequences (those with Σ_t D > 0); seq-mean-token-sum-norm (Dr. GRPO): all three = sequences × the
    response budget, a constant whatever the selection (docs/algorithms.md §11.3).
    """

    pg: float
    kl: float
    entropy: float = 1.0

    def __add__(self, other: LossNormalizer) -> LossNormalizer:
        """The divisors of two disjoint sets of rows together (each count is a sum over rows)."""
        return LossNormalizer(self.pg + other.pg, self.kl + other.kl, self.entropy + other.entropy)

    @staticmethod
    def count(
        response_mask: torch.Tensor,
        token_mask: torch.Tensor,
        aggregation: str,
        norm: str,
        kl_masked: bool,
        entropy_masked: bool = False,
        budget: int = 0,
        kl_weights: torch.Tensor | None = None,
    ) -> LossNormalizer:
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


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    token_mask: torch.Tensor,
    normalizer: LossNormalizer,
    *,
    aggregation: str,
    norm: str,
    clip_low: float | torch.Tensor,
    clip_high: float | torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_masked: bool = True,
    is_weights: torch.Tensor | None = None,
    dual_clip: float | None = None,
    kl_estimator: str = "k3",
    kind: str = "ppo",
    kl_weights: torch.Tensor | None = None,
    drift_coef: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    entropy_masked: bool = False,
    dppo: tuple[str, float, float] = ("tv", 0.15, 0.15),
    sapo: tuple[float, float] = (1.0, 1.05),
) -> LossOutput:
    """This micro-batch's share of the mini-batch loss (to minimise); summing shares gives the full loss.

    Per token (docs/algorithms.md §1.2, §11): pg_t = −min(r_t Â_t, clip(r_t, 1−ε_low,t, 1+ε_high,t) Â_t) (`ppo`),
    r_t = exp(logp − old_logp) (log-ratio clamped to ±20); `gspo` uses r_t = exp(logp − sg(logp) + sg(log s_i)), log s_i
    the mean log-ratio of the row's selected tokens (GSPO-token, arXiv 2507.18071), `gspo_seq` r_t = s_i with its
    gradient (GSPO's sequence form, §11.10); `cispo` is pg_t = −sg(clip(r_t, 1−ε_low, 1+ε_high)) Â_t logp_t
    (MiniMax-M1, arXiv 2506.13585); `dppo` is pg_t = −r_t Â_t, 0 where the token left the trust region (`dppo` =
    (divergence, δ_low, δ_high), `dppo_dropped`, §11.11); `sapo` is pg_t = −σ(τ(r_t − 1))·4/τ·Â_t, τ = τ_pos where
    Â > 0 else τ_neg (`sapo` = (τ_pos, τ_neg), §11.12). Dual-clip c (arXiv 1912.09729; verl's `clip_ratio_c`): where
    Â < 0 the unweighted pg_t is capped at −c·Â. Then pg_t += β_t·|logp − old_logp| (`drift_coef`, KL-Cov), pg_t ·= w_t
    (`is_weights`, the engine's importance weights) and the token's weight (`token_mask`: 0/1 for a mask). kl_t =
    `kl_estimate` × `kl_weights`; the entropy bonus −α·H_t (`entropy`, with gradient). ε may be a float or a (b, T)
    tensor (DPPO and SAPO have no ε); `advantages` is (b,) (Â_i on every token) or (b, T) (per-token advantages).
    """
    resp = response_mask.float()
    selected = resp * (token_mask != 0)
    w_pg = resp * token_mask.to(logp.dtype)
    w_kl = (selected if kl_masked else resp) * (1.0 if kl_weights is None else kl_weights.to(logp.dtype))
    w_entropy = selected if entropy_masked else resp
    denominator = denominator_mask(response_mask, token_mask, norm)
    adv = (advantages[:, None] if advantages.dim() == 1 else advantages).to(logp.dtype)
    pg, is_clipped, dual_clipped = surrogate(
        logp, old_logp, adv, selected, kind, clip_low, clip_high, dual_clip, dppo, sapo
    )
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
    return LossOutput(
        loss, (is_clipped * selected).sum().detach(), selected.sum().detach(), (dual_clipped * selected).sum().detach()
    )


def surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    selected: torch.Tensor,
    kind: str,
    clip_low: float | torch.Tensor,
    clip_high: float | torch.Tensor,
    dual_clip: float | None,
    dppo: tuple[str, float, float] = ("tv", 0.15, 0.15),
    sapo: tuple[float, float] = (1.0, 1.05),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pg_t, clipped?, dual-clipped?) of `policy_loss`'s policy-gradient term, before any weight; `clipped` is the
    clipped branch being the active minimum, for `dppo` the token being dropped, never for `sapo`."""
    if kind not in POLICY_LOSSES:
        raise ValueError(f"algorithm.policy_loss={kind!r} is not one of {POLICY_LOSSES}")
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
    if kind in ("gspo", "gspo_seq"):
        sequence = (log_ratio * selected).sum(1) / selected.sum(1).clamp_min(1.0)
        log_ratio = (
            logp - logp.detach() + sequence.detach()[:, None] if kind == "gspo" else sequence[:, None].expand_as(logp)
        )
    ratio = torch.exp(log_ratio)
    none = torch.zeros_like(logp)
    if kind == "sapo":
        tau = torch.full_like(adv, sapo[1]).masked_fill(adv > 0, sapo[0])
        return -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * adv, none, none
    if kind == "dppo":
        dropped = dppo_dropped(logp, old_logp, adv, *dppo)
        pg, is_clipped = torch.where(dropped, 0.0, -ratio * adv), dropped.to(logp.dtype)
    else:
        bounded = clip_ratio(ratio, clip_low, clip_high)
        if kind == "cispo":
            return -bounded.detach() * adv * logp, (bounded != ratio).to(logp.dtype), none
        unclipped, clipped = ratio * adv, bounded * adv
        pg = -torch.minimum(unclipped, clipped)
        is_clipped = (clipped < unclipped).to(pg.dtype)  # the clipped branch is the active minimum
    dual_clipped = none
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_clipped = ((adv < 0) & (pg > bound)).to(pg.dtype)
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
    return pg, is_clipped, dual_clipped


def dppo_dropped(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, divergence: str, low: float, high: float
) -> torch.Tensor:
    """DPPO's "drop rather than clip" (Qi et al., arXiv 2602.04879; prime-rl's default loss, verl's `dppo_tv` /
    `dppo_kl`): with p = π_θ(o_t), p_old = π_old(o_t) and D the binary TV |p − p_old| (`tv`) or the binary KL
    p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old + 1e-8)/(1 − p + 1e-8)) (`kl`, verl's and TRL's form), a token
    is dropped where it left the trust region the way its advantage pushes it: Â > 0, p > p_old and D > δ_high, or
    Â < 0, p < p_old and D > δ_low. Detached (a 0/1 gate)."""
    with torch.no_grad():
        p, p_old = torch.exp(logp), torch.exp(old_logp)
        if divergence == "tv":
            distance = (p - p_old).abs()
        elif divergence == "kl":
            eps = 1e-8
            distance = p_old * (old_logp - logp) + (1.0 - p_old) * torch.log((1.0 - p_old + eps) / (1.0 - p + eps))
        else:
            raise ValueError(f"algorithm.dppo_divergence={divergence!r} is not one of {DPPO_DIVERGENCES}")
        return ((adv > 0) & (p > p_old) & (distance > high)) | ((adv < 0) & (p < p_old) & (distance > low))


def clip_ratio(ratio: torch.Tensor, clip_low: float | torch.Tensor, clip_high: float | torch.Tensor) -> torch.Tensor:
    """clip(r, 1 − ε_low, 1 + ε_high) with ε a float or a per-token tensor (ε_high = inf: no upper bound)."""
    if not isinstance(clip_low, torch.Tensor) and not isinstance(clip_high, torch.Tensor):
        return torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    low, high = (
        1.0 + sign * torch.as_tensor(eps, dtype=ratio.dtype, device=ratio.device)
        for sign, eps in ((-1.0, clip_low), (1.0, clip_high))
    )
    return torch.minimum(torch.maximum(ratio, low), high)


def aggregate(
    terms: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]], denominator: torch.Tensor, aggregation: str
) -> torch.Tensor:
    """Σ over (per-token value, weight, per-row divisor mask, normaliser) terms of docs/algorithms.md §1.4: token-mean
    and seq-mean-token-sum-norm divide Σ_t value·weight by the normaliser; seq-mean-token-mean averages each row over
    its divisor mask first and sums the rows that have selected tokens."""
    if aggregation in ("token-mean", "seq-mean-token-sum-norm"):
        return sum((value * weight).sum() / (norm if norm > 0 else 1.0) for value, weight, _, norm in terms)
    if aggregation == "seq-mean-token-mean":  # a row whose divisor is 0 has nothing to divide
        per_seq = sum(
            (value * weight).sum(1) / torch.where(rows.sum(1) > 0, rows.sum(1), 1.0) for value, weight, rows, _ in terms
        )
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


def engine_is_weights(
    trainer_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    cap: float,
    floor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine→trainer importance weights of docs/algorithms.md §1.6/§11.13 and, per token, whether its ratio lies
    outside [floor, cap]. `token_*`: r_t = π_trainer(o_t)/π_engine(o_t); `sequence_*`: r_i = Π_t r_t = exp(Σ_t log r_t)
    over the row's response tokens, on every token of the row (TRL's `vllm_importance_sampling_mode`). `*_truncate`:
    w = clamp(r, floor, cap) (TIS: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training"; no floor when None); `*_mask`: w = r·[floor ≤ r ≤ cap] (IcePop / masked IS: TRL's `token_mask` /
    `sequence_mask`, OpenRLHF's `icepop`). Log-ratios (of a token, or of a row's sum) are clamped to ±20."""
    if mode not in TIS_MODES:
        raise ValueError(f"algorithm.tis_mode={mode!r} is not one of {TIS_MODES}")
    log_ratio = torch.where(response_mask.bool(), trainer_logp - engine_logp, 0.0)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(1, keepdim=True).expand_as(log_ratio)
    ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    outside = (ratio > cap) | (ratio < (0.0 if floor is None else floor))
    if mode.endswith("truncate"):
        return ratio.clamp(min=floor, max=cap), outside
    return torch.where(outside, 0.0, ratio), outside
