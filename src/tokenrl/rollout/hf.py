"""The `hf` engine: transformers `generate` on the trainer's own model object (always in sync)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.rollout.base import RolloutEngine, SamplingParams, left_pad, response_mask_until_eos


class SampledLogprobRecorder(LogitsProcessor):
    """Records log softmax of the fully processed scores, gathered at the token sampled from them.

    Placed last in the processor list, it sees the distribution that is actually sampled; at each call
    the previous step's sampled token is input_ids[:, -1], so only one (rows, V) tensor is kept.
    """

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.values: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._gather(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _gather(self, tokens: torch.Tensor) -> None:
        if self.previous is not None:
            self.values.append(self.previous.gather(1, tokens[:, None]).squeeze(1))

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        self._gather(last_tokens)
        return torch.stack(self.values, dim=1)


class StopWhen(StoppingCriteria):
    """Stops every sequence once `interrupt()` is true (checked after each generated token)."""

    def __init__(self, interrupt: Callable[[], bool]) -> None:
        self.interrupt = interrupt

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.interrupt(), dtype=torch.bool, device=input_ids.device)


class HFEngine(RolloutEngine):
    """Samples with `model.generate`; temperature/top-k/top-p are applied by our own processors so the
    recorded log-probs are those of the distribution actually sampled from."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, weights_version: int = 0) -> None:
        self.model = model
        self.weights_version = weights_version
        self.tokenizer = tokenizer
        self.eos_ids = sorted({tokenizer.eos_token_id, *self._config_eos(model)} - {None})
        self.interrupt: Callable[[], bool] = lambda: False  # true: stop every sequence now (a preemption signal)

    @staticmethod
    def _config_eos(model: nn.Module) -> list[int]:
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))

    @torch.no_grad()
    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        ids, mask = left_pad(prompt_ids, pad)
        recorder = SampledLogprobRecorder()
        processors = LogitsProcessorList()
        if params.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            processors.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
        processors.append(recorder)
        config = GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n,
            pad_token_id=pad,
            eos_token_id=self.eos_ids,
        )
        was_training = self.model.training
        self.model.eval()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([StopWhen(self.interrupt)]),
            )
        self.model.train(was_training)
        response = out[:, ids.shape[1] :].cpu()
        logprobs = recorder.finish(out[:, -1]).cpu()
        response_mask, reasons = response_mask_until_eos(response, self.eos_ids)
        response = torch.where(response_mask.bool(), response, torch.full_like(response, pad))
        n = params.n
        return RolloutBatch(
            prompt_ids=ids.repeat_interleave(n, dim=0),
            prompt_mask=mask.repeat_interleave(n, dim=0),
            response_ids=response,
            response_mask=response_mask,
            sampling_logprobs=logprobs * response_mask,
            group_ids=torch.arange(len(prompt_ids)).repeat_interleave(n),
            finish_reasons=reasons,
            texts=self.tokenizer.batch_decode(response, skip_special_tokens=True),
            weights_version=self.weights_version,
        )

    def _sync_weights(self, model: nn.Module, version: int) -> None:
        """Nothing to copy: generation runs on the trainer's model object itself."""
        self.weights_version = version
