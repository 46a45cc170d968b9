"""`ModuleSpec.of` (run/module_spec.py) reads each of the module's settings from the key users write, and builds its
parts from their nodes: the one place a config becomes a `GRPOModule`'s inputs."""

from __future__ import annotations

import functools

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tokenrl.config.check import RunSettings
from tokenrl.data.prompts import PromptFormatter
from tokenrl.models import build_tokenizer
from tokenrl.records.settings import ModelSettings
from tokenrl.run.module_spec import ModuleSpec
from tokenrl.selectors import ICTSelector
from tokenrl.step.fast_path import FastPath


def test_the_spec_reads_each_setting_from_the_key_users_write(tiny_cfg, tmp_path):
    cfg = tiny_cfg(
        "selector=ict",
        "selector_ratio=0.25",
        "seed=3",
        "total_steps=7",
        "reward_timeout_s=9",
        "diagnostics.js=true",
        "validation.every_n_steps=2",
        "validation.limit=5",
        "samples.rows=3",
        "fast_path.pack=false",
        "algorithm.kl_coef=0.0",
    )
    model = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    tokenizer = build_tokenizer(model)
    task = instantiate(cfg.task)
    spec = ModuleSpec.of(cfg, RunSettings.of(cfg), task, tokenizer, PromptFormatter(tokenizer, cfg.model.chat_template))
    assert spec.model == model  # no warm-up for this task
    assert spec.algorithm.loss.kl_coef == 0.0 and spec.rollout.max_new_tokens == 12
    assert isinstance(spec.selector, ICTSelector) and spec.selector.ratio == 0.25
    assert spec.tokenizer is tokenizer
    assert isinstance(spec.optimizer, functools.partial) and spec.optimizer.func is torch.optim.AdamW
    assert (spec.seed, spec.total_steps, spec.reward_timeout_s, spec.js_diagnostics) == (3, 7, 9, True)
    assert spec.val_every_n_steps == 2 and [len(s.problems) for s in spec.validator.sets] == [5]
    assert spec.sample_writer.rows == 3 and spec.sample_writer.folder == tmp_path / "samples"
    assert spec.fast_path == FastPath("shared_prefix", pack=False, layout_auto=True)
    assert spec.fork_marker.tokenizer is tokenizer


def test_no_validator_when_validation_is_off(tiny_cfg):
    cfg = tiny_cfg()  # validation.every_n_steps=0
    tokenizer = build_tokenizer(ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True)))
    spec = ModuleSpec.of(cfg, RunSettings.of(cfg), instantiate(cfg.task), tokenizer, PromptFormatter(tokenizer, False))
    assert spec.validator is None and spec.val_every_n_steps == 0
