"""Selectors compose with loss variants (issues #16, #23): every selector of `tokenrl.selectors` × policy loss (ppo,
gspo, gspo_seq, cispo, dppo, sapo), each with an aggregation (token-mean, seq-mean-token-mean, seq-mean-token-sum-norm)
and a KL (off, k3 on the selected tokens, low_var_kl on every response token) chosen so that every pair of any two
settings is in some row (tests/helpers/grids.py: 60 rows hold the 540 combinations' pairs), on a small ragged float64
batch, through the update's own entry points: `selector.select` → `LossNormalizer.count` → `UpdateLoss.micro_batch`.

The loss and its gradient must equal the float64 loop of tests/algorithms/losses/reference.py (`loop_policy_loss`,
written from docs/algorithms.md §1.4/§11, not from the vectorised code) fed with the selection's fields: its token
weights (zero: no policy-gradient term), its normaliser (`selected`: the tokens of non-zero weight, `all`: every
response token; seq-mean: the rows with a non-zero divisor; sum-norm: B·budget), per-token ε, KL weights, token
advantages and drift.
For each combination, zeroing the weight of one selected token must zero that token's policy-gradient gradient exactly
(no combination drops the weights) and the normaliser must be the reference's (no combination drops it); micro-batch
shares of the selection's rows must add up to the mini-batch loss.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.algorithms.losses.reference import loop_policy_loss
from tests.helpers.grids import all_pairs, uncovered_pairs
from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.grpo import LossNormalizer, group_advantages
from tokenrl.algorithms.surrogates import BUILT_IN_SURROGATES as POLICY_LOSSES
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.token_stats import TokenStats
from tokenrl.selectors import (
    ArcherSelector,
    ClipCovSelector,
    Entropy20Selector,
    GTPOSelector,
    ICTComplementSelector,
    ICTSelector,
    KLCovSelector,
    RandomSelector,
    STAPOSelector,
    UniformSelector,
)
from tokenrl.step.passes import UpdateForward
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import UpdateLoss

STEP = 3
BUDGET = 8
# (group, response length, reward): a group of one, a group with equal rewards (zero advantages), one-token responses
ROWS = [(0, 6, 1.0), (0, 1, 0.0), (0, 4, 1.0), (1, 3, 1.0), (1, 6, 0.0), (2, 2, 1.0), (3, 5, 1.0), (3, 4, 1.0)]

SELECTORS = {
    "uniform": lambda: UniformSelector(),
    "ict": lambda: ICTSelector(warmup_steps=0),
    "ict_complement": lambda: ICTComplementSelector(warmup_steps=0),
    "entropy20": lambda: Entropy20Selector(),
    "stapo": lambda: STAPOSelector(tau_p=0.1),  # p < 0.1 on about half the tokens: some are silenced
    "random": lambda: RandomSelector(warmup_steps=0),
    "clip_cov": lambda: ClipCovSelector(ratio=0.2, cov_low=-1e9, cov_high=1e9),
    "kl_cov": lambda: KLCovSelector(ratio=0.2),
    "archer": lambda: ArcherSelector(),
    "gtpo": lambda: GTPOSelector(),
}
KL = {"off": (0.0, "k3", True), "k3_masked": (0.05, "k3", True), "low_var_unmasked": (0.05, "low_var_kl", False)}
AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def case():
    """The TrainBatch (float32 reference log-probs), π_old's float32 statistics with JS and π_θ's float64 log-probs."""
    g = torch.Generator().manual_seed(16)
    B, T = len(ROWS), max(length for _, length, _ in ROWS)
    lengths = torch.tensor([length for _, length, _ in ROWS])
    resp = (torch.arange(T)[None] < lengths[:, None]).long()
    group_ids = torch.tensor([group for group, _, _ in ROWS])
    rewards = torch.tensor([reward for _, _, reward in ROWS])
    old = (-torch.rand(B, T, generator=g) * 4) * resp
    entropy = (torch.rand(B, T, generator=g) * 2) * resp
    entropy[0, :3] = entropy[4, 2] = 0.75  # entropy ties, inside a row and across rows
    js = torch.rand(B, T, generator=g) * resp
    js[4, :2] = js[4, 3]  # JS ties
    stats = TokenStats(old.float(), entropy.float(), (entropy * 0.8).float(), js.float())
    ref = ((old + 0.4 * torch.randn(B, T, generator=g)) * resp).float()
    rollouts = RolloutBatch(
        torch.ones(B, 2, dtype=torch.long),
        torch.ones(B, 2, dtype=torch.long),
        torch.randint(2, 50, (B, T), generator=g) * resp,
        resp,
        old.float(),
        group_ids,
        ["stop"] * B,
        [""] * B,
        0,
    )
    batch = TrainBatch(STEP, rollouts, rewards, rewards, group_advantages(rewards, group_ids), ref)
    logp = (old.double() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)) * resp
    return batch, stats, logp


def algorithm(policy_loss: str, aggregation: str, kl: str) -> AlgorithmConfig:
    kl_coef, estimator, kl_masked = KL[kl]
    config = AlgorithmConfig.of(
        group_size=3,
        prompts_per_step=4,
        micro_batch_size=8,
        aggregation=aggregation,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=None,
        kl_coef=kl_coef,
        kl_estimator=estimator,
        kl_masked=kl_masked,
        adv_std_normalize=True,
        adv_eps=1e-6,
        ppo_epochs=1,
        mini_batches=1,
        grad_clip=None,
        overlong_buffer=0,
        overlong_penalty_factor=1.0,
        lr_warmup_steps=0,
        filter_groups=None,
        gen_prompts_per_step=4,
        max_gen_rounds=1,
        tis_cap=None,
        policy_loss=policy_loss,
        entropy_coef=0.0,
        entropy_masked=False,
        entropy_target=None,
        entropy_coef_delta=1e-4,
        entropy_coef_max=5e-3,
        response_budget=BUDGET,
        dppo_divergence="tv",
        dppo_low=0.1,
        dppo_high=0.1,
        sapo_tau_pos=2.0,
        sapo_tau_neg=3.0,
    )
    config.validate(max_new_tokens=BUDGET)
    return config


def implementation(batch, stats, logp, selection, cfg, rows=None):
    """(loss, ∂loss/∂logp, normaliser) through the update's entry points, the normaliser counted over all rows."""
    rows = torch.arange(batch.size) if rows is None else rows
    normalizer = LossNormalizer.count(batch.rollouts.response_mask, selection, cfg.loss)
    leaf = logp.clone().requires_grad_(True)
    out = UpdateLoss(batch, cfg.loss, None).micro_batch(
        rows, UpdateForward(logprobs=leaf[rows], entropy=None), stats.logprobs[rows], selection.rows(rows), normalizer
    )
    out.loss.backward()
    return float(out.loss.detach()), leaf.grad, (normalizer.pg, normalizer.kl, normalizer.entropy)


