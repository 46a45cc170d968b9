"""models/packed.py and the `packed` layout of models/response_forward.py against the padded layout, in float64 on
real tiny transformers models (Qwen2 with GQA, Llama), on ragged batches: prompts of different lengths, responses of
different lengths down to one token, groups of different sizes (one of one row), a partial group and interleaved
rows. Logits at response positions, log-probs, gradients w.r.t. every parameter and the statistics the selectors
read (`LogitStatistics.of_logits`) equal the padded layout's; the gather backend with gradients, FlexAttention (no
backward on the CPU in torch 2.13) without."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.helpers.packed import dense_mask
from tests.models.test_response_forward import (
    TEMPERATURE,
    VOCAB,
    grads,
    make_batch,
    ragged_batch,
    tiny_qwen2,
    weights_for,
)
from tokenrl.algorithms.logit_statistics import LogitStatistics
from tokenrl.models import packed as packed_module
from tokenrl.models.packed import ATTENTION_NAME, pack, packed_attention, packed_blocker, resolve_backend
from tokenrl.models.response_forward import prompt_owners, response_logits, response_logprobs

ATOL = 1e-10

pytestmark = pytest.mark.usefixtures("exact_norm")  # the whole module: tests/conftest.py


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """A random float64 Llama (2 layers, 4 heads and 4 key/value heads, untied head)."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        max_position_embeddings=64,
        initializer_range=0.2,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float64)
    return model.eval()


def layout_of_batch(batch, backend: str = "gather"):
    first, owner = prompt_owners(batch)
    return pack(batch, owner, first, torch.device("cpu"), backend)


def check_packed_equals_padded(model, batch, seed: int) -> None:
    """Logits on every real response token, log-probs and the gradients of Σ w·log π w.r.t. every trainable
    parameter: packed (gather backend) = padded to 1e-10; the packed logits are 0-row-free (finite) off the mask."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in named], [p for _, p in named]
    weights = weights_for(batch, seed)
    mask = batch.response_mask.bool()
    out = {}
    for layout in ("padded", "packed"):
        logits = response_logits(model, batch, layout=layout, packed_backend="gather")
        assert logits.dtype == torch.float64 and logits.shape[:2] == batch.response_ids.shape
        logp = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, batch.response_ids[..., None]).squeeze(-1)
        out[layout] = (logits.detach(), logp.detach(), grads((weights * logp).sum(), params))
    (logits_a, logp_a, grads_a), (logits_b, logp_b, grads_b) = out["padded"], out["packed"]
    assert torch.isfinite(logits_b).all()
    torch.testing.assert_close(logits_b[mask], logits_a[mask], atol=ATOL, rtol=0)
    torch.testing.assert_close(logp_b[mask], logp_a[mask], atol=ATOL, rtol=0)
    assert all(g.abs().max() > 1e-3 for g in grads_a), "a parameter has no gradient: the comparison would be vacuous"
    for name, a, b in zip(names, grads_a, grads_b):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_equals_padded_qwen2_float64(exact_norm, seed):
    batch = ragged_batch(seed)
    assert batch.prompt_mask.sum(1).unique().numel() > 1 and batch.response_mask.sum(1).min() == 1
    check_packed_equals_padded(tiny_qwen2(seed).train(), batch, seed)


@pytest.mark.parametrize("sizes", [(2,), (5,), (2, 3, 1, 4, 2)])
def test_packed_equals_padded_group_shapes(exact_norm, sizes):
    """One group of one row (ragged_batch drops a row of the largest group), one group, many groups of mixed sizes."""
    check_packed_equals_padded(tiny_qwen2(3), ragged_batch(3, group_sizes=sizes), 3)


def test_packed_with_only_one_token_responses(exact_norm):
    """Every response of length 1: the packed row holds the prompts only, each predicting its rows' token 0."""
    batch = ragged_batch(4, max_response=1)
    assert batch.response_ids.shape[1] == 1
    layout = layout_of_batch(batch)
    assert layout.length == int(batch.prompt_mask[prompt_owners(batch)[0]].sum())
    check_packed_equals_padded(tiny_qwen2(4), batch, 4)


def test_packed_equals_padded_llama_float64(exact_norm):
    check_packed_equals_padded(tiny_llama(5).train(), ragged_batch(5), 5)


def test_packed_lora_gradients_equal_padded(exact_norm):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False, target_modules=["q_proj", "k_proj", "v_proj"]
    )
    with torch.random.fork_rng():
        torch.manual_seed(8)
        model = peft.get_peft_model(tiny_qwen2(8), config)
    check_packed_equals_padded(model, ragged_batch(8), 8)


