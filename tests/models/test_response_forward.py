"""models/response_forward.py: the shared-prefix and padded layouts, and `trim`, against an independent float64
reference (one unpadded forward per row, built from the row's real tokens) on random ragged batches: prompts of
different lengths (left padding), responses of different lengths down to one token, groups of different sizes, a
group of one row, a partial group and rows of groups interleaved (a shuffled mini-batch).

Float64 exactness needs one patch: transformers' Qwen2RMSNorm computes in float32 whatever the model's dtype, so a
float64 model is only float32-accurate there (the layouts then differ by ~1e-7). The `exact_norm` fixture makes the
norm compute in the input's dtype for the test; everything else is the real transformers model.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from tests.helpers.qwen2 import float64_qwen2
from tokenrl.models.response_forward import prompt_owners, response_logits, response_logprobs, trimmed
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.step.fast_path import layout_blocker

VOCAB = 50
PAD = 7  # a real token id too: only the masks may tell padding apart
TEMPERATURE = 0.7
ATOL = 1e-10

pytestmark = pytest.mark.usefixtures("exact_norm")  # the whole module: tests/conftest.py


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    """The tiny float64 Qwen2 of tests/helpers/qwen2.py over this module's vocabulary, in eval mode."""
    return float64_qwen2(VOCAB, seed).eval()


def make_batch(prompts: list[list[int]], responses: list[list[int]], group_ids: list[int]) -> RolloutBatch:
    """A RolloutBatch of these rows: prompts left-padded, responses right-padded, with PAD."""
    b, P, T = len(prompts), max(map(len, prompts)), max(map(len, responses))
    prompt_ids, prompt_mask = torch.full((b, P), PAD), torch.zeros(b, P, dtype=torch.long)
    response_ids, response_mask = torch.full((b, T), PAD), torch.zeros(b, T, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt_ids[i, P - len(p) :], prompt_mask[i, P - len(p) :] = torch.tensor(p), 1
        response_ids[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r), 1
    return RolloutBatch(
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        torch.zeros(b, T, dtype=torch.float32),
        torch.tensor(group_ids),
        ["stop"] * b,
        [""] * b,
        0,
    )


def ragged_batch(seed: int, group_sizes=(3, 1, 4, 2), max_response: int = 6) -> RolloutBatch:
    """Groups of the given sizes (one of one row), each its own prompt length, responses of random lengths with at
    least one of one token; then one row of the largest group dropped (a partial group) and the rows shuffled."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randperm(6, generator=g)[: len(group_sizes)] + 2  # distinct, 2..7
    prompts, responses, groups = [], [], []
    for group, (size, length) in enumerate(zip(group_sizes, prompt_lengths.tolist())):
        prompt = torch.randint(VOCAB, (length,), generator=g).tolist()
        for _ in range(size):
            prompts.append(prompt)
            n = int(torch.randint(1, max_response + 1, (1,), generator=g))
            responses.append(torch.randint(VOCAB, (n,), generator=g).tolist())
            groups.append(group)
    responses[int(torch.randint(len(responses), (1,), generator=g))] = [int(torch.randint(VOCAB, (1,), generator=g))]
    batch = make_batch(prompts, responses, groups)
    largest = max(range(len(group_sizes)), key=lambda k: group_sizes[k])
    drop = int((batch.group_ids == largest).nonzero()[-1])
    keep = torch.tensor([i for i in range(len(prompts)) if i != drop])
    return batch.rows(keep[torch.randperm(len(keep), generator=g)])


def real_tokens(batch: RolloutBatch, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    return batch.prompt_ids[i][batch.prompt_mask[i].bool()], batch.response_ids[i][batch.response_mask[i].bool()]


def logprobs64(logits: torch.Tensor, response_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(z / T) at the sampled tokens, in the logits' own (float64) dtype."""
    return torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, response_ids[..., None]).squeeze(-1)


