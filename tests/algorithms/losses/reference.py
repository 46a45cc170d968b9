"""The loss of docs/algorithms.md §1.4/§11 as a float64 loop over rows and tokens with scalar autograd (value and
gradient), written from the definitions, not from the vectorised code: every surrogate (ppo, gspo, gspo_seq, cispo,
dppo, sapo), the three aggregations, the KL estimators, the entropy bonus and the selection's per-token fields. The
per-loss tests (tests/algorithms/losses/) and tests/step/test_loss_composition.py compare `policy_loss` with it."""

from __future__ import annotations

import math

import torch


def to_float(x):
    """A Python float of a number or of a 0-d tensor (detached: the loop branches on values, autograd follows the
    tensors)."""
    return x.detach().item() if isinstance(x, torch.Tensor) else float(x)


def _at(value, i, t):
    """A per-token setting: a float (the same everywhere) or a nested list (the token's own)."""
    return value if isinstance(value, (int, float)) else value[i][t]


def _kl_token(x, ref, estimator):
    """Schulman's estimators of KL(π‖π_ref) at one token, x = log π (a 0-d tensor), d = ref − x."""
    d = ref - x
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1.0
    assert estimator == "low_var_kl"
    if to_float(d) > 20.0 or to_float(d) < -20.0:  # the clamp cuts d (and its gradient)
        d = torch.tensor(max(-20.0, min(20.0, to_float(d))), dtype=torch.float64)
    value = torch.exp(d) - d - 1.0
    if to_float(value) > 10.0 or to_float(value) < -10.0:
        value = torch.tensor(max(-10.0, min(10.0, to_float(value))), dtype=torch.float64)
    return value


def _clamped(log_ratio):
    """A log-ratio (0-d tensor) clamped to ±20: outside, a constant (the clamp cuts the gradient)."""
    if to_float(log_ratio) > 20.0 or to_float(log_ratio) < -20.0:
        return torch.tensor(max(-20.0, min(20.0, to_float(log_ratio))), dtype=torch.float64)
    return log_ratio


def _dppo_drops(x, old, a, divergence, low, high):
    """DPPO's drop rule at one token, from the paper's definition (arXiv 2602.04879; verl's dppo_tv / dppo_kl):
    binary TV |p − p_old| or binary KL of Bernoulli(p_old) ‖ Bernoulli(p) with verl's 1e-8, in Python floats."""
    p, p_old = math.exp(x), math.exp(old)
    if divergence == "tv":
        distance = abs(p - p_old)
    else:
        distance = p_old * (old - x) + (1 - p_old) * math.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    return (a > 0 and p > p_old and distance > high) or (a < 0 and p < p_old and distance > low)