@pytest.mark.parametrize("seed", [0, 1])
def test_flex_backend_without_gradient_equals_padded(exact_norm, seed):
    """FlexAttention (eager on the CPU, no gradient) gives the padded logits to float64 rounding."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    model, batch = tiny_qwen2(seed), ragged_batch(seed)
    mask = batch.response_mask.bool()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*without torch.compile")
        flex = response_logits(model, batch, layout="packed", packed_backend="flex")
    with torch.no_grad():
        padded = response_logits(model, batch, layout="padded")
    torch.testing.assert_close(flex[mask], padded[mask], atol=ATOL, rtol=0)


def test_flex_with_gradient_on_cpu_is_refused_and_auto_picks_gather():
    assert resolve_backend("auto", torch.device("cpu"), True) == "gather"
    assert resolve_backend("auto", torch.device("cpu"), False) == "gather"
    with pytest.raises(ValueError, match="no backward on the CPU"):
        resolve_backend("flex", torch.device("cpu"), True)
    assert resolve_backend("flex", torch.device("cpu"), False) == "flex"
    with pytest.raises(ValueError, match="not one of"):
        resolve_backend("varlen", torch.device("cpu"), True)


def float64_statistics(logits: torch.Tensor, batch, js_peers: str) -> dict[str, torch.Tensor]:
    """log π, entropy, Rényi-2 and JS (to the group mean over the rows active at t) in float64 on the real tokens,
    the formulas of algorithms/logit_statistics.py without its float32 cast."""
    mask = batch.response_mask.bool()
    logp = torch.log_softmax(logits / TEMPERATURE, -1)
    p = logp.exp()
    out = {
        "logprobs": logp.gather(-1, batch.response_ids[..., None]).squeeze(-1),
        "entropy": -(p * logp).sum(-1),
        "renyi2": -torch.log((p * p).sum(-1)),
    }
    js = torch.zeros(mask.shape, dtype=torch.float64)
    for g in batch.group_ids.unique():
        rows = (batch.group_ids == g).nonzero().squeeze(1)
        active = mask[rows].double()  # (G, T)
        total = (p[rows] * active[..., None]).sum(0)  # (T, V)
        count = active.sum(0)[:, None]
        for row in rows:
            if js_peers == "all":
                mean = total / count.clamp_min(1)
            else:
                mean = ((total - p[row]) / (count - 1).clamp_min(1)).clamp_min(0)
            mid = 0.5 * (p[row] + mean)
            log_mid = torch.log(mid.clamp_min(1e-300))
            value = 0.5 * (
                (p[row] * (logp[row] - log_mid)).sum(-1) + (torch.xlogy(mean, mean) - mean * log_mid).sum(-1)
            )
            js[row] = torch.where(count[:, 0] > 1, value, 0.0)
    out["js"] = js
    return {name: value * mask for name, value in out.items()}


@pytest.mark.parametrize("js_peers", ["all", "others"])
def test_statistics_from_packed_logits_equal_padded(exact_norm, js_peers):
    """The statistics every selector reads, from the packed logits: `LogitStatistics.of_logits` (float32 by design)
    equals its value from the padded logits to float32 rounding, and the same formulas in float64 to 1e-10."""
    model, batch = tiny_qwen2(9), ragged_batch(9)
    with torch.no_grad():
        padded = response_logits(model, batch, layout="padded")
        packed = response_logits(model, batch, layout="packed")
    statistics = LogitStatistics(TEMPERATURE, 7, js_peers)
    a = statistics.of_logits(padded, batch.response_ids, batch.response_mask, batch.group_ids, True)
    b = statistics.of_logits(packed, batch.response_ids, batch.response_mask, batch.group_ids, True)
    for name in ("logprobs", "entropy", "renyi2", "js"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), atol=1e-6, rtol=0, msg=name)
    assert a.js.abs().max() > 1e-3  # JS is compared where it is not trivially 0
    exact_a, exact_b = float64_statistics(padded, batch, js_peers), float64_statistics(packed, batch, js_peers)
    for name in exact_a:
        torch.testing.assert_close(exact_b[name], exact_a[name], atol=ATOL, rtol=0, msg=name)


def brute_force_mask(batch) -> tuple[torch.Tensor, list[tuple[int, str, int, int]]]:
    """The packed row's tokens, described as (group, 'prompt' | row, index, position), and the (L, L) mask from the
    rule: same group, key in the prompt or the query's own response, key not after the query."""
    first, owner = prompt_owners(batch)
    tokens = []
    for g, f in enumerate(first.tolist()):
        p = int(batch.prompt_mask[f].sum())
        tokens += [(g, "prompt", i, i) for i in range(p)]
        for row in (owner == g).nonzero().squeeze(1).tolist():
            n = int(batch.response_mask[row].sum()) - 1
            tokens += [(g, row, i, p + i) for i in range(n)]
    L = len(tokens)
    mask = torch.zeros(L, L, dtype=torch.bool)
    for q, (gq, sq, _, _) in enumerate(tokens):
        for k, (gk, sk, _, _) in enumerate(tokens):
            mask[q, k] = gq == gk and k <= q and (sk == "prompt" or sk == sq)
    return mask, tokens


