"""The packed layout of a micro-batch (docs/algorithms.md §12.4): one row holding, per group, its prompt once and then
each of its responses without padding (a response's last token predicts nothing, so it is not an input), position ids
restarting per response at the prompt's length (the rotary positions of the padded layout). A query attends to a key
iff both belong to one group, the key is not after the query, and the key is in the group's prompt or in the query's
own response: exactly its keys in the padded layout, so the hidden states are equal in exact arithmetic. Two backends
of one transformers attention function, `ATTENTION_NAME`, the model's attention only inside `packed_attention` (the
layout reaches it through the decoder's `**kwargs`; a 4-D mask argument passes transformers' mask builders unchanged):
`flex`, one FlexAttention call with a BlockMask of the rule (torch has no FlexAttention backward on the CPU), and
`gather` (any device, with gradient), each prompt and each response an attention row of its own keys, run by one SDPA
call with a small boolean mask and gathered back to the packed order."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from tokenrl.models.sharding import hf_model
from tokenrl.records.rollout_batch import RolloutBatch

ATTENTION_NAME = "tokenrl_packed"
BACKENDS = ("auto", "flex", "gather")


def resolve_backend(backend: str, device: torch.device, with_grad: bool) -> str:
    """`auto`: flex on a GPU, else gather (every supported torch has FlexAttention). `flex` with gradient on the CPU
    raises (torch has no FlexAttention backward there)."""
    if backend not in BACKENDS:
        raise ValueError(f"packed attention backend {backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        return "flex" if device.type == "cuda" else "gather"
    if backend == "flex" and device.type == "cpu" and with_grad:
        raise ValueError("FlexAttention has no backward on the CPU: use the 'gather' backend with gradients")
    return backend


@dataclass
class PackedLayout:
    """Index tensors of one packed micro-batch (all on the model's device).

    input_ids / position_ids: (1, L). group / response / is_prompt: (L,) per packed token (response: the batch row
    of a response token, −1 in a prompt). predictors: (b, T) the packed position whose hidden state predicts response
    token t of row i (−1 beyond the row's length). For `gather`: q_index (R, Q) and k_index (R, K) the packed positions
    of each attention row's queries and keys (0 where padding), allowed (R, 1, Q, K) its mask, back_row / back_slot
    (L,) where each packed token's output lies."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    group: torch.Tensor
    response: torch.Tensor
    is_prompt: torch.Tensor
    predictors: torch.Tensor
    backend: str
    block_mask: object | None = None
    q_index: torch.Tensor | None = None
    k_index: torch.Tensor | None = None
    allowed: torch.Tensor | None = None
    back_row: torch.Tensor | None = None
    back_slot: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]

    def gather_indices(
        self,
        prompt_start: torch.Tensor,
        prompt_len: torch.Tensor,
        segment_start: torch.Tensor,
        response_len: torch.Tensor,
        group_of_row: torch.Tensor,
    ) -> None:
        """The attention rows of the `gather` backend: groups' prompts first, then the responses (rows in batch order);
        keys of a row are its group's prompt (left-aligned) and, for a response, its own tokens."""
        n_groups, b = len(prompt_len), len(response_len)
        seg_len = (response_len - 1).clamp_min(0)
        P = int(prompt_len.max())
        S = int(seg_len.max()) if b else 0
        Q, K = max(P, S), P + S
        q_index = torch.zeros(n_groups + b, Q, dtype=torch.long)
        q_valid = torch.zeros(n_groups + b, Q, dtype=torch.bool)
        k_index = torch.zeros(n_groups + b, K, dtype=torch.long)
        k_valid = torch.zeros(n_groups + b, K, dtype=torch.bool)
        q, kk = torch.arange(Q), torch.arange(K)
        p_of_row = torch.cat([prompt_len, prompt_len[group_of_row]])
        p_start = torch.cat([prompt_start, prompt_start[group_of_row]])
        # keys: the prompt in columns 0..P−1 (left-aligned, valid below its length), the response in columns P..P+S−1
        in_prompt = kk[None] < p_of_row[:, None]
        k_index = torch.where(in_prompt, p_start[:, None] + kk[None], k_index)
        k_valid |= in_prompt
        in_segment = (kk[None] >= P) & (kk[None] - P < seg_len[:, None])
        k_index[n_groups:] = torch.where(in_segment, segment_start[:, None] + kk[None] - P, k_index[n_groups:])
        k_valid[n_groups:] |= in_segment
        # queries: a prompt row's are its prompt tokens, a response row's its response tokens
        q_valid[:n_groups] = q[None] < prompt_len[:, None]
        q_index[:n_groups] = torch.where(q_valid[:n_groups], prompt_start[:, None] + q[None], 0)
        q_valid[n_groups:] = q[None] < seg_len[:, None]
        q_index[n_groups:] = torch.where(q_valid[n_groups:], segment_start[:, None] + q[None], 0)
        # causal in packed positions: every gathered key precedes its query in the row iff it is in the query's past
        allowed = k_valid[:, None, :] & (k_index[:, None, :] <= q_index[:, :, None])
        allowed |= ~q_valid[:, :, None]  # padding queries see everything: no empty softmax (their output is dropped)
        back_row = torch.zeros(self.length, dtype=torch.long)
        back_slot = torch.zeros(self.length, dtype=torch.long)
        rows = torch.arange(n_groups + b)[:, None].expand(-1, Q)
        back_row[q_index[q_valid]] = rows[q_valid]
        back_slot[q_index[q_valid]] = q[None].expand(n_groups + b, -1)[q_valid]
        device = self.group.device
        self.q_index, self.k_index = q_index.to(device), k_index.to(device)
        self.allowed = allowed[:, None].to(device)
        self.back_row, self.back_slot = back_row.to(device), back_slot.to(device)


def pack(
    batch: RolloutBatch, group_of_row: torch.Tensor, first_row: torch.Tensor, device: torch.device, backend: str
) -> PackedLayout:
    """The packed layout of a micro-batch (rows as in RolloutBatch: prompts left-padded, responses right-padded;
    `first_row[g]` a row holding group g's prompt, `group_of_row` each row's group index: `prompt_owners`).

    Response widths are the rows' real lengths (a response's mask is a prefix of ones)."""
    prompt_len = batch.prompt_mask.sum(1)
    response_len = batch.response_mask.sum(1)
    b, width = batch.response_ids.shape
    ids, pos, grp, resp = [], [], [], []
    prompt_start = torch.zeros(len(first_row), dtype=torch.long)
    segment_start = torch.zeros(b, dtype=torch.long)  # packed position of row i's response token 0
    last_prompt = torch.zeros(len(first_row), dtype=torch.long)
    cursor = 0
    rows_of = [(group_of_row == g).nonzero().squeeze(1).tolist() for g in range(len(first_row))]
    for g, owner in enumerate(first_row.tolist()):
        p = int(prompt_len[owner])
        if p == 0:
            raise ValueError("the packed layout needs every prompt to hold at least one token")
        prompt = batch.prompt_ids[owner, batch.prompt_ids.shape[1] - p :]
        prompt_start[g], last_prompt[g] = cursor, cursor + p - 1
        ids.append(prompt)
        pos.append(torch.arange(p))
        grp.append(torch.full((p,), g))
        resp.append(torch.full((p,), -1))
        cursor += p
        for row in rows_of[g]:
            n = max(int(response_len[row]) - 1, 0)
            segment_start[row] = cursor
            ids.append(batch.response_ids[row, :n])
            pos.append(torch.arange(p, p + n))
            grp.append(torch.full((n,), g))
            resp.append(torch.full((n,), row))
            cursor += n
    input_ids = torch.cat(ids)
    response = torch.cat(resp)
    t = torch.arange(width)
    predictors = torch.where(
        t[None] == 0, last_prompt[group_of_row][:, None], segment_start[:, None] + t[None] - 1
    )  # token 0 from the prompt's last position, token t ≥ 1 from response token t − 1
    predictors = torch.where(t[None] < response_len[:, None], predictors, -1)
    layout = PackedLayout(
        input_ids=input_ids[None].to(device),
        position_ids=torch.cat(pos)[None].to(device),
        group=torch.cat(grp).to(device),
        response=response.to(device),
        is_prompt=(response < 0).to(device),
        predictors=predictors.to(device),
        backend=backend,
    )
    if backend == "flex":
        layout.block_mask = flex_block_mask(layout)
    else:
        layout.gather_indices(prompt_start, prompt_len[first_row], segment_start, response_len, group_of_row)
    return layout


def flex_block_mask(layout: PackedLayout):
    """The BlockMask of the rule (module docstring) over the packed row."""
    from torch.nn.attention.flex_attention import create_block_mask

    group, response, is_prompt = layout.group, layout.response, layout.is_prompt

    def mask_mod(b, h, q, k):
        return (group[q] == group[k]) & (k <= q) & (is_prompt[k] | (response[q] == response[k]))

    length = layout.length
    return create_block_mask(
        mask_mod, None, None, length, length, device=layout.group.device, _compile=layout.group.device.type == "cuda"
    )


_compiled_flex = None


def flex(query, key, value, block_mask, scale):
    """FlexAttention, compiled on a GPU (once per process; torch recompiles per new shape, dynamically after two)."""
    from torch.nn.attention.flex_attention import flex_attention

    global _compiled_flex
    if query.device.type == "cpu":
        return flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True)