def reference(batch, stats, logp, selection, cfg):
    """The loop's (loss, ∂loss/∂logp, normaliser) with the selection's fields, or the algorithm's where it sets none."""
    leaf = logp.clone().requires_grad_(True)
    loss, normaliser, _ = loop_policy_loss(
        leaf,
        stats.logprobs.double(),
        batch.advantages.double() if selection.advantages is None else selection.advantages.double(),
        batch.rollouts.response_mask,
        selection.weights,
        kind=cfg.loss.policy_loss,
        agg=cfg.loss.aggregation,
        norm=selection.normalizer,
        lo=cfg.loss.clip_low if selection.clip_low is None else selection.clip_low.double(),
        hi=cfg.loss.clip_high if selection.clip_high is None else selection.clip_high.double(),
        ref=batch.ref_logprobs.double(),
        beta=cfg.loss.kl_coef,
        estimator=cfg.loss.kl_estimator,
        kl_masked=cfg.loss.kl_masked,
        kl_w=selection.kl_weights,
        drift=selection.drift_coef,
        budget=cfg.loss.response_budget,
        dppo=(cfg.loss.dppo_divergence, cfg.loss.dppo_low, cfg.loss.dppo_high),
        sapo=(cfg.loss.sapo_tau_pos, cfg.loss.sapo_tau_neg),
    )
    loss.backward()
    return float(loss.detach()), leaf.grad, normaliser


