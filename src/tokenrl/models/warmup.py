"""A supervised warm-up of a randomly initialised policy on a task's own examples (loss: the mean over response tokens
and the end-of-sequence token of −log π(o_t | prompt, o_<t); AdamW with a linear lr warm-up over the first tenth of the
steps; seeded), cached as an HF model folder named by a hash of what determines it. The folder is written under a
temporary name and renamed when complete, so an interrupted warm-up never leaves a folder that would be loaded."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from tokenrl.data.prompts import PromptFormatter
from tokenrl.data.tasks import Task
from tokenrl.models import build_model
from tokenrl.records.settings import ModelSettings, WarmupSettings

log = logging.getLogger(__name__)


def warmup_folder(
    model: ModelSettings, settings: WarmupSettings, task_key: Mapping[str, Any], cache_root: Path
) -> Path:
    """Where the warm-up of this architecture, these settings and this task is (or will be) cached."""
    key = json.dumps(
        {
            "architecture": dict(model.architecture),
            "tokenizer": model.tokenizer,
            "dtype": model.dtype,
            "settings": dataclasses.asdict(settings),
            "task": task_key,
        },
        sort_keys=True,
        default=str,
    )
    return cache_root / f"warmup-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def warmed_up(model: ModelSettings, formatter: PromptFormatter, task: Task, cache_root: Path) -> ModelSettings:
    """`model` pointing at the warmed-up folder (`init: pretrained`) of `task`'s warm-up (`task.warmup_example(rng)`
    gives one (question, response) pair), trained now unless cached."""
    settings = task.warmup
    assert settings is not None  # a task with a warm-up (`prepared_policy`)
    folder = warmup_folder(model, settings, task.description(), cache_root)
    if (folder / "config.json").is_file():
        log.info("warm-up: loading the cached policy %s", folder)
    else:
        train_warmup(model, formatter, task.warmup_example, settings, folder)
    return dataclasses.replace(model, init="pretrained", source=str(folder))


def train_warmup(
    model_settings: ModelSettings,
    formatter: PromptFormatter,
    example: Callable[[random.Random], tuple[str, str]],
    settings: WarmupSettings,
    folder: Path,
) -> None:
    """Train `settings.steps` AdamW steps on batches of fresh examples and save the model to `folder`."""
    plain = dataclasses.replace(model_settings, init="random", lora=None, gradient_checkpointing=False)
    model = build_model(plain, seed=settings.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(settings.lr), weight_decay=0.0)
    warm = max(1, settings.steps // 10)  # linear lr warm-up over the first tenth, then constant
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warm))
    rng = random.Random(f"warmup-{settings.seed}")
    log.info("warm-up: %d supervised steps of %d examples (cached in %s)", settings.steps, settings.batch_size, folder)
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        for step in range(settings.steps):
            input_ids, attention, labels = _batch([example(rng) for _ in range(settings.batch_size)], formatter)
            loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            if (step + 1) % 100 == 0 or step + 1 == settings.steps:
                log.info("warm-up step %d/%d: loss %.4f", step + 1, settings.steps, loss.item())
    temporary = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    model.save_pretrained(str(temporary))
    try:
        temporary.rename(folder)
    except OSError:  # another process (a DDP rank) finished the same warm-up first: keep its folder
        shutil.rmtree(temporary, ignore_errors=True)


def _batch(pairs: list[tuple[str, str]], formatter: PromptFormatter) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (−100 on prompt and padding) of (question, response)s,
    each response followed by the end-of-sequence token."""
    tokenizer, rows = formatter.tokenizer, []
    for question, response in pairs:
        prompt = formatter.token_ids(question)
        answer = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    return input_ids, attention, labels
