"""A tiny random Qwen2 + character tokenizer built from the real `model=tiny` config."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.conftest import compose_config
from tokenrl.models import build_model, build_tokenizer
from tokenrl.records.settings import ModelSettings


def tiny_settings(**model_overrides) -> ModelSettings:
    """The `model=tiny` preset's settings, with `model_overrides`."""
    node = OmegaConf.to_container(compose_config(["model=tiny"]).model, resolve=True)
    return ModelSettings.of({**node, **model_overrides})


def tiny_policy(seed: int = 0, **model_overrides):
    settings = tiny_settings(**model_overrides)
    return build_model(settings, seed=seed), build_tokenizer(settings)


PROMPTS = ["What is 2 + 3?", "Hi", "A longer prompt, with padding to the left."]


def rollouts(temperature=1.0, top_p=1.0, top_k=0, seed=0, max_new_tokens=10, n=3):
    """The tiny policy, an hf engine on it, and `n` sampled rollouts of each of PROMPTS."""
    from tokenrl.rollout.engine import SamplingParams
    from tokenrl.rollout.hf import HFEngine

    model, tok = tiny_policy()
    engine = HFEngine(model, tok)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens)
    return model, engine, engine.generate(ids, params, seed=seed)