def assert_matches(got, expected, selection):
    loss, grad, normaliser = got
    ref_loss, ref_grad, ref_normaliser = expected
    assert normaliser[:2] == ref_normaliser[:2]  # pg and KL divisors (no entropy bonus here)
    # A selection's ε is float32 and `clip_ratio` forms 1 ± ε in ε's dtype (the loop: in float64), so a clipped
    # ratio's bound is off by up to ~2e-8 relative (0.8 vs float32's 0.800000012); CISPO's gradient carries the bound
    # itself. Without per-token ε everything is float64.
    float32_eps = selection.clip_low is not None or selection.clip_high is not None
    assert loss == pytest.approx(ref_loss, abs=5e-8 if float32_eps else 1e-12, rel=1e-10)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-7 if float32_eps else 1e-10, atol=1e-13)


def check_selection_is_real(name, selection, resp):
    """Each selector really shapes something on this batch, so the grid tests the shaping and not plain GRPO."""
    chosen = (selection.weights != 0).float()
    assert torch.equal(selection.weights * (1 - resp), torch.zeros_like(selection.weights))
    if name in ("ict", "ict_complement", "entropy20", "stapo", "random", "clip_cov"):
        assert 0 < chosen.sum() < resp.sum()
    if name in ("ict", "entropy20", "random"):
        assert ((chosen * resp).sum(1) == 0).sum() >= (1 if name == "entropy20" else 0)
    if name == "archer":
        clip = selection.clip_high[resp.bool()]
        assert len(clip.unique()) == 2 and (selection.kl_weights[resp.bool()] == 0).any()
    if name == "kl_cov":
        assert 0 < (selection.drift_coef > 0).sum() < resp.sum() and torch.isinf(selection.clip_high).all()
    if name == "gtpo":
        adv = selection.advantages
        assert adv.shape == resp.shape and any(len(adv[i][resp[i].bool()].unique()) > 1 for i in range(len(adv)))


COMPOSITION_FACTORS = (list(SELECTORS), list(POLICY_LOSSES), AGGREGATIONS, list(KL))
COMPOSITIONS = all_pairs(*COMPOSITION_FACTORS)  # every selector × loss, and every pair of any two settings
FRACTIONAL_FACTORS = (
    ["uniform", "entropy20", "clip_cov", "kl_cov", "archer", "gtpo"],
    list(POLICY_LOSSES),
    AGGREGATIONS,
)
FRACTIONALS = all_pairs(*FRACTIONAL_FACTORS)


def test_the_grids_hold_every_pair_of_settings():
    assert not uncovered_pairs(COMPOSITIONS, COMPOSITION_FACTORS)
    assert not uncovered_pairs(FRACTIONALS, FRACTIONAL_FACTORS)
    assert len(COMPOSITIONS) == len(SELECTORS) * len(POLICY_LOSSES)


@pytest.mark.parametrize("name, policy_loss, aggregation, kl", COMPOSITIONS)
def test_selectors_compose_with_loss_variants(case, name, policy_loss, aggregation, kl):
    batch, stats, logp = case
    cfg = algorithm(policy_loss, aggregation, kl)
    resp = batch.rollouts.response_mask.float()
    selection = SELECTORS[name]().select(batch.selection_view(torch.arange(batch.size), stats))
    check_selection_is_real(name, selection, resp)

    whole = implementation(batch, stats, logp, selection, cfg)
    assert_matches(whole, reference(batch, stats, logp, selection, cfg), selection)
    # micro-batches of the selection's rows, with the mini-batch's normaliser, add up to the mini-batch
    shares = [
        implementation(batch, stats, logp, selection, cfg, rows)
        for rows in (torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4, 6, 7]))
    ]
    assert sum(share[0] for share in shares) == pytest.approx(whole[0], abs=1e-12)
    torch.testing.assert_close(shares[0][1] + shares[1][1], whole[1], rtol=1e-12, atol=1e-15)

    # zero the weight of the selected token with the largest policy-gradient gradient: that gradient becomes exactly 0
    pg_only = cfg.replace(kl_coef=0.0)
    _, pg_grad, _ = implementation(batch, stats, logp, selection, pg_only)
    candidates = torch.where(selection.weights != 0, pg_grad.abs(), torch.zeros_like(pg_grad))
    i, t = divmod(int(candidates.argmax()), candidates.shape[1])
    assert candidates[i, t] > 0
    weights = selection.weights.clone()
    weights[i, t] = 0.0
    dropped = dataclasses.replace(selection, weights=weights)
    _, pg_grad_dropped, _ = implementation(batch, stats, logp, dropped, pg_only)
    assert pg_grad_dropped[i, t] == 0.0
    after = implementation(batch, stats, logp, dropped, cfg)
    assert_matches(after, reference(batch, stats, logp, dropped, cfg), dropped)
    if selection.normalizer == "selected" and aggregation == "token-mean":
        assert after[2][0] == whole[2][0] - 1  # one selected token fewer in the divisor
    else:
        assert after[2][0] == whole[2][0] or aggregation == "seq-mean-token-mean"


