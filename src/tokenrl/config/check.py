"""The composed config checked once at start-up, before any model or dataset loads.

`check_config` collects every problem — a wrong type or range, a broken relation (k ≤ n, warm-up < total_steps, a
mini-batch that the batch cannot be split into), an unknown key (a `+key` override that nothing reads, a keyword the
`_target_` of its node does not take) with the nearest valid key — and raises one `ConfigError` that lists them,
one line per key. `checked_settings` returns what it validated, the setting nodes as typed records read once
(`RunSettings`), with the warnings that do not stop a run (a selector warm-up over most of the run).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import inspect
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.config.known_settings import (
    OPTIONAL_DEPENDENCIES,
    RENAMED,
    RULES,
    TARGET_RULES,
    VLLM_INSTALL,
    renamed_problem,
)
from tokenrl.records.rules import Rule, is_int
from tokenrl.records.settings import ModelSettings, RolloutSettings
from tokenrl.utils import as_dict

# Nodes whose keys tokenrl reads itself: a key added to them with `+` is read by nothing.
CLOSED_NODES = (
    "",
    "validation",
    "samples",
    "fast_path",
    "diagnostics",
    "checkpoint",
    "rollout",
    "model",
    "algorithm",
    "paths",
    "export",
    "resume",
)
# Keys of closed nodes that are optional (read with `.get`): `+model.lora={...}` is how LoRA is turned on.
OPTIONAL_KEYS = {"model": ("lora", "tokenizer", "reference_dtype", "gradient_checkpointing", "paper_task")}
# Nodes built by `hydra.utils.instantiate` (and each logger): each key must be a keyword of their `_target_`.
TARGET_NODES = (
    "selector",
    "task",
    "trainer",
    "trainer.strategy",
    "trainer.strategy.mixed_precision",
    "algorithm.optimizer",
)
# Built before the model loads, so their relations between keywords are checked here too.
COMPONENTS = ("selector", "task")
# Trainer keys tokenrl sets itself: the training length is `total_steps` rollout steps.
TRAINER_OWNED = {
    "max_epochs": "total_steps",
    "max_steps": "total_steps",
    "min_epochs": "total_steps",
    "min_steps": "total_steps",
    "max_time": "total_steps",
    "limit_train_batches": "total_steps",
    "callbacks": "checkpoint.* (tokenrl adds its callbacks)",
}
INTERPOLATION = re.compile(r"\$\{([\w.]+)\}")


class ConfigError(ValueError):
    """Bad settings: one line per key, each naming the key, its value and what is allowed."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"{len(problems)} bad setting{'s' if len(problems) > 1 else ''}:\n{lines}")


def nearest(key: str, candidates: Iterable[str]) -> str:
    """' (did you mean `x`?)' for the closest candidate, or '' when none is close."""
    match = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean `{match[0]}`?)" if match else ""


def _select(cfg: DictConfig, path: str) -> Any:
    return OmegaConf.select(cfg, path, throw_on_missing=False) if path else cfg


def typed_key(cfg: DictConfig, path: str) -> str:
    """The key as the user types it: a key whose value is a plain `${other.key}` is reported as that key (the
    documented top-level `selector_ratio` rather than `selector.ratio`)."""
    parent, _, leaf = path.rpartition(".")
    node = _select(cfg, parent)
    child = node._get_node(leaf) if isinstance(node, DictConfig) and leaf in node.keys() else None
    if child is not None and OmegaConf.is_interpolation(child):
        match = INTERPOLATION.fullmatch(str(child._value()))
        if match and match.group(1) != path:
            return typed_key(cfg, match.group(1))
    return path


def target_rules(target: str) -> dict[str, Rule] | None:
    """The keyword rules of a `_target_`: a third-party class's from config/known_settings.py, a tokenrl component's
    from its class (`Configurable.config_rules`); None when it cannot be imported."""
    if target in TARGET_RULES:
        return TARGET_RULES[target]
    try:
        return dict(getattr(get_method(target), "config_rules", {}))
    except Exception:  # noqa: BLE001 — hydra raises several kinds; reported as "cannot be imported"
        return None


def target_nodes(cfg: DictConfig) -> list[str]:
    """Paths of the nodes this config builds with `_target_` (the loggers' included)."""
    paths = [path for path in TARGET_NODES if isinstance(_select(cfg, path), DictConfig)]
    loggers = _select(cfg, "logger")
    if isinstance(loggers, DictConfig):
        paths += [f"logger.{name!s}" for name in loggers if isinstance(loggers[name], DictConfig)]
    return [path for path in paths if "_target_" in _select(cfg, path)]


