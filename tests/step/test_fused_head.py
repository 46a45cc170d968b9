"""`fast_path.fused_head` wired into the passes (step/passes.py, step/statistics.py, step/fast_path.py): on a tiny
random float64 Qwen2 (tied and untied head) and hand-built ragged rollouts, the update's forward through the fused head
gives the log-probs, the entropy and their gradients w.r.t. every parameter of the float64 full-logits computation
(to 1e-10), and its statistics, the statistics pass and the reference pass give the float64 loop reference's values
(stored in float32, as `TokenStats` holds them); the record resolves `auto` on a GPU only and the run's line says so."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Qwen2ForCausalLM

from tests.helpers.qwen2 import float64_qwen2
from tests.selectors.test_selectors import reference_stats
from tokenrl.models.response_forward import response_logits, shannon_entropy
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.step.fast_path import FastPath, ForwardPlan, fused_head_blocker
from tokenrl.step.passes import PolicyPasses

VOCAB, PAD, EOS = 96, 0, 1
TEMPERATURE = 0.7
GROUPS = [(5, [7, 3, 7, 9]), (2, [4, 9, 2]), (8, [6]), (3, [1, 5, 8, 2])]  # (prompt length, response lengths)
TOL = dict(atol=1e-10, rtol=1e-10)
STORED = dict(atol=2e-6, rtol=1e-6)  # float32 storage of TokenStats

pytestmark = pytest.mark.usefixtures("one_thread", "exact_norm")  # tests/conftest.py; exact_norm: the whole module


def make_policy(tied: bool) -> Qwen2ForCausalLM:
    """The tiny float64 Qwen2 (tests/helpers/qwen2.py), its head tied or not, with this module's special tokens."""
    special = dict(bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    return float64_qwen2(VOCAB, tie_word_embeddings=tied, **special).train()


def make_rollouts() -> RolloutBatch:
    g = torch.Generator().manual_seed(1)
    width_p = max(p for p, _ in GROUPS)
    width_t = max(n for _, rows in GROUPS for n in rows)
    prompt_ids, prompt_mask, response_ids, response_mask, group_ids = [], [], [], [], []
    for group, (prompt_len, rows) in enumerate(GROUPS):
        prompt = torch.randint(2, VOCAB, (prompt_len,), generator=g)
        for length in rows:
            prompt_ids.append(torch.cat([torch.full((width_p - prompt_len,), PAD), prompt]))
            prompt_mask.append((torch.arange(width_p) >= width_p - prompt_len).long())
            response = torch.full((width_t,), PAD)
            response[:length] = torch.randint(2, VOCAB, (length,), generator=g)
            response_ids.append(response)
            response_mask.append((torch.arange(width_t) < length).long())
            group_ids.append(10 * group + 3)
    rows = len(group_ids)
    return RolloutBatch(
        torch.stack(prompt_ids),
        torch.stack(prompt_mask),
        torch.stack(response_ids),
        torch.stack(response_mask),
        torch.zeros(rows, width_t),
        torch.tensor(group_ids),
        ["stop"] * rows,
        [""] * rows,
        0,
    )


def passes_of(policy, fused: bool, layout: str, trim: bool, peers: str = "all") -> PolicyPasses:
    fast_path = FastPath(layout, pack=trim, fused_head=fused)
    plan = ForwardPlan(
        TEMPERATURE, micro_batch_size=5, stats_chunk_size=7, with_js=True, js_peers=peers, fast_path=fast_path
    )
    return PolicyPasses(policy, policy, plan.resolved(policy))  # the reference pass over the policy itself


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("layout", [("padded", False), ("shared_prefix", True), ("packed", True)])
@pytest.mark.parametrize("peers", ["all", "others"])
def test_update_forward_equals_the_float64_materialised_head(exact_norm, tied, layout, peers):
    policy, batch = make_policy(tied), make_rollouts()
    layout, trim = layout
    g = torch.Generator().manual_seed(5)
    coef = torch.randn(2, *batch.response_ids.shape, generator=g, dtype=torch.float64) * batch.response_mask

    def run(fused: bool):
        policy.zero_grad(set_to_none=True)
        if fused:
            forward = passes_of(policy, True, layout, trim, peers).update_forward(batch, True, True)
            logp, entropy, stats = forward.logprobs, forward.entropy, forward.stats
        else:  # the materialised head in float64 (the update's own path casts to float32)
            logits = response_logits(policy, batch, trim=trim, layout=layout)
            log_pi = torch.log_softmax(logits / TEMPERATURE, -1)
            pad = (0, batch.response_ids.shape[1] - logits.shape[1])
            ids = batch.response_ids[:, : logits.shape[1], None]
            logp = nn.functional.pad(log_pi.gather(-1, ids).squeeze(-1), pad)
            entropy = nn.functional.pad(shannon_entropy(log_pi), pad)
            stats = None
        ((coef[0] * logp).sum() + (coef[1] * entropy).sum()).backward()
        grads = {name: p.grad.clone() for name, p in policy.named_parameters()}
        return logp.detach(), entropy.detach(), stats, grads

    logp, entropy, stats, grads = run(True)
    ref_logp, ref_entropy, _, ref_grads = run(False)
    mask = batch.response_mask.bool()
    assert logp.dtype == torch.float64
    assert torch.allclose(logp[mask], ref_logp[mask], **TOL) and torch.allclose(entropy[mask], ref_entropy[mask], **TOL)
    for name, grad in grads.items():
        assert torch.allclose(grad, ref_grads[name], **TOL), name
    with torch.no_grad():
        logits = response_logits(policy, batch)
    ref = reference_stats(
        logits, batch.response_ids, batch.response_mask.sum(1).tolist(), batch.group_ids.tolist(), TEMPERATURE, peers
    )
    for name in ("logprobs", "entropy", "renyi2", "js"):
        got = getattr(stats, name)
        assert got.dtype == torch.float32 and torch.equal(got[~mask], torch.zeros_like(got[~mask])), name
        assert torch.allclose(got.double(), ref[name], **STORED), name


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("layout", [("padded", False), ("shared_prefix", True), ("packed", True)])
def test_statistics_and_reference_passes_equal_the_float64_reference(exact_norm, tied, layout):
    policy, batch = make_policy(tied), make_rollouts()
    fused, materialised = passes_of(policy, True, *layout), passes_of(policy, False, *layout)
    stats = fused.statistics(batch)
    with torch.no_grad():
        logits = response_logits(policy, batch)
    lengths, groups = batch.response_mask.sum(1).tolist(), batch.group_ids.tolist()
    ref = reference_stats(logits, batch.response_ids, lengths, groups, TEMPERATURE, "all")
    for name in ("logprobs", "entropy", "renyi2", "js"):
        assert torch.allclose(getattr(stats, name).double(), ref[name], **STORED), name
    no_js = fused.statistics(batch, with_js=False)
    assert no_js.js is None and torch.equal(no_js.entropy, stats.entropy)
    mask = batch.response_mask.bool()  # the reference pass, as always, leaves padding's values to the loss's mask
    assert torch.allclose(fused.reference_logprobs(batch).double()[mask], ref["logprobs"][mask], **STORED)
    assert torch.allclose(fused.reference_logprobs(batch), materialised.reference_logprobs(batch), atol=1e-6)


def test_auto_is_on_a_gpu_only_and_the_run_says_where_the_head_is_fused():
    on_cpu, on_gpu = FastPath.from_node({"fused_head": "auto"}), FastPath.from_node({"fused_head": "auto"}, True)
    assert not on_cpu.fused_head and on_gpu.fused_head and on_cpu.fused_head_auto
    assert on_cpu == FastPath() and FastPath.from_node({"fused_head": True}).fused_head
    with pytest.raises(ValueError, match=r"fast_path\.fused_head='yes' must be true or false or auto"):
        FastPath.from_node({"fused_head": "yes"})
    policy = make_policy(True)
    off = ForwardPlan(1.0, 4, 8, fast_path=on_cpu).resolved(policy)
    assert not off.fuses_head(with_grad=True) and not off.fuses_head(with_grad=False)
    assert "LM head" not in off.describe(None)  # off: the line is as it always was
    plan = ForwardPlan(1.0, 4, 8, fast_path=on_gpu).resolved(policy)
    assert plan.fuses_head(with_grad=True) and plan.fuses_head(with_grad=False)
    assert plan.describe(None).endswith("; LM head fused over vocabulary chunks")


def test_a_head_that_is_not_a_plain_linear_is_materialised():
    class Wrapped(nn.Linear):  # an adapter-wrapped head (PEFT's lora.Linear is not an nn.Linear subclass either)
        pass

    policy = make_policy(False)
    policy.lm_head = Wrapped(32, VOCAB, bias=False).to(torch.float64)
    assert "not a plain nn.Linear" in fused_head_blocker(policy)
    plan = ForwardPlan(1.0, 4, 8, fast_path=FastPath(fused_head=True)).resolved(policy)
    assert not plan.fuses_head(with_grad=True) and plan.describe(None).endswith(
        "; LM head materialised (the output head is a Wrapped, not a plain nn.Linear)"
    )
    batch = make_rollouts()
    fused, materialised = passes_of(policy, True, "padded", True), passes_of(policy, False, "padded", True)
    with torch.no_grad():
        assert torch.equal(
            fused.update_forward(batch, False).logprobs, materialised.update_forward(batch, False).logprobs
        )