def reference_logprobs(model, batch: RolloutBatch) -> list[torch.Tensor]:
    """Per row, the float64 log-probs of its real response tokens from one forward over its real tokens only
    (no padding, no attention mask, default positions), through the model's own forward and head."""
    out = []
    for i in range(batch.prompt_ids.shape[0]):
        prompt, response = real_tokens(batch, i)
        logits = model(input_ids=torch.cat([prompt, response])[None], use_cache=False).logits[0]
        out.append(logprobs64(logits[len(prompt) - 1 : len(prompt) + len(response) - 1], response))
    return out


def weights_for(batch: RolloutBatch, seed: int) -> torch.Tensor:
    """Random (b, T) float64 weights, 0 off the response mask (as a loss weights tokens)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch.response_ids.shape, generator=g, dtype=torch.float64) * batch.response_mask


def grads(objective: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(objective, params))


def layout_logprobs(model, batch: RolloutBatch, layout: str, trim: bool = False) -> torch.Tensor:
    """(b, T') float64 log-probs from `response_logits` of the layout (T' the trimmed width with `trim`)."""
    logits = response_logits(model, batch, layout=layout, trim=trim)
    assert logits.dtype == torch.float64
    return logprobs64(logits, batch.response_ids[:, : logits.shape[1]])


def assert_all_close(actual: list[torch.Tensor], expected: list[torch.Tensor], names: list[str]) -> None:
    for name, a, e in zip(names, actual, expected):
        torch.testing.assert_close(a, e, atol=ATOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def check_layouts_against_reference(model, batch: RolloutBatch, seed: int) -> None:
    """Both layouts' float64 log-probs on every real response token equal the row-by-row reference, and the
    gradients of Σ w·log π w.r.t. every trainable parameter equal the reference's; shared equals padded everywhere
    (padding positions included)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in named], [p for _, p in named]
    weights = weights_for(batch, seed)
    mask = batch.response_mask.bool()

    ref = reference_logprobs(model, batch)
    ref_grads = grads(sum((w[m] * r).sum() for w, m, r in zip(weights, mask, ref)), params)
    assert all(g.abs().max() > 1e-3 for g in ref_grads), "a parameter has no gradient: the comparison would be vacuous"

    layouts = {}
    for layout in ("padded", "shared_prefix"):
        logp = layout_logprobs(model, batch, layout)
        torch.testing.assert_close(logp[mask], torch.cat(ref), atol=ATOL, rtol=0)
        assert_all_close(grads((weights * logp).sum(), params), ref_grads, names)
        layouts[layout] = logp.detach()
    torch.testing.assert_close(layouts["shared_prefix"], layouts["padded"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_prefix_and_padded_layouts_equal_row_by_row_float64_reference(exact_norm, seed):
    """Shared-prefix and padded log-probs and their parameter gradients equal one unpadded forward per row."""
    model = tiny_qwen2(seed)
    batch = ragged_batch(seed)
    assert batch.prompt_mask.sum(1).unique().numel() > 1 and batch.response_mask.sum(1).min() == 1
    assert (batch.group_ids.diff() != 0).sum() >= len(batch.group_ids.unique())  # groups interleaved
    check_layouts_against_reference(model, batch, seed)


def test_layouts_with_only_one_token_responses_equal_reference(exact_norm):
    """Width-1 responses (the shared layout's no-continuation branch) still equal the reference."""
    batch = ragged_batch(3, max_response=1)
    assert batch.response_ids.shape[1] == 1
    check_layouts_against_reference(tiny_qwen2(3), batch, 3)


def test_response_logprobs_match_reference_to_float32(exact_norm):
    """The public `response_logprobs` (float32 by design) equals the reference on real tokens to float32 rounding, in
    both layouts, trimmed or not, with 0 beyond a trimmed width; its gradients agree between the layouts."""
    model, batch = tiny_qwen2(4), widened(ragged_batch(4), left=2, right=3)
    mask = batch.response_mask.bool()
    ref = torch.cat(reference_logprobs(model, batch)).detach()
    params = list(model.parameters())
    weights = weights_for(batch, 4).float()
    by_layout = {}
    for layout in ("padded", "shared_prefix"):
        for trim in (False, True):
            logp = response_logprobs(model, batch, TEMPERATURE, layout=layout, trim=trim)
            assert logp.shape == batch.response_ids.shape
            torch.testing.assert_close(logp[mask].double(), ref, atol=2e-6, rtol=0)
            if trim:
                assert (logp[:, int(batch.response_mask.sum(1).max()) :] == 0).all()
            by_layout[layout, trim] = grads((weights * logp).sum(), params)
    for key, value in by_layout.items():
        for a, e in zip(value, by_layout["padded", False]):
            torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-4, msg=lambda m, key=key: f"{key}: {m}")


def widened(batch: RolloutBatch, left: int, right: int) -> RolloutBatch:
    """`batch` with `left` extra all-pad prompt columns and `right` extra all-pad response columns."""
    pad = torch.nn.functional.pad
    return RolloutBatch(
        pad(batch.prompt_ids, (left, 0), value=PAD),
        pad(batch.prompt_mask, (left, 0)),
        pad(batch.response_ids, (0, right), value=PAD),
        pad(batch.response_mask, (0, right)),
        pad(batch.sampling_logprobs, (0, right)),
        batch.group_ids,
        batch.finish_reasons,
        batch.texts,
        batch.weights_version,
    )


def test_trimmed_drops_exactly_the_all_padding_columns():
    """`trimmed` cuts to the longest real prompt and response, keeping every row's real tokens in place."""
    batch = ragged_batch(5)
    for part in (batch, batch.rows(torch.tensor([0, 2, 5])), widened(batch, 3, 4)):
        cut = trimmed(part)
        assert cut.prompt_ids.shape[1] == int(part.prompt_mask.sum(1).max())
        assert cut.response_ids.shape[1] == int(part.response_mask.sum(1).max())
        for i in range(part.prompt_ids.shape[0]):
            for got, want in zip(real_tokens(cut, i), real_tokens(part, i)):
                assert torch.equal(got, want)
        assert torch.equal(cut.group_ids, part.group_ids)
    wide, narrow = trimmed(widened(batch, 3, 4)), trimmed(batch)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "sampling_logprobs"):
        assert torch.equal(getattr(wide, name), getattr(narrow, name)), name


