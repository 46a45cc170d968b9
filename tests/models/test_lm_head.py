"""models/lm_head.py: the fused, chunked LM head against the full-materialisation computation in float64 — values
against the float64 loop reference of the statistics (tests/selectors/test_selectors.py::reference_stats), gradients
of log π and H w.r.t. the hidden states, the head's weight (tied to the embedding or not) and a bias against autograd
through the full logits — on ragged groups, for chunk sizes that divide the vocabulary and ones that do not."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.markers import requires_cuda
from tests.selectors.test_selectors import reference_stats
from tokenrl.models.lm_head import ChunkedHead, fused_head, response_slots, vocab_chunk

V, D = 37, 6
TOL = dict(atol=1e-10, rtol=1e-10)


def ragged_case(seed, group_size=4, groups=3, T=7):
    """float64 embedding E (V, D), a mixing matrix A, token ids, response targets and masks (prefixes, ragged; some
    positions with one active rollout), group ids."""
    g = torch.Generator().manual_seed(seed)
    B = group_size * groups
    embedding = torch.randn(V, D, generator=g, dtype=torch.float64)
    mix = torch.randn(D, D, generator=g, dtype=torch.float64) * 1.5
    inputs = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T
    lengths[group_size] = T  # the second group has a tail where one rollout alone is active
    lengths[group_size + 1 : 2 * group_size] = torch.clamp(lengths[group_size + 1 : 2 * group_size], max=T - 2)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    group_ids = torch.arange(groups).repeat_interleave(group_size) * 3 + 1  # ids need not be 0..n−1
    return embedding, mix, inputs, targets, mask, lengths.tolist(), group_ids


def hidden_of(embedding, mix, inputs):
    """(B, T, D) hidden states from the (possibly tied) embedding: a smooth function, so gradients reach E twice."""
    return torch.tanh(embedding[inputs] @ mix) * 2.0


def full_materialisation(hidden, weight, bias, targets, temperature):
    """(B, T) log π(o) and H with gradient from the full (B, T, V) logits in float64 (the update's path)."""
    logits = hidden @ weight.t() + (0 if bias is None else bias)
    log_pi = torch.log_softmax(logits / temperature, -1)
    logp = log_pi.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(log_pi.exp() * log_pi).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("chunk", [1, 5, 8, V, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("peers", ["all", "others"])
def test_values_equal_the_float64_reference(seed, chunk, temperature, peers):
    embedding, mix, inputs, targets, mask, lengths, group_ids = ragged_case(seed)
    hidden = hidden_of(embedding, mix, inputs)
    B, T = targets.shape
    out = fused_head(
        hidden.reshape(B * T, D),
        ChunkedHead(embedding, temperature, chunk=chunk),
        targets.reshape(-1),
        groups=response_slots(group_ids, T, mask, peers),
    )
    ref = reference_stats(hidden @ embedding.t(), targets, lengths, group_ids.tolist(), temperature, peers)
    active = mask.bool()
    for name in ("logprobs", "entropy", "renyi2"):
        got = getattr(out, name).reshape(B, T)
        assert got.dtype == torch.float64
        assert torch.allclose(got[active], ref[name][active], **TOL), name
    assert torch.allclose(out.js.reshape(B, T), ref["js"], **TOL)  # 0 where inactive or alone, as the reference
    assert (ref["js"][active] > 0).any() and (ref["js"][active] == 0).any()  # both cases are exercised


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 6, V, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy_weight", [0.0, 0.3])
def test_gradients_equal_full_materialisation(tied, with_bias, chunk, temperature, entropy_weight):
    embedding, mix, inputs, targets, mask, _, _ = ragged_case(3)
    g = torch.Generator().manual_seed(11)
    B, T = targets.shape
    head = embedding if tied else torch.randn(V, D, generator=g, dtype=torch.float64)
    bias = torch.randn(V, generator=g, dtype=torch.float64) if with_bias else None
    coef_logp = torch.randn(B, T, generator=g, dtype=torch.float64) * mask
    coef_entropy = torch.randn(B, T, generator=g, dtype=torch.float64) * mask * entropy_weight

    def grads(fused: bool):
        leaves = [embedding.clone().requires_grad_(), mix.clone().requires_grad_()]
        weight = leaves[0] if tied else head.clone().requires_grad_()
        leaves += [] if tied else [weight]
        if bias is not None:
            leaves.append(bias.clone().requires_grad_())
        hidden = hidden_of(leaves[0], leaves[1], inputs)
        hidden.retain_grad()
        b = leaves[-1] if bias is not None else None
        if fused:
            out = fused_head(hidden.reshape(B * T, D), ChunkedHead(weight, temperature, b, chunk), targets.reshape(-1))
            logp, entropy = out.logprobs.reshape(B, T), out.entropy.reshape(B, T)
        else:
            logp, entropy = full_materialisation(hidden, weight, b, targets, temperature)
        loss = (coef_logp * logp).sum() + (coef_entropy * entropy).sum() if entropy_weight else (coef_logp * logp).sum()
        loss.backward()
        return [hidden.grad] + [leaf.grad for leaf in leaves], logp.detach(), entropy.detach()

    got, logp, entropy = grads(True)
    want, ref_logp, ref_entropy = grads(False)
    assert torch.allclose(logp, ref_logp, **TOL) and torch.allclose(entropy, ref_entropy, **TOL)
    for name, a, b in zip(["hidden", "embedding", "mix", "head", "bias"][: len(got)], got, want):
        assert torch.allclose(a, b, **TOL), name


def test_gradient_of_the_entropy_alone_and_a_frozen_head():
    """Only H carries gradient (log π unused), and the head's weight needs none (a frozen or adapter-only head)."""
    embedding, mix, inputs, targets, _, _, _ = ragged_case(5)
    hidden = hidden_of(embedding, mix, inputs).reshape(-1, D).requires_grad_()
    out = fused_head(hidden, ChunkedHead(embedding, 0.8, chunk=9), targets.reshape(-1))
    (grad,) = torch.autograd.grad(out.entropy.sum(), hidden)
    ref_hidden = hidden.detach().clone().requires_grad_()
    _, entropy = full_materialisation(ref_hidden, embedding, None, targets.reshape(-1), 0.8)
    (ref,) = torch.autograd.grad(entropy.sum(), ref_hidden)
    assert torch.allclose(grad, ref, **TOL)


def test_float32_agrees_with_float64_and_statistics_are_detached():
    embedding, mix, inputs, targets, mask, _, group_ids = ragged_case(2)
    hidden = hidden_of(embedding, mix, inputs)
    B, T = targets.shape
    slots = response_slots(group_ids, T, mask, "all")
    exact = fused_head(hidden.reshape(-1, D), ChunkedHead(embedding, 0.7, chunk=8), targets.reshape(-1), slots)
    single = fused_head(
        hidden.float().reshape(-1, D).requires_grad_(),
        ChunkedHead(embedding.float(), 0.7, chunk=8),
        targets.reshape(-1),
        groups=slots,
    )
    assert single.logprobs.dtype == torch.float32 and single.logprobs.requires_grad
    assert not single.renyi2.requires_grad and not single.js.requires_grad
    for name in ("logprobs", "entropy", "renyi2", "js"):
        assert torch.allclose(getattr(single, name).double(), getattr(exact, name), atol=2e-5), name


def test_vocab_chunk_bounds_the_buffer():
    assert vocab_chunk(16384, 151936) == 512
    assert vocab_chunk(10, 151936) == 151936 and vocab_chunk(10, 37) == 37
    assert vocab_chunk(10**9, 151936) == 64
    with pytest.raises(ValueError, match="peers"):
        fused_head(
            torch.zeros(2, D),
            ChunkedHead(torch.zeros(V, D), 1.0),
            torch.zeros(2, dtype=torch.long),
            groups=response_slots(torch.zeros(2, dtype=torch.long), 1, torch.ones(2, 1), "mine"),
        )


@requires_cuda
@pytest.mark.parametrize("autocast", [False, True])
def test_no_host_synchronisation_on_a_gpu(autocast):
    """Forward (with JS) and backward under `torch.cuda.set_sync_debug_mode("error")`: any host sync raises. Under
    bf16 autocast the values stay within bf16 logits' rounding of the float32 ones."""
    embedding, mix, inputs, targets, mask, _, group_ids = ragged_case(4)
    B, T = targets.shape
    hidden = hidden_of(embedding, mix, inputs).float().reshape(-1, D).cuda().requires_grad_()
    weight = embedding.float().cuda().requires_grad_()
    slots = response_slots(group_ids, T, mask, "others")
    slots.slot, slots.active = slots.slot.cuda(), slots.active.cuda()
    ids = targets.reshape(-1).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = fused_head(hidden, ChunkedHead(weight, 0.7, chunk=8), ids, slots)
        (out.logprobs.sum() + out.entropy.sum()).backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    head = ChunkedHead(embedding, 0.7, chunk=8)
    exact = fused_head(hidden.detach().double().cpu(), head, targets.reshape(-1), slots)
    tolerance = 5e-2 if autocast else 1e-4
    for name in ("logprobs", "entropy", "renyi2", "js"):
        assert torch.allclose(getattr(out, name).double().cpu(), getattr(exact, name), atol=tolerance), name
