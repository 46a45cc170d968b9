"""Fused statistics (step/update.py, issue #15): with one epoch and one mini-batch the update takes π_old's
statistics from its own forward (`fused_update`). On a tiny random float64 Qwen2 and hand-built ragged
rollouts, the fused update must choose the same tokens, report the same loss and statistics and accumulate the same
gradient as the update with statistics from a separate no-grad pass — for every selector the fused path admits, with
several micro-batches for row-local selectors, both aggregations, with and without a KL term, with and without TIS.
`fused_blocker` must refuse exactly the settings where this cannot hold.

Float64 exactness needs one patch: transformers' Qwen2RMSNorm computes in float32 whatever the model's dtype, so the
layouts (a micro-batch's trimmed shared-prefix forward vs the statistics pass's) would differ by ~1e-7 and ties could
break differently. The `exact_norm` fixture computes the norm in the input's dtype; the rest is the real model.
`sdpa` attention: eager gives NaN rows under left padding in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn
from transformers import Qwen2ForCausalLM

from tests.helpers.grids import all_pairs, uncovered_pairs
from tests.helpers.qwen2 import float64_qwen2
from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.algorithms.grpo import group_advantages
from tokenrl.algorithms.logit_statistics import LogitStatistics
from tokenrl.models.response_forward import response_logits, sampled_logprobs
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
from tokenrl.step.fast_path import FastPath, ForwardPlan, fused_blocker
from tokenrl.step.passes import PolicyPasses
from tokenrl.step.train_batch import TrainBatch
from tokenrl.step.update import Backend, UpdateForward, UpdateRun, fused_update, ppo_update

VOCAB = 128
PAD, EOS = 0, 1
TEMPERATURE = 0.7
CHUNK = 7  # statistics chunk (tokens): several chunks per group, unequal to the micro-batch
STEP = 3  # past every selector's warm-up (all 0 here) and seeds the random control
SEVERAL = 5  # micro_batch_size with several micro-batches (≥ the largest group, not a multiple of any)
# (prompt length, [(response length, reward)]): a duplicated response (ties across rows), a group whose rewards are all
# equal (zero advantages), a group of one, a one-token response (EOS alone); groups' longest responses out of row order
# so that micro-batches by length reorder them
GROUPS = [
    (5, [(7, 1.0), (3, 0.0), (7, 1.0), (9, 0.5)]),
    (2, [(4, 1.0), (9, 1.0), (2, 1.0)]),
    (8, [(6, 1.0)]),
    (3, [(1, 0.0), (5, 1.0), (8, 0.0), (2, 1.0)]),
]
DUPLICATE = (0, 2)  # rows 0 and 2 hold the same response
GROUP_SIZE = max(len(rows) for _, rows in GROUPS)


pytestmark = pytest.mark.usefixtures("one_thread", "exact_norm")  # tests/conftest.py; exact_norm: the whole module


@pytest.fixture(scope="module")
def policy(exact_norm) -> Qwen2ForCausalLM:
    return tiny_float64_qwen2()


@pytest.fixture(scope="module")
def rollouts(policy) -> tuple[RolloutBatch, torch.Tensor]:
    return ragged_rollouts(policy)


def tiny_float64_qwen2() -> Qwen2ForCausalLM:
    """The tiny Qwen2 of `model=tiny` (GQA 4/2 heads, tied embeddings) in float64, with wider random weights so the
    distributions are not all near uniform."""
    wider = dict(hidden_size=64, intermediate_size=128, initializer_range=0.15)
    model = float64_qwen2(VOCAB, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD, **wider)
    return model.train()  # dropout is 0: train mode only to run as the update does


def ragged_rollouts(policy: Qwen2ForCausalLM) -> tuple[RolloutBatch, torch.Tensor]:
    """The hand-built ragged rollouts and their rewards; sampling log-probs near the policy's own (an engine that
    disagrees a little, so TIS weights vary and some are capped)."""
    g = torch.Generator().manual_seed(1)
    width_p = max(p for p, _ in GROUPS)
    width_t = max(n for _, rows in GROUPS for n, _ in rows)
    prompt_ids, prompt_mask, response_ids, response_mask, group_ids, rewards = [], [], [], [], [], []
    for group, (prompt_len, rows) in enumerate(GROUPS):
        prompt = torch.randint(2, VOCAB, (prompt_len,), generator=g)
        for length, reward in rows:
            prompt_ids.append(torch.cat([torch.full((width_p - prompt_len,), PAD), prompt]))
            prompt_mask.append((torch.arange(width_p) >= width_p - prompt_len).long())
            response = torch.full((width_t,), PAD)
            response[:length] = torch.randint(2, VOCAB, (length,), generator=g)
            if length < width_t:
                response[length - 1] = EOS
            response_ids.append(response)
            response_mask.append((torch.arange(width_t) < length).long())
            group_ids.append(group)
            rewards.append(reward)
    response_ids = torch.stack(response_ids)
    response_ids[DUPLICATE[1]] = response_ids[DUPLICATE[0]]
    rows = len(rewards)
    batch = RolloutBatch(
        torch.stack(prompt_ids),
        torch.stack(prompt_mask),
        response_ids,
        torch.stack(response_mask),
        torch.zeros(rows, width_t),
        torch.tensor(group_ids),
        ["stop" if int(m.sum()) < width_t else "length" for m in response_mask],
        [""] * rows,
        0,
    )
    with torch.no_grad():
        own = sampled_logprobs(response_logits(policy, batch), batch.response_ids, TEMPERATURE)
    noise = 0.4 * torch.randn(own.shape, generator=g)
    batch.sampling_logprobs = ((own + noise) * batch.response_mask).float()
    return batch, torch.tensor(rewards)


def algorithm(**settings) -> AlgorithmConfig:
    base = dict(
        group_size=GROUP_SIZE,
        prompts_per_step=len(GROUPS),
        micro_batch_size=SEVERAL,
        aggregation="token-mean",
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=None,
        kl_coef=0.0,
        kl_estimator="k3",
        kl_masked=True,
        adv_std_normalize=True,
        adv_eps=1e-6,
        ppo_epochs=1,
        mini_batches=1,
        grad_clip=None,
        overlong_buffer=0,
        overlong_penalty_factor=1.0,
        lr_warmup_steps=0,
        filter_groups=None,
        gen_prompts_per_step=len(GROUPS),
        max_gen_rounds=1,
        tis_cap=None,
        response_budget=16,
    )
    config = AlgorithmConfig.of(**{**base, **settings})
    config.validate(max_new_tokens=16)
    return config


@dataclass
class Recorder:
    """What a backend saw: the gradient just before each optimizer step, forwards asked with/without statistics."""

    grads: list[dict[str, torch.Tensor]]
    forwards: list[bool]


def recording_backend(
    policy: nn.Module, passes: PolicyPasses, cfg: AlgorithmConfig, forward=None
) -> tuple[Backend, Recorder]:
    """A plain backend (as tests/step/test_update.py's) whose optimizer step records the accumulated gradients and
    zeroes them instead of stepping, so both paths start from the same weights and their gradients can be compared."""
    record = Recorder([], [])
    forward = forward or passes.update_forward

    def counted_forward(part: RolloutBatch, with_stats: bool, with_entropy: bool) -> UpdateForward:
        record.forwards.append(with_stats)
        return forward(part, with_stats, with_entropy)

    @torch.no_grad()
    def scale_gradients(factor: float) -> None:
        for parameter in policy.parameters():
            if parameter.grad is not None:
                parameter.grad.mul_(factor)

    def optimizer_step() -> None:
        record.grads.append(
            {name: p.grad.detach().clone() for name, p in policy.named_parameters() if p.grad is not None}
        )
        policy.zero_grad(set_to_none=True)

    backend = Backend(
        forward=counted_forward,
        micro_batches=passes.plan.cut(with_grad=True),
        backward=lambda loss, last: loss.backward(),
        scale_gradients=scale_gradients,
        optimizer_step=optimizer_step,
        current_stats=lambda rows: passes.statistics(rows, with_js=False),
        reduce_normalizer=lambda local: local,
    )
    return backend, record


def float64_forward(policy: nn.Module, passes: PolicyPasses):
    """`PolicyPasses.update_forward` with the log-probs (and so the loss and its gradient) in float64:
    `sampled_logprobs` computes in float32 whatever the model's dtype, which would limit the gradients' agreement to
    float32 rounding (dividing the loss before vs the gradient after)."""

    plan = passes.plan

    def forward(part: RolloutBatch, with_stats: bool, with_entropy: bool = False) -> UpdateForward:
        logits = response_logits(policy, part, trim=plan.trim, layout=plan.layout(with_grad=True))
        width = logits.shape[1]
        logp = torch.log_softmax(logits / plan.temperature, -1).gather(-1, part.response_ids[:, :width, None])
        logp = nn.functional.pad(logp.squeeze(-1), (0, part.response_ids.shape[1] - width))
        stats = None
        if with_stats:
            statistics = LogitStatistics(plan.temperature, plan.stats_chunk_size, plan.js_peers)
            stats = statistics.of_logits(
                logits.detach(), part.response_ids, part.response_mask, part.group_ids, plan.with_js
            )
        return UpdateForward(logp, stats)

    return forward


def make_passes(policy, selector, cfg, layout="shared_prefix", trim=True, with_js=None) -> PolicyPasses:
    """The passes of `layout`, each micro-batch cut to its own widths and groups ordered by length with `trim`."""
    plan = ForwardPlan(
        TEMPERATURE,
        cfg.batch.micro_batch_size,
        CHUNK,
        "js" in selector.requires if with_js is None else with_js,
        selector.js_peers,
        cfg.batch.micro_batch_tokens,
        FastPath(layout, pack=trim),
    )
    return PolicyPasses(policy, None, plan)


def train_batch(rollouts: RolloutBatch, rewards: torch.Tensor, with_kl: bool) -> TrainBatch:
    advantages = group_advantages(rewards, rollouts.group_ids)
    ref = None
    if with_kl:  # a reference that disagrees with the policy token by token
        g = torch.Generator().manual_seed(2)
        ref = (rollouts.sampling_logprobs + 0.3 * torch.randn(rollouts.response_ids.shape, generator=g)).float()
        ref = ref * rollouts.response_mask
    return TrainBatch(STEP, rollouts, rewards, rewards, advantages, ref, row_offset=0)


def both_paths(
    policy, rollouts, rewards, selector, cfg, *, with_kl, layout="shared_prefix", trim=True, with_js=None, logp64=False
):
    """(separate result, its backend's record, the separate pass's statistics, fused result, its backend's record):
    the same policy, rollouts and settings, once with π_old's statistics from `PolicyPasses.statistics` (`ppo_update`)
    and once from the update's own forward (`fused_update`)."""
    passes = make_passes(policy, selector, cfg, layout, trim, with_js)
    forward = float64_forward(policy, passes) if logp64 else None
    policy.zero_grad(set_to_none=True)
    stats = passes.statistics(rollouts)
    backend, separate_record = recording_backend(policy, passes, cfg, forward)
    run = UpdateRun(selector, cfg, torch.Generator().manual_seed(0), passes.plan.with_js)
    separate = ppo_update(train_batch(rollouts, rewards, with_kl), stats, run, backend)
    backend, fused_record = recording_backend(policy, passes, cfg, forward)
    fused = fused_update(train_batch(rollouts, rewards, with_kl), run, backend)
    assert separate_record.forwards and not any(separate_record.forwards)
    assert fused_record.forwards and all(fused_record.forwards)
    assert len(separate_record.grads) == len(fused_record.grads) == 1  # one optimizer step each
    return separate, separate_record, stats, fused, fused_record


def assert_same_stats(got: TokenStats, expected: TokenStats, with_js: bool) -> None:
    assert (got.js is not None) == with_js and (expected.js is not None) == with_js
    for name in ("logprobs", "entropy", "renyi2") + (("js",) if with_js else ()):
        torch.testing.assert_close(getattr(got, name), getattr(expected, name), rtol=1e-6, atol=1e-6, msg=name)


def assert_same_grads(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rtol: float) -> None:
    assert got.keys() == expected.keys()
    scale = max(float(g.abs().max()) for g in expected.values())
    assert scale > 0
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=rtol, atol=rtol * scale, msg=name)


# (id, selector factory, micro_batch_size): row-local selectors over several micro-batches, the others over one
SELECTORS = [
    ("uniform", lambda: UniformSelector(), SEVERAL),
    ("ict", lambda: ICTSelector(ratio=0.3, scope="sequence", warmup_steps=0), SEVERAL),
    ("ict_others", lambda: ICTSelector(ratio=0.3, scope="sequence", warmup_steps=0, js_peers="others"), SEVERAL),
    ("ict_complement", lambda: ICTComplementSelector(ratio=0.3, scope="sequence", warmup_steps=0), SEVERAL),
    ("random", lambda: RandomSelector(ratio=0.3, warmup_steps=0, seed=5), SEVERAL),
    ("entropy20_sequence", lambda: Entropy20Selector(scope="sequence"), SEVERAL),
    ("entropy20_batch", lambda: Entropy20Selector(scope="batch"), 16),
    ("stapo", lambda: STAPOSelector(tau_p=0.008, q=0.5), 16),
]


# each selector with two settings of (aggregation, KL, TIS), together every pair of any two settings (16 rows, not 64)
FUSED_FACTORS = ([s[0] for s in SELECTORS], ["token-mean", "seq-mean-token-mean"], [False, True], [None, 1.3])
FUSED_ROWS = all_pairs(*FUSED_FACTORS)


def test_the_grid_holds_every_pair_of_settings():
    assert not uncovered_pairs(FUSED_ROWS, FUSED_FACTORS) and len(FUSED_ROWS) == 2 * len(SELECTORS)
    assert not uncovered_pairs(METHOD_ROWS, METHOD_FACTORS)


@pytest.mark.parametrize(
    "name, aggregation, with_kl, tis_cap",
    FUSED_ROWS,
    ids=[f"{n}-{a}-{'kl' if k else 'no_kl'}-{'tis' if t else 'no_tis'}" for n, a, k, t in FUSED_ROWS],
)
def test_fused_update_equals_the_update_with_a_separate_statistics_pass(
    policy, rollouts, name, aggregation, with_kl, tis_cap
):
    batch, rewards = rollouts
    make_selector, micro = {s[0]: s[1:] for s in SELECTORS}[name]
    selector = make_selector()
    cfg = algorithm(
        micro_batch_size=micro,
        aggregation=aggregation,
        kl_coef=0.05 if with_kl else 0.0,
        kl_masked=True,
        tis_cap=tis_cap,
    )
    with_js = "js" in selector.requires
    assert fused_blocker(cfg, selector, with_js, batch.response_ids.shape[0]) is None
    separate, separate_run, stats, fused, fused_run = both_paths(policy, batch, rewards, selector, cfg, with_kl=with_kl)
    assert separate.optimizer_steps == fused.optimizer_steps == 1
    # one micro-batch, or three: rows 5 | 5 | 2 (groups split), or whole groups of 4 | 3 | 4 + 1 rows (JS)
    assert len(fused_run.forwards) == (1 if micro >= len(batch.texts) else 3)
    # the same tokens, and a real choice: some but (a sparse selector) not all of the response tokens
    response = batch.response_mask.float()
    assert torch.equal(fused.first_epoch_weights, separate.first_epoch_weights)
    assert 0 < fused.first_epoch_weights.sum() <= response.sum()
    if name != "uniform":
        assert fused.first_epoch_weights.sum() < response.sum()
    # the same statistics as the separate pass and as statistics of the whole batch's logits in one padded forward
    assert separate.stats is stats and not separate.fused_statistics and fused.fused_statistics
    assert_same_stats(fused.stats, stats, with_js)
    with torch.no_grad():
        logits = response_logits(policy, batch)
    assert_same_stats(
        fused.stats,
        LogitStatistics(TEMPERATURE, CHUNK, selector.js_peers).of_logits(
            logits, batch.response_ids, batch.response_mask, batch.group_ids, with_js
        ),
        with_js,
    )
    # the same metrics (loss, clip fraction, TIS weights) and gradients
    assert fused.metrics.keys() == separate.metrics.keys()
    assert ("tis_weight_mean" in fused.metrics) == (tis_cap is not None)
    for key, value in separate.metrics.items():
        assert fused.metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    if tis_cap is not None:
        assert 0 < fused.metrics["tis_capped_frac"] < 1
    assert_same_grads(fused_run.grads[0], separate_run.grads[0], rtol=1e-5)


@pytest.mark.parametrize("name, make_selector, micro", SELECTORS, ids=[s[0] for s in SELECTORS])
def test_fused_gradients_agree_to_float64_rounding_with_float64_log_probs(policy, rollouts, name, make_selector, micro):
    """With the update's log-probs in float64 the only difference left between the paths is where the normaliser
    divides (the loss before backward vs the gradient after): the gradients agree to ~1e-12."""
    batch, rewards = rollouts
    selector = make_selector()
    cfg = algorithm(micro_batch_size=micro, kl_coef=0.05, tis_cap=1.3)
    separate, separate_run, _, fused, fused_run = both_paths(
        policy, batch, rewards, selector, cfg, with_kl=True, logp64=True
    )
    assert torch.equal(fused.first_epoch_weights, separate.first_epoch_weights)
    assert fused.metrics["loss"] == pytest.approx(separate.metrics["loss"], rel=1e-12)
    assert_same_grads(fused_run.grads[0], separate_run.grads[0], rtol=1e-10)


# (id, selector factory, micro_batch_size, algorithm settings): the methods of docs/algorithms.md §11 — per-token clip
# and KL weights, token advantages, drift penalties, detached tokens, the entropy bonus, GSPO and CISPO
METHODS = [
    ("archer", lambda: ArcherSelector(), SEVERAL, {}),
    ("gtpo", lambda: GTPOSelector(), SEVERAL, {}),
    ("clip_cov", lambda: ClipCovSelector(ratio=0.05, cov_low=-10.0, cov_high=10.0, seed=3), 16, {}),
    ("kl_cov", lambda: KLCovSelector(ratio=0.1), 16, {}),
    ("entropy_bonus", lambda: UniformSelector(), SEVERAL, {"entropy_coef": 0.01}),
    (
        "ict_entropy_bonus_selected",
        lambda: ICTSelector(ratio=0.3, warmup_steps=0),
        SEVERAL,
        {"entropy_coef": 0.01, "entropy_masked": True},
    ),
    ("gspo", lambda: UniformSelector(), SEVERAL, {"policy_loss": "gspo"}),
    ("cispo", lambda: ICTSelector(ratio=0.3, warmup_steps=0), SEVERAL, {"policy_loss": "cispo", "clip_low": 1.0}),
    (
        "dr_grpo",
        lambda: Entropy20Selector(scope="sequence"),
        SEVERAL,
        {"aggregation": "seq-mean-token-sum-norm", "adv_std_normalize": False},
    ),
]


METHOD_FACTORS = ([m[0] for m in METHODS], ["token-mean", "seq-mean-token-mean"], [False, True])
METHOD_ROWS = all_pairs(*METHOD_FACTORS)  # each method with both settings of each factor


@pytest.mark.parametrize(
    "name, aggregation, with_kl", METHOD_ROWS, ids=[f"{n}-{a}-{'kl' if k else 'no_kl'}" for n, a, k in METHOD_ROWS]
)
def test_fused_update_equals_the_separate_pass_for_every_token_level_method(
    policy, rollouts, name, aggregation, with_kl
):
    """Where `fused_blocker` admits a method, its fused update chooses the same weights and per-token fields, and
    gives the same loss and gradients as the separate pass; where it refuses, the reason names the divisors."""
    batch, rewards = rollouts
    make_selector, micro, settings = {m[0]: m[1:] for m in METHODS}[name]
    selector = make_selector()
    cfg = algorithm(
        micro_batch_size=micro, **{"aggregation": aggregation, **settings}, kl_coef=0.05 if with_kl else 0.0
    )
    blocker = fused_blocker(cfg, selector, "js" in selector.requires, batch.response_ids.shape[0])
    selected = selector.normalizer == "selected"  # token-mean divides each term by its own count of tokens
    if cfg.loss.aggregation == "token-mean" and (
        (with_kl and (not selected or selector.weighs_kl))
        or (cfg.uses_entropy_bonus and cfg.loss.entropy_masked != selected)
    ):
        assert blocker is not None and "different token counts" in blocker
        return
    assert blocker is None
    separate, separate_run, _, fused, fused_run = both_paths(policy, batch, rewards, selector, cfg, with_kl=with_kl)
    assert torch.equal(fused.first_epoch_weights, separate.first_epoch_weights)
    assert fused.first_epoch_shaping.keys() == separate.first_epoch_shaping.keys()
    for field_name, values in separate.first_epoch_shaping.items():
        torch.testing.assert_close(fused.first_epoch_shaping[field_name], values, rtol=1e-6, atol=1e-6, msg=field_name)
    for key, value in separate.metrics.items():  # GTPO's loss is ~0 at r = 1 (standardised advantages): abs 1e-7
        assert fused.metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    assert_same_grads(fused_run.grads[0], separate_run.grads[0], rtol=1e-5)


def test_token_level_methods_set_the_fields_they_promise(policy, rollouts):
    """The fused update records what each method sets (the samples page shows it): per-token ε for Archer, token
    advantages for GTPO, drift coefficients and unbounded ratios for KL-Cov, detached tokens for Clip-Cov."""
    batch, rewards = rollouts
    response = batch.response_mask.float()
    found = {}
    for name, make_selector, micro, settings in METHODS[:4]:
        cfg = algorithm(micro_batch_size=micro, **settings)
        fused = fused_update(
            train_batch(batch, rewards, False),
            UpdateRun(make_selector(), cfg, torch.Generator().manual_seed(0), True),
            recording_backend(policy, make_passes(policy, make_selector(), cfg), cfg)[0],
        )
        found[name] = (fused.first_epoch_weights, fused.first_epoch_shaping)
    weights, shaping = found["archer"]
    assert torch.equal(weights, response) and set(shaping) == {"clip_high", "kl_weights"}
    assert torch.equal(shaping["clip_high"][response.bool()].unique(), torch.tensor([0.2, 0.5]))
    weights, shaping = found["gtpo"]
    assert set(shaping) == {"advantages"} and shaping["advantages"].abs().sum() > 0
    weights, shaping = found["kl_cov"]
    assert set(shaping) == {"clip_high", "drift_coef"} and torch.isinf(shaping["clip_high"][response.bool()]).all()
    assert shaping["drift_coef"].sum() == pytest.approx(max(int(0.1 * response.sum()), 1))
    weights, shaping = found["clip_cov"]
    assert shaping == {} and response.sum() - weights.sum() == max(int(0.05 * response.sum()), 1)


@pytest.mark.parametrize(
    "layout, trim",
    [("padded", False), ("shared_prefix", False), ("padded", True), ("packed", True)],
    ids=["padded_rows", "shared_prefix_full_width", "padded_trimmed_by_length", "packed_trimmed_by_length"],
)
@pytest.mark.parametrize("micro", [1, 2, SEVERAL, 16])
def test_fused_update_in_every_layout_and_micro_batch_size(policy, rollouts, layout, trim, micro):
    """ICT (JS over whole groups) in each layout and micro-batch size, with an unmasked KL term under
    seq-mean-token-mean (one divisor for both terms). A micro-batch of a JS selector holds whole groups, so sizes below
    the group size are exact too, though `fused_blocker` refuses them (such micro-batches outgrow the setting)."""
    batch, rewards = rollouts
    selector = ICTSelector(ratio=0.3, scope="sequence", warmup_steps=0)
    cfg = algorithm(micro_batch_size=micro, aggregation="seq-mean-token-mean", kl_coef=0.05, kl_masked=False)
    separate, separate_run, stats, fused, fused_run = both_paths(
        policy, batch, rewards, selector, cfg, with_kl=True, layout=layout, trim=trim
    )
    assert torch.equal(fused.first_epoch_weights, separate.first_epoch_weights)
    assert_same_stats(fused.stats, stats, True)
    assert fused.metrics["loss"] == pytest.approx(separate.metrics["loss"], rel=1e-6)
    assert_same_grads(fused_run.grads[0], separate_run.grads[0], rtol=1e-5)


def test_duplicate_rows_tie_and_lone_rows_have_zero_js(policy, rollouts):
    """The batch really holds the ties the comparison is meant to cover."""
    batch, _ = rollouts
    selector = ICTSelector(warmup_steps=0)
    stats = make_passes(policy, selector, algorithm()).statistics(batch)
    a, b = DUPLICATE
    assert torch.equal(stats.entropy[a], stats.entropy[b]) and torch.equal(stats.js[a], stats.js[b])
    lone = (batch.group_ids == 2).nonzero().squeeze(1)
    assert lone.numel() == 1 and stats.js[lone].abs().sum() == 0  # a group of one: JS = 0 everywhere
    assert int(batch.response_mask.sum(1).min()) == 1
    advantages = group_advantages(rollouts[1], batch.group_ids)
    assert advantages[batch.group_ids == 1].abs().sum() == 0  # equal rewards: zero advantages


def test_fused_js_for_diagnostics_is_the_whole_groups_js(policy, rollouts):
    """`diagnostics.js` with the uniform selector: the step's JS (logged quantiles, samples) must be the groups'."""
    batch, rewards = rollouts
    selector = UniformSelector()
    cfg = algorithm(micro_batch_size=SEVERAL)  # ≥ every group, not a multiple of their sizes: rows 5 | 5 | 2
    assert fused_blocker(cfg, selector, True, batch.response_ids.shape[0]) is None
    separate, separate_run, stats, fused, fused_run = both_paths(
        policy, batch, rewards, selector, cfg, with_kl=False, with_js=True
    )
    assert_same_grads(fused_run.grads[0], separate_run.grads[0], rtol=1e-5)
    assert_same_stats(fused.stats, stats, True)  # micro-batches of whole groups although the selector reads no JS


# ------------------------------------------------------------------------------------------------ fused_blocker
ICT = ICTSelector(warmup_steps=0)
ROWS = 12


@pytest.mark.parametrize(
    "settings, selector, with_js, rows, names",
    [
        (dict(ppo_epochs=2), UniformSelector(), False, ROWS, ["algorithm.ppo_epochs", "2 optimizer steps"]),
        (dict(mini_batches=2), UniformSelector(), False, ROWS, ["mini_batches", "2 optimizer steps"]),
        (dict(ppo_epochs=2, mini_batches=3), ICT, True, 4, ["6 optimizer steps"]),
        (
            dict(micro_batch_size=4),
            Entropy20Selector(scope="global"),
            False,
            ROWS,
            ["entropy20", "algorithm.micro_batch_size=4"],
        ),
        (dict(micro_batch_size=4), Entropy20Selector(scope="batch"), False, ROWS, ["entropy20", "micro_batch_size=4"]),
        (dict(micro_batch_size=4), STAPOSelector(), False, ROWS, ["stapo", "algorithm.micro_batch_size=4"]),
        (dict(micro_batch_size=4), ICTSelector(scope="batch"), True, ROWS, ["ict", "algorithm.micro_batch_size=4"]),
        (dict(micro_batch_size=3), ICT, True, ROWS, ["JS", "algorithm.micro_batch_size=3"]),
        (
            dict(micro_batch_size=3),
            UniformSelector(),
            True,
            ROWS,
            ["JS", "algorithm.micro_batch_size=3"],
        ),  # diagnostics
        (
            dict(kl_coef=0.1, kl_masked=False),
            UniformSelector(),
            False,
            ROWS,
            ["algorithm.kl_masked=False", "selector.normalizer=selected"],
        ),
        (
            dict(kl_coef=0.1, kl_masked=True),
            UniformSelector(normalizer="all"),
            False,
            ROWS,
            ["algorithm.kl_masked=True", "selector.normalizer=all"],
        ),
    ],
    ids=[
        "ppo_epochs",
        "mini_batches",
        "both",
        "entropy20_global",
        "entropy20_batch",
        "stapo",
        "ict_batch",
        "js_group_split",
        "js_diagnostics_group_split",
        "kl_unmasked",
        "pg_over_all",
    ],
)
def test_fused_blocker_names_the_setting(settings, selector, with_js, rows, names):
    reason = fused_blocker(algorithm(**settings), selector, with_js, rows)
    assert reason is not None
    for name in names:
        assert name in reason, (name, reason)


@pytest.mark.parametrize(
    "settings, selector, with_js, rows",
    [
        (dict(), UniformSelector(), False, ROWS),
        (dict(micro_batch_size=4), ICT, True, ROWS),  # micro-batch = group size
        (dict(micro_batch_size=1), UniformSelector(), False, ROWS),  # row-local, no JS
        (dict(micro_batch_size=1), RandomSelector(warmup_steps=0), False, ROWS),
        (dict(micro_batch_size=4), Entropy20Selector(scope="sequence"), False, ROWS),
        (dict(micro_batch_size=ROWS), Entropy20Selector(scope="global"), False, ROWS),  # one micro-batch
        (dict(micro_batch_size=16), STAPOSelector(), False, ROWS),
        (dict(micro_batch_size=2), ICTSelector(scope="batch"), True, 2),  # one micro-batch of its rows
        (dict(kl_coef=0.1, kl_masked=True), UniformSelector(), False, ROWS),  # both divide by the selected
        (dict(kl_coef=0.1, kl_masked=False), UniformSelector(normalizer="all"), False, ROWS),  # both by every token
        (dict(kl_coef=0.1, kl_masked=False, aggregation="seq-mean-token-mean"), UniformSelector(), False, ROWS),
        (dict(kl_coef=0.0, kl_masked=False), UniformSelector(), False, ROWS),  # no KL term
    ],
    ids=[
        "default",
        "ict_micro_eq_group",
        "uniform_micro_1",
        "random_micro_1",
        "entropy20_sequence",
        "entropy20_one_micro",
        "stapo_one_micro",
        "ict_batch_one_micro",
        "kl_masked_selected",
        "kl_unmasked_all",
        "seq_mean_kl_unmasked",
        "no_kl",
    ],
)
def test_fused_blocker_allows(settings, selector, with_js, rows):
    assert fused_blocker(algorithm(**settings), selector, with_js, rows) is None