def _checked(cfg: DictConfig, path: str, rule: Rule, problems: list[str]) -> None:
    """Check the value at `path` against `rule`, naming the key as typed; a `???` value is reported as missing."""
    parent, _, leaf = path.rpartition(".")
    node = _select(cfg, parent)
    if not isinstance(node, DictConfig) or leaf not in node.keys():  # `in node` is False for a `???` value
        return  # a node a config does not have (an eval config, a run without validation)
    key = typed_key(cfg, path)
    if OmegaConf.is_missing(node, leaf):
        problems.append(f"{key}: must be set: {rule.allowed}")
        return
    if key != path and key in RULES:
        return  # a copy of another key (validation.top_p: ${rollout.top_p}): checked there
    value = OmegaConf.select(cfg, path)
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    problems += [problem.replace(path, key, 1) for problem in rule.problems(path, value)]


def _value_problems(cfg: DictConfig) -> list[str]:
    problems: list[str] = []
    for path, rule in RULES.items():
        _checked(cfg, path, rule, problems)
    for path in target_nodes(cfg):
        rules = target_rules(_select(cfg, path)._target_) or {}
        for key, rule in rules.items():
            _checked(cfg, f"{path}.{key}", rule, problems)
    return list(dict.fromkeys(problems))


def _dependency_problems(cfg: DictConfig) -> list[str]:
    """Packages the config needs that are not installed, with the command that installs them."""
    problems = []
    for path in target_nodes(cfg):
        needed = OPTIONAL_DEPENDENCIES.get(_select(cfg, path)._target_)
        if needed and importlib.util.find_spec(needed[0]) is None:
            problems.append(
                f"{path}: needs the {needed[0]} package, which is not installed: {needed[1]} "
                f"(or leave it out: logger=default)"
            )
    rollout = _select(cfg, "rollout")
    if isinstance(rollout, DictConfig) and rollout.get("engine") == "vllm" and importlib.util.find_spec("vllm") is None:
        problems.append(
            f"rollout.engine=vllm: needs the {VLLM_INSTALL[0]} package, which is not installed: {VLLM_INSTALL[1]}"
        )
    return problems


def _component_problems(cfg: DictConfig) -> list[str]:
    """Build the selector and the task (cheap: no model, no data) so the relations their constructors check are
    reported now, with the key as typed."""
    problems = []
    for path in COMPONENTS:
        node = _select(cfg, path)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        try:
            instantiate(node)
        except (ValueError, InstantiationException) as err:
            cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ else err
            if not isinstance(cause, ValueError):
                raise
            message = str(cause)
            keyed = re.match(rf"{path}\.(\w+)", message)
            if keyed:
                message = message.replace(keyed.group(0), typed_key(cfg, keyed.group(0)), 1)
            problems.append(message)
    return problems


def _task_marks_problems(cfg: DictConfig) -> list[str]:
    """A selector that reads the task's true forks (`requires` names `forks`: selectors/forks_oracle.py) on a task
    that cannot name them (its `forks_of` is data/tasks.py's `Task.forks_of`, which names none)."""
    selector, task = _select(cfg, "selector"), _select(cfg, "task")
    if not all(isinstance(node, DictConfig) and "_target_" in node for node in (selector, task)):
        return []
    try:
        needs = "forks" in getattr(get_method(selector._target_), "requires", ())
        forks_of = getattr(get_method(task._target_), "forks_of", None)
        names = getattr(forks_of, "__qualname__", "Task.forks_of") != "Task.forks_of"
    except Exception:  # noqa: BLE001 — a target that cannot be imported is reported as such elsewhere
        return []
    if needs and not names:
        name = getattr(get_method(selector._target_), "name", selector._target_)
        return [f"selector={name}: reads the task's true forks, which {task._target_} cannot name; use task=forks"]
    return []


@dataclass(frozen=True)
class RunSettings:
    """The setting nodes of a train config as typed records, each read once (`of`), and the start-up check's
    warnings (`checked_settings`)."""

    model: ModelSettings
    rollout: RolloutSettings
    algorithm: AlgorithmConfig
    warnings: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: DictConfig) -> RunSettings:
        rollout = RolloutSettings.of(as_dict(cfg.rollout))
        algorithm = AlgorithmConfig.from_node(as_dict(cfg.algorithm), rollout.max_new_tokens)
        return cls(ModelSettings.of(as_dict(cfg.model)), rollout, algorithm)


