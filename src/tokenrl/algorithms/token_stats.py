"""Per-response-token statistics and log-probs from the policy, at the sampling temperature.

The no-grad statistics pass is chunked over response tokens, so its peak memory is O(chunk × vocab),
never O(batch × length × vocab) (the failure users of RLVR frameworks report most with Qwen's 151,936 vocab).
Formulas (π = softmax(z / T), T = sampling temperature, ALGORITHMS.md §1.5 and §2.2):
log π(o_t); Shannon H = −Σ π log π; Rényi-2 H₂ = −log Σ π².
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tokenrl.rollout.base import RolloutBatch


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The transformer body (hidden states) and the output projection of a causal LM (PEFT-wrapped or not)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def response_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    prompt_width: int) -> torch.Tensor:
    """(b, T, H) hidden states that predict response tokens 0..T−1 (positions P−1 .. P+T−2)."""
    decoder, _ = decoder_and_head(model)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     use_cache=False).last_hidden_state
    return hidden[:, prompt_width - 1:-1]


def response_logprobs(model: nn.Module, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    """(b, T) log π_θ(o_t) with gradient, for the update (logits of this micro-batch only)."""
    device = next(model.parameters()).device
    _, head = decoder_and_head(model)
    hidden = response_hidden(model, batch.input_ids.to(device), batch.attention_mask.to(device),
                             batch.prompt_ids.shape[1])
    logits = head(hidden).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, batch.response_ids.to(device)[..., None]).squeeze(-1)


@dataclass
class TokenStats:
    """(B, T) float32 per response token, 0 on padding."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    renyi2: torch.Tensor


@torch.no_grad()
def compute_token_stats(model: nn.Module, batch: RolloutBatch, temperature: float, micro_batch_size: int,
                        chunk_size: int) -> TokenStats:
    """Statistics of every response token, micro-batched over rows and chunked over tokens."""
    device = next(model.parameters()).device
    _, head = decoder_and_head(model)
    shape = batch.response_ids.shape
    out = {name: torch.zeros(shape, dtype=torch.float32) for name in ("logprobs", "entropy", "renyi2")}
    for start in range(0, shape[0], micro_batch_size):
        rows = torch.arange(start, min(start + micro_batch_size, shape[0]))
        part = batch.rows(rows)
        hidden = response_hidden(model, part.input_ids.to(device), part.attention_mask.to(device),
                                 part.prompt_ids.shape[1])
        where = part.response_mask.bool()
        tokens = hidden[where.to(device)]                      # (N, H): only real response tokens
        targets = part.response_ids[where].to(device)
        values = {name: torch.empty(tokens.shape[0]) for name in out}
        for c0 in range(0, tokens.shape[0], chunk_size):
            c1 = min(c0 + chunk_size, tokens.shape[0])
            logp = torch.log_softmax(head(tokens[c0:c1]).float() / temperature, dim=-1)   # (C, V)
            p = logp.exp()
            values["logprobs"][c0:c1] = logp.gather(-1, targets[c0:c1, None]).squeeze(-1).cpu()
            values["entropy"][c0:c1] = -(p * logp).sum(-1).cpu()
            values["renyi2"][c0:c1] = -torch.log((p * p).sum(-1)).cpu()
        for name, value in values.items():
            block = out[name][rows]
            block[where] = value
            out[name][rows] = block
    return TokenStats(**out)
