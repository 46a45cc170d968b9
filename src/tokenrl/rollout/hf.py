"""The `hf` engine: transformers `generate` on the trainer's own model object (always in sync).

`rollout.decoding`: `dynamic`, transformers' growing KV cache (launch-bound on a GPU); `static`, a preallocated
`StaticCache` kept across calls (its length rounded up to `CACHE_BUCKET`), not compiled: the exactness reference for
the compiled path; `static_compiled`, the same cache decoded through `torch.compile(mode="reduce-overhead")`, one CUDA
graph per decode step (GPU only in practice); `auto`, `static_compiled` on CUDA unless the model is sharded (FSDP
gathers parameters inside the forward, which a CUDA graph cannot hold), else `dynamic`. Every mode records the sampled
tokens' log-probs the same way (`SampledLogprobRecorder`, outside the compiled forward)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from transformers import (
    CompileConfig,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    StaticCache,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from tokenrl.models.sharding import gathered_root, hf_model
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.rollout.engine import RolloutEngine, SamplingParams, left_pad, response_mask_until_eos

log = logging.getLogger(__name__)


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

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.interrupt(), dtype=torch.bool, device=input_ids.device)


DECODINGS = ("auto", "dynamic", "static", "static_compiled")
CACHE_BUCKET = 256  # static cache lengths are rounded up to a multiple of this: few distinct shapes, few recompiles


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP (1 or 2) wraps any part of `model`: its forward gathers parameters, no CUDA graph can hold it."""
    return any(
        type(module).__name__.startswith(("FullyShardedDataParallel", "FSDP")) for module in model.modules()
    ) or any(type(p).__name__ == "DTensor" for p in model.parameters())


class HFEngine(RolloutEngine):
    """Samples with `model.generate`; temperature/top-k/top-p are applied by our own processors so the
    recorded log-probs are those of the distribution actually sampled from. `decoding`: see the module's docstring."""

    def __init__(
        self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, weights_version: int = 0, decoding: str = "auto"
    ) -> None:
        if decoding not in DECODINGS:
            raise ValueError(f"rollout.decoding={decoding!r} is not one of {DECODINGS}")
        self.model = model
        self.weights_version = weights_version
        self.tokenizer = tokenizer
        self.decoding = decoding
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        config_eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.eos_ids = sorted({tokenizer.eos_token_id, *config_eos} - {None})
        self.interrupt: Callable[[], bool] = lambda: False  # true: stop every sequence now (a preemption signal)
        self._cache: StaticCache | None = None  # the static cache, kept across calls (its addresses: the CUDA graph's)
        self._cache_key: tuple = ()  # (rows, dtype, device, length) of the kept cache

    def decoding_on(self, device: torch.device) -> str:
        """The decoding mode used on `device` (`auto` resolved)."""
        if self.decoding != "auto":
            return self.decoding
        return "static_compiled" if device.type == "cuda" and not is_sharded(self.model) else "dynamic"

    def release_cache(self) -> None:
        """Drop the static KV cache (rows × cache length × layers × 2 × KV heads × head dim); the next call
        allocates a new one (and a compiled decode records its CUDA graph again)."""
        self._cache, self._cache_key = None, ()

    def _static_cache(self, rows: int, length: int, device: torch.device) -> StaticCache:
        """A reset static cache for `rows` sequences of at least `length` tokens: the one kept if it fits (same rows,
        dtype and device, long enough), else a new one `CACHE_BUCKET`-rounded, kept for the next call."""
        dtype = (
            torch.get_autocast_dtype(device.type)
            if torch.is_autocast_enabled(device.type)
            else next(self.model.parameters()).dtype
        )
        key = (rows, dtype, device)
        if self._cache is not None and self._cache_key[:3] == key and self._cache_key[3] >= length:
            self._cache.reset()
            return self._cache
        self.release_cache()
        cache_len = -(-length // CACHE_BUCKET) * CACHE_BUCKET
        text_config = hf_model(self.model).config.get_text_config(decoder=True)
        self._cache = StaticCache(config=text_config, max_cache_len=cache_len)
        self._cache_key = (*key, cache_len)
        return self._cache

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
        decoding = self.decoding_on(device)
        was_training = self.model.training
        self.model.eval()
        try:
            try:
                out = self._decode(ids.to(device), mask.to(device), config, processors, seed)
            except Exception as error:  # auto's compiled decode failed on this stack: the dynamic cache, logged once
                if self.decoding != "auto" or decoding == "dynamic":
                    raise
                log.warning("rollout.decoding=auto: %s failed (%r); the hf engine decodes dynamically", decoding, error)
                self.decoding = "dynamic"
                self.release_cache()
                recorder.previous, recorder.values = None, []
                out = self._decode(ids.to(device), mask.to(device), config, processors, seed)  # dynamic now
        finally:
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
            sampling_logprobs=torch.where(response_mask.bool(), logprobs, 0.0),  # after EOS top-k/p give -inf
            group_ids=torch.arange(len(prompt_ids)).repeat_interleave(n),
            finish_reasons=reasons,
            texts=self.tokenizer.batch_decode(response, skip_special_tokens=True),
            weights_version=self.weights_version,
        )

    def _decode(
        self, ids: torch.Tensor, mask: torch.Tensor, base: GenerationConfig, processors: LogitsProcessorList, seed: int
    ) -> torch.Tensor:
        """`generate` under `seed` in the decoding mode of the ids' device (`decoding_on`); prompt and response ids."""
        config, extra, decoding = copy.deepcopy(base), {}, self.decoding_on(ids.device)
        if decoding != "dynamic":
            rows, length = ids.shape[0] * base.num_return_sequences, ids.shape[1] + base.max_new_tokens
            extra["past_key_values"] = self._static_cache(rows, length, ids.device)
            if decoding == "static":
                config.disable_compile = True  # generate compiles a static-cache decode on CUDA by itself
            else:
                config.compile_config = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead")
                if ids.device.type != "cuda":
                    config.compile_config._compile_all_devices = True  # generate compiles only on accelerators
        with torch.random.fork_rng(devices=[ids.device] if ids.device.type == "cuda" else []):
            torch.manual_seed(seed)
            return self.model.generate(  # type: ignore[operator]  # torch types it Tensor | Module: the HF/PEFT model's method
                input_ids=ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([StopWhen(self.interrupt)]),
                **extra,
            )

    def context(self) -> AbstractContextManager:
        """Generation runs on the trainer's model object itself: under FSDP its root unit is gathered."""
        return gathered_root(self.model)

    def _sync_weights(self, model: nn.Module, version: int) -> None:
        """Nothing to copy: generation runs on the trainer's model object itself."""
        self.weights_version = version