def _relation_problems(cfg: DictConfig, parsed: bool) -> list[str]:
    """Relations between settings; those of the algorithm node only where its record parsed (`parsed`)."""
    problems = []
    n, ks = cfg.validation.n_samples, cfg.validation.ks
    bad_ks = [k for k in ks if not (is_int(k) and k >= 1 and (not is_int(n) or k <= n))]
    if bad_ks:
        problems.append(
            f"validation.ks={list(ks)}: each k must be an integer in [1, validation.n_samples={n}] "
            f"(unbiased pass@k needs k <= n); bad: {bad_ks}"
        )
    if not parsed:
        return problems
    algorithm = cfg.algorithm
    rows = algorithm.prompts_per_step * algorithm.group_size
    if rows % algorithm.mini_batches:
        problems.append(
            f"algorithm.mini_batches={algorithm.mini_batches}: the {rows} responses of a step "
            f"(algorithm.prompts_per_step={algorithm.prompts_per_step} × algorithm.group_size="
            f"{algorithm.group_size}) must split into equal mini-batches"
        )
    if algorithm.get("micro_batch_tokens") is not None and uses_fsdp(cfg.trainer):
        problems.append(
            f"algorithm.micro_batch_tokens={algorithm.micro_batch_tokens} with trainer=fsdp: each rank cuts its own "
            "rows by their lengths, so ranks would run different numbers of forwards, and under FSDP every forward "
            "gathers parameters from all ranks; use algorithm.micro_batch_size (rows) with FSDP"
        )
    rollout = cfg.rollout
    batched = rollout.get("max_num_batched_tokens")
    if batched and not rollout.get("enable_chunked_prefill") and batched < rollout.get("max_model_len", 0):
        problems.append(
            f"rollout.max_num_batched_tokens={batched}: below rollout.max_model_len="
            f"{rollout.max_model_len} without chunked prefill, vLLM refuses to start; raise it or set "
            "rollout.enable_chunked_prefill=true"
        )
    warmup = cfg.selector.get("warmup_steps") if "selector" in cfg else None
    if is_int(warmup) and is_int(cfg.total_steps) and warmup >= cfg.total_steps:
        problems.append(
            f"selector_warmup_steps={warmup}: selector {cfg.selector._target_.rsplit('.', 1)[-1]} "
            f"updates every token for its first {warmup} steps, so a run of total_steps="
            f"{cfg.total_steps} never selects; set selector_warmup_steps below total_steps "
            f"(the paper's Θ = 20 is for runs of hundreds of steps)"
        )
    return problems + _device_problems(cfg)


def _device_problems(cfg: DictConfig) -> list[str]:
    """`trainer.devices` against this machine and the step's prompts, here in the main process, once: otherwise each
    launched process loads the model and then fails on its own. A GPU count is checked only where a GPU answers
    (elsewhere Lightning says there is none)."""
    trainer = cfg.trainer
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes", 1)
    if not (is_int(devices) and devices >= 1 and is_int(nodes)):
        return []  # -1 / "auto" / a list of indices: Lightning counts what is there
    import torch

    gpu = str(trainer.get("accelerator")) in ("gpu", "cuda")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    have = torch.cuda.device_count() if gpu else cores
    problems = []
    if have and devices > have:
        kind = "GPUs" if gpu else "CPU cores"
        problems.append(
            f"trainer.devices={devices}: this machine has {have} {kind}; set trainer.devices={have} or fewer"
        )
    world, prompts = devices * nodes, cfg.algorithm.prompts_per_step
    if world > 1 and is_int(prompts) and prompts % world:
        problems.append(
            f"trainer.devices={devices}: algorithm.prompts_per_step={prompts} must be divisible by the {world} "
            "training processes (each takes an equal share of a step's prompts); change either"
        )
    return problems


def uses_fsdp(trainer: Any) -> bool:
    """Whether a composed `trainer` node shards with FSDP (`AtomicFSDPStrategy`, `FSDPStrategy`, "fsdp")."""
    return "fsdp" in str(trainer.get("strategy", "")).lower()


def _added_keys(overrides: Iterable[str]) -> list[str]:
    """Key paths that `+key=value` / `++key=value` overrides add (not `~key` deletions or config-group choices)."""
    keys = []
    for override in overrides:
        if override.startswith("+") and "=" in override:
            keys.append(override.lstrip("+").split("=", 1)[0].split("@", 1)[0])
    return keys


