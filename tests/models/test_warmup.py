"""models/warmup.py: the supervised warm-up is seeded, cached by what determines it, and never loaded half-written."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import PreTrainedModel

from tokenrl.data.forks import ForksTask
from tokenrl.data.prompts import PromptFormatter
from tokenrl.models import build_model, build_tokenizer
from tokenrl.models import warmup as warmup_module
from tokenrl.models.warmup import warmed_up, warmup_folder
from tokenrl.paths import CONFIG_DIR
from tokenrl.records.settings import ModelSettings, WarmupSettings

SETTINGS = {"steps": 3, "batch_size": 4, "lr": 1.0e-3, "seed": 0}


def forks_task(seed: int = 0, **warmup) -> ForksTask:
    return ForksTask(
        layout="shared",
        width=3,
        layers=4,
        branching=2,
        distractors=0,
        train_size=4,
        test_size=2,
        seed=seed,
        max_new_tokens=6,
        warmup={**SETTINGS, **warmup},
    )


@pytest.fixture(scope="module")
def parts():
    node = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "model" / "tiny.yaml"))
    model = ModelSettings.of({key: value for key, value in node.items() if key != "defaults"})
    tokenizer = build_tokenizer(model)
    return model, forks_task(), tokenizer, PromptFormatter(tokenizer, False)


def warm(parts, root, **settings):
    model, _, _, formatter = parts
    return warmed_up(model, formatter, forks_task(**settings), root)


def weights(cfg) -> dict[str, torch.Tensor]:
    return build_model(cfg).state_dict()


def test_the_warm_up_is_seeded_and_a_second_run_loads_it_instead_of_training(parts, tmp_path, monkeypatch):
    first = warm(parts, tmp_path / "a")
    assert first.init == "pretrained" and (Path(first.source) / "config.json").is_file()
    same = warm(parts, tmp_path / "b")  # another cache, same key: trained again, the same weights
    for name, value in weights(first).items():
        assert torch.equal(value, weights(same)[name]), name
    monkeypatch.setattr(warmup_module, "train_warmup", lambda *a, **k: pytest.fail("trained a cached warm-up"))
    assert warm(parts, tmp_path / "a").source == first.source
    random_start = build_model(replace(parts[0], init="random")).state_dict()
    assert any(not torch.equal(value, random_start[name]) for name, value in weights(first).items())


def test_the_cache_key_follows_the_settings_the_task_and_the_architecture(parts, tmp_path):
    model, task, _, _ = parts
    settings = WarmupSettings(**SETTINGS)
    base = warmup_folder(model, settings, task.description(), tmp_path)
    assert warmup_folder(model, replace(settings, seed=1), task.description(), tmp_path) != base
    other = forks_task(seed=1)
    assert warmup_folder(model, settings, other.description(), tmp_path) != base
    wider = replace(model, architecture={**model.architecture, "hidden_size": 32})
    assert warmup_folder(wider, settings, task.description(), tmp_path) != base
    assert warmup_folder(model, WarmupSettings.of(dict(SETTINGS)), task.description(), tmp_path) == base


def test_an_interrupted_warm_up_leaves_no_folder_that_would_be_loaded(parts, tmp_path, monkeypatch):
    model, task, _, _ = parts

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        warm(parts, tmp_path)
    assert not (warmup_folder(model, task.warmup, task.description(), tmp_path) / "config.json").exists()


def test_warm_up_examples_are_valid_walks_from_training_routes(parts):
    _, task, _, _ = parts
    rng = random.Random(0)
    train_routes = {f"{start}..{goal}" for start, goal in task.routes["train"]}
    for _ in range(20):
        question, walk = task.warmup_example(rng)
        assert question in train_routes
        assert walk.startswith(question[0]) and len(walk) <= task.max_new_tokens - 1
        assert all(b in task.graph[a] for a, b in zip(walk, walk[1:]))
