"""rollout/vllm_compat.py: the supported vLLM range, 0.26 through 0.32, and the engine's word when the installed vLLM
is outside it. The engine's own tests run against both ends with their CPU builds (`bash scripts/vllm_range.sh`)."""

from __future__ import annotations

import logging
import sys
import types

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_config


@pytest.mark.parametrize(
    "version, inside",
    [
        ("0.26.0", True),
        ("0.26.0+cpu", True),
        ("0.29.3", True),
        ("0.32.0", True),
        ("0.32.4.dev7+g1234abc", True),
        ("0.25.2", False),
        ("0.33.0rc1", False),
        ("0.33.0", False),
        ("1.0.0", False),
    ],
)
def test_the_supported_range_is_0_26_through_0_32_whatever_the_patch_or_local_label(version, inside):
    from tokenrl.rollout.vllm_compat import supported

    assert supported(version) is inside


class StandInLLM:
    """Takes vLLM's place: what `VLLMEngine.__init__` calls, no engine behind it."""

    def __init__(self, **kwargs):
        self.llm_engine = None

    def collective_rpc(self, method, kwargs=None):
        if kwargs:  # reload_weights; a function (the CPU head's refresh) has no worker to run on here
            list(kwargs["weights_iterator"])

    def reset_prefix_cache(self):
        pass


@pytest.mark.parametrize("version, warned", [("0.25.1", True), ("0.33.0", True), ("0.26.0+cpu", False)])
def test_the_engine_says_when_the_installed_vllm_is_outside_the_range(monkeypatch, caplog, tmp_path, version, warned):
    from tests.helpers.tiny import tiny_policy
    from tokenrl.records.settings import RolloutSettings
    from tokenrl.rollout import build_engine

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__=version, LLM=StandInLLM))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model, tokenizer = tiny_policy()
    cfg = RolloutSettings.of(OmegaConf.to_container(compose_config(["rollout=vllm"]).rollout, resolve=True))
    with caplog.at_level(logging.WARNING, logger="tokenrl.rollout.vllm_engine"):
        build_engine(cfg, model, tokenizer)
    said = [r.getMessage().partition(":")[0] for r in caplog.records if "outside the range" in r.getMessage()]
    assert said == ([f"vLLM {version} is outside the range tokenrl supports and tests, 0.26 to 0.32"] if warned else [])
