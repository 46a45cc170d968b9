"""`ModuleSpec`: what `GRPOModule` is built from, read from the composed config in one place (`ModuleSpec.of`): the
settings of its groups, and the parts that need the run's task, tokenizer and prompt formatter (the policy, warmed up
where the task asks, the validator, the sample writer and the fork marker)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.config.check import RunSettings
from tokenrl.data.benchmarks import benchmark, expand
from tokenrl.data.prompts import PromptFormatter
from tokenrl.data.tasks import Task
from tokenrl.evaluation.runner import EvalSettings, ValidationSet, Validator
from tokenrl.models.warmup import warmed_up
from tokenrl.observe.samples import SampleWriter
from tokenrl.records.settings import ModelSettings, RolloutSettings
from tokenrl.rollout.fork_marks import ForkMarker
from tokenrl.run.devices import runs_on_gpu
from tokenrl.selectors.base import TokenSelector
from tokenrl.step.fast_path import FastPath

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModuleSpec:
    """The settings and parts of one `GRPOModule`, each setting node a typed record read once."""

    model: ModelSettings  # a task's warm-up points it at the warmed-up folder
    algorithm: AlgorithmConfig
    rollout: RolloutSettings
    selector: TokenSelector
    tokenizer: PreTrainedTokenizerBase
    optimizer: Callable[..., torch.optim.Optimizer]  # the `_partial_` optimizer, given the trainable parameters
    seed: int = 0
    reward_timeout_s: float = 5.0
    js_diagnostics: bool = False  # JS also when the selector does not read it (diagnostics.js)
    validator: Validator | None = None
    val_every_n_steps: int = 0
    total_steps: int = 0
    sample_writer: SampleWriter | None = None
    fast_path: FastPath = field(default_factory=FastPath)  # every exact shortcut on
    fork_marker: ForkMarker | None = None

    @classmethod
    def of(
        cls,
        cfg: DictConfig,
        settings: RunSettings,
        task: Task,
        tokenizer: PreTrainedTokenizerBase,
        formatter: PromptFormatter,
    ) -> ModuleSpec:
        """The spec the composed train config describes (its setting nodes read as `settings`) for the run's task,
        tokenizer and formatter, built in the order the seeded run draws from its random streams (the warm-up first)."""
        model = prepared_policy(settings.model, task, formatter, Path(cfg.paths.model_cache))
        checker = validator_for(cfg, task, formatter) if cfg.validation.every_n_steps else None
        selector = instantiate(cfg.selector)
        return cls(
            model=model,
            algorithm=settings.algorithm,
            rollout=settings.rollout,
            selector=selector,
            tokenizer=tokenizer,
            optimizer=instantiate(cfg.algorithm.optimizer),
            seed=cfg.seed,
            reward_timeout_s=cfg.reward_timeout_s,
            js_diagnostics=cfg.diagnostics.js,
            validator=checker,
            val_every_n_steps=cfg.validation.every_n_steps,
            total_steps=cfg.total_steps,
            sample_writer=SampleWriter(
                Path(cfg.paths.output_dir) / "samples", cfg.samples.every_n_steps, cfg.samples.rows, tokenizer, selector
            ),
            fast_path=FastPath.from_node(cfg.get("fast_path"), on_gpu=runs_on_gpu(cfg)),
            fork_marker=ForkMarker(task.forks_of, tokenizer),
        )


def prepared_policy(model: ModelSettings, task: Task, formatter: PromptFormatter, cache_root: Path) -> ModelSettings:
    """The model to train: a random policy of a task with a supervised warm-up (task=forks) points at the warmed-up
    folder (trained now or loaded from `paths.model_cache`, models/warmup.py); any other unchanged."""
    if task.warmup is None or model.init != "random":
        if task.warmup is not None:
            log.info("model.init=%s: the task's warm-up is for random policies and is skipped", model.init)
        return model
    return warmed_up(model, formatter, task, cache_root)


def validator_for(cfg: DictConfig, task: Task, formatter: PromptFormatter) -> Validator:
    """Held-out pass@k as `validation.*` sets it, sampling as `rollout.*` does where `validation.*` leaves it null."""
    settings = EvalSettings(
        n_samples=cfg.validation.n_samples,
        ks=tuple(cfg.validation.ks),
        temperature=cfg.rollout.temperature if cfg.validation.temperature is None else cfg.validation.temperature,
        top_p=cfg.rollout.top_p if cfg.validation.top_p is None else cfg.validation.top_p,
        top_k=cfg.rollout.top_k,
        max_new_tokens=cfg.rollout.max_new_tokens,
        max_prompt_length=cfg.rollout.max_prompt_length,
        batch_prompts=cfg.validation.batch_prompts,
        seed=cfg.seed,
    )
    return Validator(validation_sets(cfg, task), formatter, settings)


def validation_sets(cfg: DictConfig, task: Task) -> list[ValidationSet]:
    """The task's test split, then each of `validation.benchmarks` with its own instruction and verifier; the first
    `validation.limit` problems of each."""
    limit = cfg.validation.limit
    sets = [ValidationSet("", task.problems("test")[:limit], task.instruction)]
    extra = cfg.validation.benchmarks
    try:
        names = expand(list(extra) if OmegaConf.is_list(extra) else str(extra)) if extra else []
    except KeyError as err:
        raise ValueError(f"validation.benchmarks: {err.args[0]}") from None
    for name in names:
        bench = benchmark(name)
        sets.append(ValidationSet(f"{name}/", bench.load(cfg.paths.data_dir)[:limit], bench.instruction))
    return sets
