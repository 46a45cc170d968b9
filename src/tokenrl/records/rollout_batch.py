"""`RolloutBatch`: G sampled responses per prompt with their token ids and sampling log-probs, and their
concatenation (dynamic sampling's rounds)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RolloutBatch:
    """B = prompts x G rows, group-major (rows g*G .. g*G+G-1 answer prompt g).

    prompt_ids/prompt_mask: (B, P) left-padded; response_ids/response_mask: (B, T) right-padded, the mask
    covering generated tokens up to and including EOS; sampling_logprobs: (B, T) log-prob of each sampled
    token under the processed sampling distribution (0 on padding); weights_version: optimizer steps
    applied to the weights that generated the batch.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    group_ids: torch.Tensor
    finish_reasons: list[str]
    texts: list[str]
    weights_version: int

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def rows(self, index: torch.Tensor) -> RolloutBatch:
        """The sub-batch of rows `index` (a 1-D long tensor)."""
        pick = index.tolist()
        return RolloutBatch(
            self.prompt_ids[index],
            self.prompt_mask[index],
            self.response_ids[index],
            self.response_mask[index],
            self.sampling_logprobs[index],
            self.group_ids[index],
            [self.finish_reasons[i] for i in pick],
            [self.texts[i] for i in pick],
            self.weights_version,
        )


def concat_rollouts(parts: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """The rows of `parts` in order, prompts re-padded on the left and responses on the right with `pad_id`,
    groups renumbered 0, 1, … in order of appearance. All parts must come from the same weights."""
    versions = {part.weights_version for part in parts}
    if len(versions) != 1:
        raise ValueError(f"cannot concatenate rollouts of different weights versions {sorted(versions)}")
    prompt_width = max(part.prompt_ids.shape[1] for part in parts)
    response_width = max(part.response_ids.shape[1] for part in parts)

    def padded(tensor: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
        extra = width - tensor.shape[1]
        return torch.nn.functional.pad(tensor, (extra, 0) if left else (0, extra), value=value)

    groups, offset = [], 0
    for part in parts:
        local = torch.unique(part.group_ids, return_inverse=True)[1]
        groups.append(local + offset)
        offset += int(local.max()) + 1 if local.numel() else 0
    return RolloutBatch(
        prompt_ids=torch.cat([padded(p.prompt_ids, prompt_width, pad_id, True) for p in parts]),
        prompt_mask=torch.cat([padded(p.prompt_mask, prompt_width, 0, True) for p in parts]),
        response_ids=torch.cat([padded(p.response_ids, response_width, pad_id, False) for p in parts]),
        response_mask=torch.cat([padded(p.response_mask, response_width, 0, False) for p in parts]),
        sampling_logprobs=torch.cat([padded(p.sampling_logprobs, response_width, 0.0, False) for p in parts]),
        group_ids=torch.cat(groups),
        finish_reasons=[r for p in parts for r in p.finish_reasons],
        texts=[t for p in parts for t in p.texts],
        weights_version=versions.pop(),
    )
