"""The composed config checked once at start-up, before any model or dataset loads.

`check_config` collects every problem — a wrong type or range, a broken relation (k ≤ n, warm-up < total_steps, a
mini-batch that the batch cannot be split into), an unknown key (a `+key` override that nothing reads, a keyword the
`_target_` of its node does not take) with the nearest valid key — and raises one `ConfigError` that lists them,
one line per key. It returns the warnings that do not stop a run (a selector warm-up over most of the run).
"""
from __future__ import annotations

import difflib
import inspect
import math
from typing import Any, Callable, Iterable

from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from tokenrl.algorithms.config import AlgorithmConfig

# Nodes whose keys tokenrl reads itself: a key added to them with `+` is read by nothing.
CLOSED_NODES = ("", "validation", "samples", "fast_path", "diagnostics", "checkpoint", "rollout", "model", "algorithm",
                "paths", "export")
# Keys of closed nodes that are optional (read with `.get`): `+model.lora={...}` is how LoRA is turned on.
OPTIONAL_KEYS = {"model": ("lora", "tokenizer", "reference_dtype", "gradient_checkpointing")}
# Nodes built by `hydra.utils.instantiate`: each key must be a keyword of their `_target_`.
TARGET_NODES = ("selector", "task", "trainer", "algorithm.optimizer")
# Trainer keys tokenrl sets itself: the training length is `total_steps` rollout steps.
TRAINER_OWNED = {"max_epochs": "total_steps", "max_steps": "total_steps", "min_epochs": "total_steps",
                 "min_steps": "total_steps", "max_time": "total_steps", "limit_train_batches": "total_steps",
                 "callbacks": "checkpoint.* (tokenrl adds its callbacks)"}