def loop_policy_loss(
    logp,
    old,
    adv,
    resp,
    w,
    *,
    kind="ppo",
    agg="token-mean",
    norm="selected",
    lo=0.2,
    hi=0.28,
    ref=None,
    beta=0.0,
    estimator="k3",
    kl_masked=True,
    kl_w=None,
    drift=None,
    entropy=None,
    alpha=0.0,
    ent_masked=False,
    budget=0,
    dual=None,
    is_w=None,
    dppo=("tv", 0.15, 0.15),
    sapo=(1.0, 1.05),
):
    """The loss of docs/algorithms.md §1.4/§11 by loops over rows and tokens: a 0-d tensor whose autograd graph reaches
    the leaves `logp` (and `entropy`), the normaliser (pg, kl, entropy) and the number of clipped selected tokens (for
    DPPO: dropped).

    logp (b, T) leaf; entropy (b, T) leaf or None; every other argument a tensor or a float, read as Python numbers.
    adv: (b,) or (b, T); lo / hi: float or (b, T) (inf allowed); w: token weights (0: not selected); dppo: (divergence,
    δ_low, δ_high); sapo: (τ_pos, τ_neg).
    """

    def py(x):
        return x.tolist() if isinstance(x, torch.Tensor) else x

    old, adv, resp, w, ref, kl_w, drift, is_w, lo, hi = map(py, (old, adv, resp, w, ref, kl_w, drift, is_w, lo, hi))
    B, T = logp.shape
    sel = [[1.0 if resp[i][t] != 0 and w[i][t] != 0 else 0.0 for t in range(T)] for i in range(B)]
    den = [[sel[i][t] if norm == "selected" else float(resp[i][t]) for t in range(T)] for i in range(B)]
    wkl = [
        [(sel[i][t] if kl_masked else float(resp[i][t])) * (1.0 if kl_w is None else kl_w[i][t]) for t in range(T)]
        for i in range(B)
    ]
    went = [[sel[i][t] if ent_masked else float(resp[i][t]) for t in range(T)] for i in range(B)]
    with_kl, with_ent = ref is not None and beta > 0, entropy is not None and alpha > 0
    zero = logp.sum() * 0.0 + (entropy.sum() * 0.0 if entropy is not None else 0.0)
    pg_sum, kl_sum, ent_sum = [zero] * B, [zero] * B, [zero] * B
    clipped = 0
    for i in range(B):
        if kind in ("gspo", "gspo_seq"):  # log s_i: the mean (clamped) log-ratio over the row's selected tokens
            picked = [_clamped(logp[i, t] - old[i][t]) for t in range(T) if sel[i][t]]
            seq_log_ratio = sum(picked) / len(picked) if picked else zero
        for t in range(T):
            x = logp[i, t]
            a = adv[i] if not isinstance(adv[i], list) else adv[i][t]
            if kind == "gspo":  # GSPO-token: value s_i, gradient through this token's log π only
                r = torch.exp(x - x.detach() + to_float(seq_log_ratio))
            elif kind == "gspo_seq":  # GSPO: r = s_i itself, its gradient through every selected token of the row
                r = torch.exp(seq_log_ratio)
            else:
                r = torch.exp(_clamped(x - old[i][t]))
            is_clipped = False
            if kind == "sapo":  # SAPO: −σ(τ(r − 1))·4/τ·Â, τ by the sign of Â
                tau = sapo[0] if a > 0 else sapo[1]
                pg = -torch.sigmoid(tau * (r - 1.0)) * (4.0 / tau) * a
            elif kind == "dppo":  # DPPO: −r·Â, or nothing where the token left the trust region
                is_clipped = _dppo_drops(to_float(x), old[i][t], a, *dppo)
                pg = zero if is_clipped else -r * a
            else:
                lower, upper = 1.0 - _at(lo, i, t), 1.0 + _at(hi, i, t)
                if to_float(r) < lower:
                    bounded = lower  # a constant: no gradient through the clipped ratio
                elif to_float(r) > upper:
                    bounded = upper
                else:
                    bounded = r
                if kind == "cispo":
                    b_value = to_float(bounded)
                    pg = -b_value * a * x
                    is_clipped = b_value != to_float(r)
                else:
                    unclipped, clip_branch = r * a, bounded * a
                    is_clipped = to_float(clip_branch) < to_float(unclipped)
                    pg = -(clip_branch if is_clipped else unclipped)
            if dual is not None and kind not in ("cispo", "sapo") and a < 0 and to_float(pg) > -dual * a:
                pg = torch.tensor(-dual * a, dtype=torch.float64)
            if drift is not None:
                pg = pg + drift[i][t] * torch.abs(x - old[i][t])
            if is_w is not None:
                pg = pg * is_w[i][t]
            if sel[i][t]:
                pg_sum[i] = pg_sum[i] + pg * (w[i][t] * resp[i][t])
                clipped += int(is_clipped)
            if with_kl and wkl[i][t] != 0:
                kl_sum[i] = kl_sum[i] + beta * _kl_token(x, ref[i][t], estimator) * wkl[i][t]
            if with_ent and went[i][t] != 0:
                ent_sum[i] = ent_sum[i] - alpha * entropy[i, t] * went[i][t]
    if agg == "seq-mean-token-mean":
        kept = [i for i in range(B) if sum(den[i]) > 0]
        normaliser = (float(len(kept)),) * 3
        loss = zero
        for i in kept:
            loss = loss + pg_sum[i] / max(sum(den[i]), 1.0)
            loss = loss + kl_sum[i] / max(sum(wkl[i]), 1.0) + ent_sum[i] / max(sum(went[i]), 1.0)
        return loss / max(len(kept), 1), normaliser, clipped
    if agg == "seq-mean-token-sum-norm":
        normaliser = (float(B * budget),) * 3
    else:
        assert agg == "token-mean"
        normaliser = tuple(float(sum(sum(row) for row in m)) for m in (den, wkl, went))
    loss = zero
    for total, divisor in zip((pg_sum, kl_sum, ent_sum), normaliser):
        loss = loss + sum(total, zero) / max(divisor, 1.0)
    return loss, normaliser, clipped