def packed_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_layout: PackedLayout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The transformers attention function of the packed layout: query (1, H, L, D), key/value (1, Hkv, L, D) →
    ((1, L, H, D), None)."""
    if packed_layout is None:
        raise RuntimeError(f"attention {ATTENTION_NAME!r} runs only inside models.packed.packed_attention")
    if kwargs.get("sliding_window") is not None:
        raise ValueError("the packed layout does not support sliding-window attention")
    layout = packed_layout
    if layout.backend == "flex":
        if dropout > 0:
            raise ValueError("the flex packed attention has no dropout")
        out = flex(query, key, value, layout.block_mask, scaling)
        return out.transpose(1, 2).contiguous(), None
    heads, kv_heads = query.shape[1], key.shape[1]
    q = query[0][:, layout.q_index].transpose(0, 1)  # (R, H, Q, D)
    k = key[0][:, layout.k_index].transpose(0, 1)  # (R, Hkv, K, D)
    v = value[0][:, layout.k_index].transpose(0, 1)
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    out = nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=layout.allowed, dropout_p=dropout, scale=scaling
    )  # (R, H, Q, D)
    return out[layout.back_row, :, layout.back_slot][None], None  # (1, L, H, D)


@contextmanager
def packed_attention(decoder: nn.Module) -> Iterator[None]:
    """The decoder's attention is `ATTENTION_NAME` (registered in transformers' attention functions, idempotently)
    inside the block, restored after it."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, packed_attention_forward)
    config = hf_model(decoder).config
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        raise ValueError(f"the packed layout needs full attention in every layer (layer_types: {set(layer_types)})")
    before = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = before


def packed_blocker(model: nn.Module, with_grad: bool = True) -> str | None:
    """Why a pass over `model` cannot run the packed layout (None: it can): gradient checkpointing recomputes the
    layers in the backward, outside the packed forward's attention; sliding-window layers."""
    base = hf_model(model)
    if with_grad and getattr(base, "is_gradient_checkpointing", False):
        return "gradient checkpointing recomputes the layers outside the packed attention"
    layer_types = getattr(base.config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types):
        return "sliding-window layers"
    return None