@pytest.mark.parametrize("name", list(SELECTORS))
def test_the_normaliser_is_the_selectors_and_is_used(case, name):
    """The update counts the divisor the selector names (its `normalizer`, over the mini-batch), and the loss is
    linear in it: doubling the divisors halves a token-mean loss."""
    batch, stats, logp = case
    resp = batch.rollouts.response_mask.float()
    selection = SELECTORS[name]().select(batch.selection_view(torch.arange(batch.size), stats))
    chosen = (selection.weights != 0).float() * resp
    expected = {"selected": chosen, "all": resp}[selection.normalizer]
    assert selection.normalizer == SELECTORS[name]().normalizer
    cfg = algorithm("ppo", "token-mean", "k3_masked")
    counted = LossNormalizer.count(batch.rollouts.response_mask, selection, cfg.loss)
    kl_weights = chosen if selection.kl_weights is None else chosen * selection.kl_weights
    assert (counted.pg, counted.kl) == (float(expected.sum()), float(kl_weights.sum()))
    rows = torch.arange(batch.size)
    halves = []
    for scale in (1.0, 2.0):
        normalizer = dataclasses.replace(counted, pg=counted.pg * scale, kl=counted.kl * scale)
        out = UpdateLoss(batch, cfg.loss, None).micro_batch(
            rows, UpdateForward(logprobs=logp.clone()), stats.logprobs, selection, normalizer
        )
        halves.append(float(out.loss))
    assert halves[1] == pytest.approx(halves[0] / 2, rel=1e-12) and halves[0] != 0.0
    kept = float(((expected.sum(1)) > 0).sum())
    seq = LossNormalizer.count(
        batch.rollouts.response_mask, selection, algorithm("ppo", "seq-mean-token-mean", "off").loss
    )
    assert seq.pg == seq.kl == kept
    dr = LossNormalizer.count(
        batch.rollouts.response_mask, selection, algorithm("ppo", "seq-mean-token-sum-norm", "off").loss
    )
    assert dr.pg == dr.kl == float(batch.size * BUDGET)


@pytest.mark.parametrize("name, policy_loss, aggregation", FRACTIONALS)
def test_fractional_weights_reach_the_loss(case, name, policy_loss, aggregation):
    """A selection's weights are multipliers, not just a mask: the selector's weights times 0.25 / 0.5 / 1.5 (its other
    fields kept) give the loop's loss and gradient, and differ from the 0/1 selection's."""
    batch, stats, logp = case
    cfg = algorithm(policy_loss, aggregation, "k3_masked")
    selection = SELECTORS[name]().select(batch.selection_view(torch.arange(batch.size), stats))
    g = torch.Generator().manual_seed(7)
    scale = torch.tensor([0.25, 0.5, 1.5])[torch.randint(0, 3, selection.weights.shape, generator=g)]
    weighted = dataclasses.replace(selection, weights=selection.weights * scale)
    got = implementation(batch, stats, logp, weighted, cfg)
    assert_matches(got, reference(batch, stats, logp, weighted, cfg), weighted)
    assert got[2] == implementation(batch, stats, logp, selection, cfg)[2]  # the same divisors: counts of w ≠ 0
    assert not torch.allclose(got[1], implementation(batch, stats, logp, selection, cfg)[1])