class ConfigError(ValueError):
    """Bad settings: one line per key, each naming the key, its value and what is allowed."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"{len(problems)} bad setting{'s' if len(problems) > 1 else ''}:\n{lines}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _int(low: int, high: int | None = None) -> tuple[Callable[[Any], bool], str]:
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    return (lambda v: _is_int(v) and v >= low and (high is None or v <= high)), allowed


def _number(low: float, high: float, low_open: bool, high_open: bool = False) -> tuple[Callable[[Any], bool], str]:
    def ok(v: Any) -> bool:
        return (_is_number(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high))
    text = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}".replace("inf]", "inf)")
    return ok, text


_BOOL = (lambda v: isinstance(v, bool), "true or false")
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": _int(0),
    "total_steps": _int(1),
    "selector_warmup_steps": _int(0),
    "reward_timeout_s": _number(0, math.inf, low_open=True),
    "validation.every_n_steps": _int(0),
    "validation.limit": _int(1),
    "validation.n_samples": _int(1),
    "validation.batch_prompts": _int(1),
    "validation.temperature": _number(0, math.inf, low_open=True),
    "validation.top_p": _number(0, 1, low_open=True),
    "samples.every_n_steps": _int(0),
    "samples.rows": _int(1),
    "checkpoint.enabled": _BOOL,
    "checkpoint.every_n_steps": _int(1),
    "checkpoint.mode": (lambda v: v in ("min", "max"), "min or max"),
    "export.enabled": _BOOL,
    "export.dtype": (lambda v: v in (None, "bf16", "fp32", "fp16"), "bf16, fp32, fp16 or null (bf16 on GPU runs)"),
    "fast_path.shared_prefix": (lambda v: isinstance(v, bool) or v == "auto",
                                "true, false or auto (auto: on unless the run is on a GPU)"),
    "fast_path.fused_statistics": _BOOL,
    "fast_path.pack": _BOOL,
    "diagnostics.js": _BOOL,
    "rollout.temperature": _number(0, math.inf, low_open=True),
    "rollout.top_p": _number(0, 1, low_open=True),
    "rollout.top_k": (lambda v: _is_int(v) and (v == -1 or v >= 0), "an integer >= 0 (0 or -1: off)"),
    "rollout.max_new_tokens": _int(1),
    "rollout.max_prompt_length": _int(1),
    "rollout.max_num_batched_tokens": (lambda v: v is None or (_is_int(v) and v >= 1), "an integer >= 1 or null"),
    "rollout.max_num_seqs": (lambda v: v is None or (_is_int(v) and v >= 1), "an integer >= 1 or null"),
}


def nearest(key: str, candidates: Iterable[str]) -> str:
    """' (did you mean `x`?)' for the closest candidate, or '' when none is close."""
    match = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean `{match[0]}`?)" if match else ""


def _select(cfg: DictConfig, path: str) -> Any:
    return OmegaConf.select(cfg, path, throw_on_missing=False) if path else cfg


def _value_problems(cfg: DictConfig) -> list[str]:
    problems = []
    for path, (ok, allowed) in RULES.items():
        if OmegaConf.select(cfg, path, default="<absent>") == "<absent>":
            continue   # a node a config does not have (an eval config, a run without validation)
        parent, _, leaf = path.rpartition(".")
        if OmegaConf.is_interpolation(_select(cfg, parent), leaf):
            continue   # a copy of another key (validation.top_p: ${rollout.top_p}): reported there
        value = OmegaConf.select(cfg, path)
        if not ok(value):
            problems.append(f"{path}={value!r}: must be {allowed}")
    return problems


def _relation_problems(cfg: DictConfig) -> list[str]:
    problems = []
    n, ks = cfg.validation.n_samples, cfg.validation.ks
    bad_ks = [k for k in ks if not (_is_int(k) and k >= 1 and (not _is_int(n) or k <= n))]
    if bad_ks:
        problems.append(f"validation.ks={list(ks)}: each k must be an integer in [1, validation.n_samples={n}] "
                        f"(unbiased pass@k needs k <= n); bad: {bad_ks}")
    try:
        AlgorithmConfig.from_node(OmegaConf.to_container(cfg.algorithm, resolve=True),
                                  int(cfg.rollout.max_new_tokens) if _is_int(cfg.rollout.max_new_tokens) else 1)
    except ValueError as err:
        problems.append(str(err))
        return problems
    algorithm = cfg.algorithm
    rows = algorithm.prompts_per_step * algorithm.group_size
    if rows % algorithm.mini_batches:
        problems.append(f"algorithm.mini_batches={algorithm.mini_batches}: the {rows} responses of a step "
                        f"(algorithm.prompts_per_step={algorithm.prompts_per_step} × algorithm.group_size="
                        f"{algorithm.group_size}) must split into equal mini-batches")
    rollout = cfg.rollout
    batched = rollout.get("max_num_batched_tokens")
    if batched and not rollout.get("enable_chunked_prefill") and batched < rollout.get("max_model_len", 0):
        problems.append(f"rollout.max_num_batched_tokens={batched}: below rollout.max_model_len="
                        f"{rollout.max_model_len} without chunked prefill, vLLM refuses to start; raise it or set "
                        "rollout.enable_chunked_prefill=true")
    warmup = cfg.selector.get("warmup_steps") if "selector" in cfg else None
    if _is_int(warmup) and _is_int(cfg.total_steps) and warmup >= cfg.total_steps:
        problems.append(f"selector_warmup_steps={warmup}: selector {cfg.selector._target_.rsplit('.', 1)[-1]} "
                        f"updates every token for its first {warmup} steps, so a run of total_steps="
                        f"{cfg.total_steps} never selects; set selector_warmup_steps below total_steps "
                        f"(the paper's Θ = 20 is for runs of hundreds of steps)")
    return problems


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
            siblings = [k for k in node if k != leaf] if isinstance(node, DictConfig) else []
            where = f"`{parent}`" if parent else "the top level"
            problems.append(f"+{key}: no such setting at {where}; nothing would read it{nearest(leaf, siblings)}")
    for path in TARGET_NODES:
        node = _select(cfg, path)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        target = node._target_
        try:
            factory = get_method(target)   # any callable: a class or a function (`_partial_`)
        except Exception:   # noqa: BLE001 — hydra raises several kinds; the message is what matters
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


def check_config(cfg: DictConfig, overrides: Iterable[str] = ()) -> list[str]:
    """Raises `ConfigError` listing every bad setting of the composed train config; returns the warnings.
    `overrides`: the command line's overrides (Hydra's `overrides.task`), to find keys that `+` added."""
    problems = _value_problems(cfg)
    problems += _unknown_key_problems(cfg, overrides)
    if not problems:   # relations read values whose types are now known to be right
        problems += _relation_problems(cfg)
    if problems:
        raise ConfigError(problems)
    warnings = []
    warmup = cfg.selector.get("warmup_steps") if "selector" in cfg else None
    if _is_int(warmup) and warmup > cfg.total_steps // 2:
        warnings.append(f"selector_warmup_steps={warmup} covers most of total_steps={cfg.total_steps}: the selector "
                        f"acts on only the last {cfg.total_steps - warmup} steps")
    return warnings