@pytest.mark.parametrize("layout", ["padded", "shared_prefix"])
@pytest.mark.parametrize("left,right", [(0, 0), (3, 4)])
def test_trim_equals_untrimmed_values_and_gradients(exact_norm, layout, left, right):
    """trim=True: log-probs equal the untrimmed layout's on the kept columns (0 beyond them, from
    `response_logprobs`), gradients equal; on a sub-batch whose longest rows were left out and on a batch with
    extra all-pad columns on both sides."""
    model = tiny_qwen2(6)
    full = ragged_batch(6)
    longest = int(full.response_mask.sum(1).argmax())
    batch = widened(full.rows(torch.tensor([i for i in range(len(full.group_ids)) if i != longest])), left, right)
    width = int(batch.response_mask.sum(1).max())
    assert width < batch.response_ids.shape[1]  # there are columns to trim
    params = list(model.parameters())
    weights = weights_for(batch, 6)

    untrimmed = layout_logprobs(model, batch, layout)
    cut = layout_logprobs(model, batch, layout, trim=True)
    assert cut.shape == (batch.response_ids.shape[0], width)
    torch.testing.assert_close(cut, untrimmed[:, :width], atol=ATOL, rtol=0)
    assert_all_close(
        grads((weights[:, :width] * cut).sum(), params),
        grads((weights * untrimmed).sum(), params),
        [n for n, _ in model.named_parameters()],
    )

    padded_back = response_logprobs(model, batch, TEMPERATURE, layout=layout, trim=True).detach()
    assert padded_back.shape == batch.response_ids.shape and (padded_back[:, width:] == 0).all()
    torch.testing.assert_close(
        padded_back[:, :width],
        response_logprobs(model, batch, TEMPERATURE, layout=layout)[:, :width].detach(),
        atol=1e-6,
        rtol=0,
    )


