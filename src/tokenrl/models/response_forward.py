"""How a sub-batch of rollouts runs through the policy: the hidden states that predict its response tokens, in one of
three layouts (`LAYOUTS`, equal in exact arithmetic; docs/algorithms.md §12.1, §12.4): `padded` (each row its
left-padded prompt + right-padded response), `shared_prefix` (each distinct prompt encoded once through the model's own
KV cache, its keys/values indexed out to the group's rows, so gradients sum over them as in the padded layout; the idea
of Prefix Grouper, arXiv 2506.05433) and `packed` (models/packed.py). With `trim`, each forward is cut to its own rows'
longest prompt and response."""

from __future__ import annotations

import torch
from torch import nn

from tokenrl.models.packed import pack, packed_attention, resolve_backend
from tokenrl.models.sharding import hf_model
from tokenrl.records.rollout_batch import RolloutBatch

LAYOUTS = ("padded", "shared_prefix", "packed")


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The transformer body (hidden states) and the output projection of a causal LM (PEFT-wrapped or not)."""
    base = hf_model(model)
    return base.get_decoder(), base.get_output_embeddings()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift a prompt."""
    return (attention_mask.cumsum(-1) - 1).clamp_min(0)


def sampled_logprobs(logits: torch.Tensor, response_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(z / T) at each sampled token, in float32."""
    return torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, response_ids[..., None]).squeeze(-1)


def shannon_entropy(log_pi: torch.Tensor) -> torch.Tensor:
    """H_t = −Σ_v π log π from log π = log softmax(z / T) over the vocabulary (last dim), with gradient (the entropy
    bonus, docs/algorithms.md §11.5)."""
    return -(log_pi.exp() * log_pi).sum(-1)


def trimmed(batch: RolloutBatch) -> RolloutBatch:
    """`batch` without the prompt columns (left) and response columns (right) that are padding in every row."""
    prompt_start = (
        int(batch.prompt_mask.any(0).long().argmax()) if batch.prompt_mask.any() else batch.prompt_mask.shape[1]
    )
    width = int(batch.response_mask.sum(1).max()) if batch.response_mask.numel() else 0
    return RolloutBatch(
        batch.prompt_ids[:, prompt_start:],
        batch.prompt_mask[:, prompt_start:],
        batch.response_ids[:, :width],
        batch.response_mask[:, :width],
        batch.sampling_logprobs[:, :width],
        batch.group_ids,
        batch.finish_reasons,
        batch.texts,
        batch.weights_version,
    )


def padded_hidden(decoder: nn.Module, batch: RolloutBatch, device: torch.device) -> torch.Tensor:
    """(b, T, H) hidden states that predict response tokens 0..T−1 (positions P−1 .. P+T−2) of one padded forward."""
    attention_mask = batch.attention_mask.to(device)
    hidden = decoder(
        input_ids=batch.input_ids.to(device),
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
    ).last_hidden_state
    return hidden[:, batch.prompt_ids.shape[1] - 1 : -1]


def prompt_owners(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(first row of each distinct group, each row's index into those): rows of one group share their prompt.

    Raises ValueError if two rows of one group hold different prompts (the RolloutBatch contract is broken)."""
    _, owner = torch.unique(batch.group_ids, return_inverse=True)
    first = torch.full((int(owner.max()) + 1,), batch.group_ids.shape[0], dtype=torch.long)
    first = first.scatter_reduce(0, owner, torch.arange(owner.shape[0]), reduce="amin")
    if not torch.equal(batch.prompt_ids, batch.prompt_ids[first][owner]) or not torch.equal(
        batch.prompt_mask, batch.prompt_mask[first][owner]
    ):
        raise ValueError(
            "rows of one group hold different prompts; the shared-prefix and packed forwards need the group's "
            "rows to answer one prompt (fast_path.layout=padded runs without it)"
        )
    return first, owner


def shared_prefix_hidden(decoder: nn.Module, batch: RolloutBatch, device: torch.device) -> torch.Tensor:
    """`padded_hidden` with each group's prompt encoded once: (b, T, H), equal up to rounding. The last prompt
    position predicts response token 0; response tokens 0..T−2 run against the prompt's cached keys/values (indexed
    out to the rows, so gradients flow back through the cache) and predict tokens 1..T−1."""
    first, owner = prompt_owners(batch)
    prompt_mask = batch.prompt_mask[first].to(device)
    encoded = decoder(
        input_ids=batch.prompt_ids[first].to(device),
        attention_mask=prompt_mask,
        position_ids=position_ids(prompt_mask),
        use_cache=True,
    )
    owner = owner.to(device)
    first_token = encoded.last_hidden_state[:, -1][owner][:, None]  # (b, 1, H)
    width = batch.response_ids.shape[1]
    if width <= 1:
        return first_token[:, :width]
    cache = encoded.past_key_values
    cache.batch_select_indices(owner)
    attention_mask = torch.cat([prompt_mask[owner], batch.response_mask[:, : width - 1].to(device)], dim=1)
    rest = decoder(
        input_ids=batch.response_ids[:, : width - 1].to(device),
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask)[:, prompt_mask.shape[1] :],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    return torch.cat([first_token, rest], dim=1)


def packed_hidden(decoder: nn.Module, batch: RolloutBatch, device: torch.device, backend: str = "auto") -> torch.Tensor:
    """`padded_hidden` from the packed layout (models/packed.py): (b, T, H), equal up to rounding on every real
    response token, 0 beyond each row's length. `backend`: models/packed.py's `auto` (flex on a GPU, else gather),
    `flex` or `gather`."""
    first, owner = prompt_owners(batch)
    layout = pack(batch, owner, first, device, resolve_backend(backend, device, torch.is_grad_enabled()))
    with packed_attention(decoder):
        hidden = decoder(
            input_ids=layout.input_ids,
            attention_mask=layout.block_mask if layout.backend == "flex" else layout.allowed,
            position_ids=layout.position_ids,
            use_cache=False,
            packed_layout=layout,
        ).last_hidden_state[0]  # (L, H)
    keep = layout.predictors >= 0
    return hidden[layout.predictors.clamp_min(0)] * keep[..., None].to(hidden.dtype)


def response_hidden(
    model: nn.Module, batch: RolloutBatch, *, layout: str = "padded", trim: bool = False, packed_backend: str = "auto"
) -> tuple[torch.Tensor, RolloutBatch]:
    """(hidden states (b, T', H) predicting the response tokens, the batch they belong to) in `layout` (one of
    `LAYOUTS`): T' = T, or the rows' longest response with `trim` (the returned batch is then the trimmed one);
    `packed_backend`: the packed layout's attention (`packed_hidden`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    device = next(model.parameters()).device
    decoder, _ = decoder_and_head(model)
    batch = trimmed(batch) if trim else batch
    if layout == "packed":
        return packed_hidden(decoder, batch, device, packed_backend), batch
    forward = shared_prefix_hidden if layout == "shared_prefix" else padded_hidden
    return forward(decoder, batch, device), batch


def response_logits(
    model: nn.Module, batch: RolloutBatch, *, layout: str = "padded", trim: bool = False, packed_backend: str = "auto"
) -> torch.Tensor:
    """(b, T', V) logits of the response tokens (T' as in `response_hidden`), with gradient when enabled."""
    _, head = decoder_and_head(model)
    hidden, _ = response_hidden(model, batch, layout=layout, trim=trim, packed_backend=packed_backend)
    return head(hidden)


def response_logprobs(
    model: nn.Module, batch: RolloutBatch, temperature: float, *, layout: str = "padded", trim: bool = False
) -> torch.Tensor:
    """(b, T) log π(o_t) at the sampling temperature (0 beyond a trimmed width), with gradient when enabled."""
    logits = response_logits(model, batch, layout=layout, trim=trim)
    width = logits.shape[1]
    logp = sampled_logprobs(logits, batch.response_ids[:, :width].to(logits.device), temperature)
    return nn.functional.pad(logp, (0, batch.response_ids.shape[1] - width))


def forward_response_logits(model: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """(b, T, V) response logits through the model's own forward (the head applied there to the T + 1 last positions,
    transformers' `logits_to_keep`): the update's path under FSDP, whose root unit gathers its parameters (embeddings,
    head) and hooks their gradient reduction only inside its forward (tokenrl.models.sharding)."""
    device = next(model.parameters()).device
    attention_mask = batch.attention_mask.to(device)
    return model(
        input_ids=batch.input_ids.to(device),
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
        logits_to_keep=batch.response_ids.shape[1] + 1,
    ).logits[:, :-1]