def _unknown_key_problems(cfg: DictConfig, overrides: Iterable[str]) -> list[str]:
    problems = []
    for key in _added_keys(overrides):
        parent, _, leaf = key.rpartition(".")
        if parent in CLOSED_NODES and leaf not in OPTIONAL_KEYS.get(parent, ()):
            node = _select(cfg, parent)
            siblings = [str(k) for k in node if k != leaf] if isinstance(node, DictConfig) else []
            where = f"`{parent}`" if parent else "the top level"
            problems.append(f"+{key}: no such setting at {where}; nothing would read it{nearest(leaf, siblings)}")
    for path in target_nodes(cfg):
        node = _select(cfg, path)
        target = node._target_
        try:
            factory = get_method(target)  # any callable: a class or a function (`_partial_`)
        except Exception:  # noqa: BLE001 — hydra raises several kinds; the message is what matters
            problems.append(f"{path}._target_={target!r}: cannot be imported")
            continue
        parameters = inspect.signature(factory).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            continue
        for key in node:
            if key.startswith("_") and key.endswith("_"):
                continue
            if key not in parameters:
                problems.append(f"{path}.{key}: {target} takes no such setting{nearest(key, parameters)}")
    trainer = _select(cfg, "trainer")
    if isinstance(trainer, DictConfig):
        for key, instead in TRAINER_OWNED.items():
            if key in trainer:
                problems.append(f"trainer.{key}={trainer[key]!r}: set by tokenrl; use {instead} instead")
    return problems


def _renamed_problems(cfg: DictConfig) -> list[str]:
    """Old names a config file (a user's experiment, `+key=`) still sets: nothing reads them."""
    found = [(key, OmegaConf.select(cfg, key)) for key in RENAMED if OmegaConf.select(cfg, key) is not None]
    return [problem for key, value in found if (problem := renamed_problem(key, value))]


def _wired_key_problems(overrides: Iterable[str]) -> list[str]:
    """Overrides of a key the chosen preset takes from another setting (a sweep's job too: its choices are Hydra's)."""
    from hydra.core.hydra_config import HydraConfig

    from tokenrl.config.presets import wired_key_problem

    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    return [problem for arg in overrides if (problem := wired_key_problem(arg, choices))]


def check_config(cfg: DictConfig, overrides: Iterable[str] = ()) -> list[str]:
    """Raises `ConfigError` listing every bad setting of the composed train config; returns the warnings."""
    return list(checked_settings(cfg, overrides).warnings)


def checked_settings(cfg: DictConfig, overrides: Iterable[str] = ()) -> RunSettings:
    """The typed records of the composed train config, with the warnings; raises `ConfigError` listing every bad
    setting. `overrides`: the command line's overrides (Hydra's `overrides.task`), to find keys that `+` added."""
    overrides = list(overrides)
    problems = _renamed_problems(cfg) + _wired_key_problems(overrides) + _value_problems(cfg)
    problems += _unknown_key_problems(cfg, overrides)
    settings = None
    if not problems:  # relations read values whose types are now known to be right
        try:
            settings = RunSettings.of(cfg)
        except ValueError as err:
            problems.append(str(err))
        problems += _relation_problems(cfg, settings is not None) + _component_problems(cfg)
        problems += _task_marks_problems(cfg)
    problems += _dependency_problems(cfg)
    if problems or settings is None:
        raise ConfigError(problems)
    warnings = []
    warmup = cfg.selector.get("warmup_steps") if "selector" in cfg else None
    if is_int(warmup) and warmup > cfg.total_steps // 2:
        warnings.append(
            f"selector_warmup_steps={warmup} covers most of total_steps={cfg.total_steps}: the selector "
            f"acts on only the last {cfg.total_steps - warmup} steps"
        )
    return dataclasses.replace(settings, warnings=tuple(warnings))


def check_eval_config(cfg: DictConfig) -> None:
    """Raises `ConfigError` listing every bad setting of the composed eval config (eval.py)."""
    problems = _value_problems(cfg)
    n, ks = cfg.eval.n_samples, cfg.eval.ks
    if not problems and is_int(n) and any(k > n for k in ks):
        problems.append(f"eval.ks={list(ks)}: each k must be <= eval.n_samples={n} (unbiased pass@k needs k <= n)")
    problems += _dependency_problems(cfg)
    if problems:
        raise ConfigError(problems)