@pytest.mark.parametrize("seed", [0, 5])
def test_layout_tokens_positions_and_mask(seed):
    """The packed row holds each group's real prompt once, then each response's tokens but the last; positions
    restart per response at the prompt's length (the padded layout's positions of the same tokens); the flex rule,
    the gather backend's attention rows and a brute-force mask agree; every response token's predictor is the
    position holding the token before it."""
    batch = ragged_batch(seed)
    expected, tokens = brute_force_mask(batch)
    layout = layout_of_batch(batch)
    assert layout.length == len(tokens)
    assert layout.position_ids[0].tolist() == [t[3] for t in tokens]
    torch.testing.assert_close(dense_mask(layout), expected, rtol=0, atol=0)
    from_gather = torch.zeros_like(expected)
    q_valid = torch.zeros(layout.q_index.shape, dtype=torch.bool)
    q_valid[layout.back_row, layout.back_slot] = True
    for r in range(layout.q_index.shape[0]):
        for s in range(layout.q_index.shape[1]):
            if q_valid[r, s]:
                allowed = layout.allowed[r, 0, s]
                from_gather[layout.q_index[r, s], layout.k_index[r][allowed]] = True
    torch.testing.assert_close(from_gather, expected, rtol=0, atol=0)
    assert torch.equal(layout.q_index[layout.back_row, layout.back_slot], torch.arange(layout.length))
    ids = layout.input_ids[0]
    for row in range(batch.response_ids.shape[0]):
        n = int(batch.response_mask[row].sum())
        prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()]
        for t in range(batch.response_ids.shape[1]):
            where = int(layout.predictors[row, t])
            if t >= n:
                assert where == -1
            elif t == 0:
                assert ids[where] == prompt[-1] and layout.position_ids[0, where] == len(prompt) - 1
            else:
                assert ids[where] == batch.response_ids[row, t - 1]
                assert layout.position_ids[0, where] == len(prompt) + t - 1
                assert tokens[where][1] == row


def test_flex_block_mask_matches_the_rule():
    """The BlockMask's mask_mod, on every (query, key) pair of the packed row, is the rule."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    batch = ragged_batch(1)
    layout = layout_of_batch(batch, backend="flex")
    mod = layout.block_mask.mask_mod
    L = layout.length
    q, k = torch.meshgrid(torch.arange(L), torch.arange(L), indexing="ij")
    zero = torch.zeros((), dtype=torch.long)
    assert torch.equal(mod(zero, zero, q, k), brute_force_mask(batch)[0])


def test_response_logprobs_and_trim_in_packed_layout(exact_norm):
    """The public float32 `response_logprobs`, trimmed or not, equals the padded layout's on real tokens and is 0
    beyond a trimmed width."""
    model, batch = tiny_qwen2(2), ragged_batch(2)
    mask = batch.response_mask.bool()
    padded = response_logprobs(model, batch, TEMPERATURE, layout="padded").detach()
    for trim in (False, True):
        logp = response_logprobs(model, batch, TEMPERATURE, trim=trim, layout="packed").detach()
        assert logp.shape == batch.response_ids.shape
        torch.testing.assert_close(logp[mask], padded[mask], atol=1e-6, rtol=0)
        if trim:
            assert (logp[:, int(batch.response_mask.sum(1).max()) :] == 0).all()


def test_attention_is_restored_and_refused_outside_the_layout():
    model = tiny_qwen2(0)
    with packed_attention(model.model):
        assert model.config._attn_implementation == ATTENTION_NAME
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="only inside"):
        packed_module.packed_attention_forward(model, *(torch.zeros(1, 1, 2, 4),) * 3, None)
    with pytest.raises(ValueError), packed_attention(model.model):  # restored after an error inside
        raise ValueError
    assert model.config._attn_implementation == "sdpa"


def test_packed_blocker_gradient_checkpointing():
    model = tiny_qwen2(0)
    assert packed_blocker(model) is None
    model.gradient_checkpointing_enable()
    assert "gradient checkpointing" in packed_blocker(model)
    assert packed_blocker(model, with_grad=False) is None


def test_a_group_with_two_prompts_is_refused():
    batch = make_batch([[5, 6, 8], [5, 6, 9]], [[1, 2], [3]], [0, 0])
    with pytest.raises(ValueError, match="different prompts"):
        response_logits(tiny_qwen2(0), batch, layout="packed")
