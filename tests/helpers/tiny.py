"""A tiny random Qwen2 + character tokenizer built from the real `model=tiny` config."""
from __future__ import annotations

from omegaconf import OmegaConf

from tests.conftest import compose_config
from tokenrl.models import build_model, build_tokenizer


def tiny_policy(seed: int = 0, **model_overrides):
    cfg = OmegaConf.to_container(compose_config(["model=tiny"]).model, resolve=True)
    cfg.update(model_overrides)
    return build_model(cfg, seed=seed), build_tokenizer(cfg)