def test_prompt_owners_maps_rows_to_first_row_of_their_group():
    """On a shuffled partial batch, `first` is each group's first row (groups in id order), `owner` each row's."""
    batch = ragged_batch(7)
    first, owner = prompt_owners(batch)
    groups = batch.group_ids.unique().tolist()
    ids = batch.group_ids.tolist()
    assert first.tolist() == [ids.index(g) for g in groups]
    assert owner.tolist() == [groups.index(g) for g in ids]


def test_prompt_owners_rejects_a_group_with_two_prompts():
    """Two rows of one group with different prompt tokens, or equal ids but different masks (a real token equal to
    the pad id), raise a ValueError that names fast_path.layout=padded."""
    responses, groups = [[1, 2], [3], [4]], [0, 0, 1]
    for prompts in (
        [[5, 6, 8], [5, 6, 9], [1]],  # different tokens
        [[5, 6], [PAD, 5, 6], [1]],
    ):  # same ids once left-padded with PAD, different masks
        batch = make_batch(prompts, responses, groups)
        with pytest.raises(ValueError, match="fast_path.layout=padded"):
            prompt_owners(batch)
    prompt_owners(make_batch([[5, 6], [5, 6], [PAD, 1]], responses, groups))  # the same prompt twice is fine


@pytest.mark.parametrize("layout", ["shared_prefix", "packed"])
def test_layout_blocker_plain_checkpointed_and_lora(layout):
    """None for a plain model; a gradient-checkpointing reason once it is enabled, for the update only (the no-grad
    passes pause it); None for a LoRA-wrapped model and a reason for a LoRA-wrapped model with checkpointing. The
    padded layout is never blocked."""
    model = tiny_qwen2()
    assert layout_blocker(model, layout) is None
    model.gradient_checkpointing_enable()
    assert "gradient checkpointing" in layout_blocker(model, layout)
    assert layout_blocker(model, layout, with_grad=False) is None
    assert layout_blocker(model, "padded") is None

    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(tiny_qwen2(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert layout_blocker(lora, layout) is None
    lora.gradient_checkpointing_enable()
    assert "gradient checkpointing" in layout_blocker(lora, layout)


def test_lora_shared_prefix_gradients_equal_padded_and_reference(exact_norm):
    """A float64 LoRA-wrapped model (adapters randomly initialised, so every LoRA parameter has a gradient): both
    layouts' log-probs and LoRA-parameter gradients equal the row-by-row reference."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"],
    )
    with torch.random.fork_rng():
        torch.manual_seed(8)
        model = peft.get_peft_model(tiny_qwen2(8), config)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    check_layouts_against_reference(model, ragged_batch(8), 8)


def test_the_no_grad_passes_share_the_prompt_under_gradient_checkpointing(exact_norm):
    """With gradient checkpointing on and the policy in training mode, transformers drops the KV cache: the statistics
    and reference passes pause checkpointing, so their shared-prefix layout equals the padded one (without the pause
    the responses would run without their prompt)."""
    from tokenrl.step.fast_path import FastPath, ForwardPlan
    from tokenrl.step.passes import PolicyPasses

    policy, reference = tiny_qwen2(seed=0).train(), tiny_qwen2(seed=1)
    policy.gradient_checkpointing_enable()
    reference.gradient_checkpointing_enable()
    batch = ragged_batch(seed=3)
    shared, padded = (
        PolicyPasses(policy, reference, ForwardPlan(TEMPERATURE, 4, 16, True, fast_path=FastPath(layout, pack=False)))
        for layout in ("shared_prefix", "padded")
    )
    assert torch.allclose(shared.reference_logprobs(batch), padded.reference_logprobs(batch), atol=1e-6)
    stats, expected = shared.statistics(batch), padded.statistics(batch)
    for name in ("logprobs", "entropy", "renyi2", "js"):
        assert torch.allclose(getattr(stats, name), getattr(expected, name), atol=1e-6), name
    assert all(layer.gradient_checkpointing for layer in policy.model.layers)  # back on for the update
    with torch.no_grad(), pytest.raises(AttributeError):  # the pause is what makes it possible: transformers
        layout_logprobs(policy, batch, "shared_prefix")  # returns no cache to share
