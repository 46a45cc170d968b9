"""Every key of every shipped config has a rule (config/known_settings.py, `AlgorithmConfig`'s fields, a component's
`config_rules`) or the explicit FREE_TEXT mark, and the start-up check enforces it (issue #35 §1).

The walk composes train.yaml with every preset of each config group (experiments, methods, models, tasks, rollouts,
trainers, loggers, launchers, selectors, algorithms) and eval.yaml with every model and rollout preset, and collects
each leaf key. Static: a key without a rule fails the test, so a new key cannot land unvalidated. Dynamic: each
key that is not free text, set to a value no rule accepts, must stop `check_config` (or `check_eval_config`) with a
line naming that key as the user typed it.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from tests.conftest import CONFIG_DIR, compose_config
from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.config.check import ConfigError, check_config, check_eval_config, target_nodes, target_rules
from tokenrl.config.known_settings import RULES
from tokenrl.records.rules import Rule

ROOT = Path(__file__).resolve().parents[2]
TRAIN_GROUPS = (
    "experiment",
    "method",
    "model",
    "task",
    "rollout",
    "trainer",
    "logger",
    "launcher",
    "selector",
    "algorithm",
)
EVAL_GROUPS = ("model", "rollout")
NONSENSE = "not-a-valid-value"  # a string no numeric, boolean, choice, list or mapping rule accepts
ALGORITHM_FIELDS = set(AlgorithmConfig.keys())


COMPLETE = {"task=dataset": ["task.source=problems.jsonl"]}  # what a preset's `???` needs before it can be checked


def presets(groups: tuple[str, ...]) -> list[list[str]]:
    return [
        [choice, *COMPLETE.get(choice, [])]
        for group in groups
        for choice in (f"{group}={path.stem}" for path in sorted((ROOT / "configs" / group).glob("*.yaml")))
    ]


@functools.cache
def composed(name: str, overrides: tuple[str, ...]) -> DictConfig:
    """train.yaml (through tests/conftest.py's cache) or eval.yaml composed with `overrides`, once per session."""
    if name == "train":
        return compose_config(list(overrides))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="eval", overrides=list(overrides))
    with open_dict(cfg):
        cfg.paths.output_dir = str(ROOT / "logs" / "tests")
    return cfg


def leaves(node: DictConfig, prefix: str = ""):
    for key in node.keys():
        path = f"{prefix}.{key}" if prefix else str(key)
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none():
            yield from leaves(child, path)
        else:
            yield path


def rule_of(cfg: DictConfig, path: str) -> Rule | str | None:
    """The rule of `path`, "algorithm" for a field AlgorithmConfig checks, "target" for a `_target_`/`_partial_`
    (the check imports it), "training's" for an eval config's batch settings (unread there), or None: no rule."""
    if path in RULES:
        return RULES[path]
    if path.startswith("algorithm.") and OmegaConf.select(cfg, "algorithm.name") is None:
        return "training's"  # eval: the model preset's batch settings (configs/batch/), read by training only
    if path.startswith("algorithm.") and path.count(".") == 1 and path.split(".")[1] in ALGORITHM_FIELDS:
        return "algorithm"
    for node in sorted(target_nodes(cfg), key=len, reverse=True):
        if not path.startswith(node + "."):
            continue
        keys = path[len(node) + 1 :].split(".")
        if keys[0] in ("_target_", "_partial_"):
            return "target"
        rule = (target_rules(OmegaConf.select(cfg, node)._target_) or {}).get(keys[0])
        for key in keys[1:]:  # a mapping's fields (task.warmup.steps)
            rule = (rule.fields or {}).get(key) if isinstance(rule, Rule) else None
        return rule
    return None


PRESETS = [("train", tuple(p)) for p in presets(TRAIN_GROUPS)] + [("eval", tuple(p)) for p in presets(EVAL_GROUPS)]


# Seven presets whose keys together are 216 of the 229 the walk finds in all of them, every kind of node among them:
# the test below checks the walk itself (each preset's own test walks that preset), without composing all 89 presets
# in one worker (the other worker composes its own share again: ~20 CPU-s).
WALKED = [
    ("train", ("experiment=ict_gsm8k_qwen7b",)),
    ("train", ("experiment=forks_study",)),
    ("eval", ("model=smollm2_135m",)),
    ("train", ("task=dataset", "task.source=problems.jsonl")),
    ("train", ("logger=wandb",)),
    ("train", ("method=archer",)),
    ("train", ("logger=mlflow",)),
]


def test_the_walk_reaches_the_keys_of_every_kind_of_node():
    assert set(WALKED) <= set(PRESETS)
    keys = {path for name, overrides in WALKED for path in leaves(composed(name, overrides))}
    assert (
        len(keys) > 200
        and {
            "selector.ratio",
            "task.warmup.steps",
            "logger.csv.save_dir",
            "eval.top_k",
            "trainer.strategy.mixed_precision.param_dtype",
            "algorithm.optimizer.lr",
        }
        <= keys
    )


CHECKED: set[tuple[str, str, str]] = set()  # (config, key, its rule's words): checked once per session and worker


@pytest.mark.parametrize("name,overrides", PRESETS, ids=[f"{n}:{' '.join(o)}" for n, o in PRESETS])
def test_every_key_has_a_rule_and_a_value_no_rule_accepts_stops_the_check_naming_it(name, overrides):
    """Static: each leaf has a rule or the FREE_TEXT mark. Dynamic: each ruled leaf, set to a value no rule accepts,
    stops the start-up check with a line that starts with the key (once per key and rule: presets share most keys)."""
    cfg = composed(name, overrides)
    rules = {path: rule_of(cfg, path) for path in leaves(cfg)}
    assert [path for path, rule in rules.items() if rule is None] == [], (
        "keys without a rule (config/known_settings.py, a component's config_rules) or a FREE_TEXT mark"
    )
    for path, rule in rules.items():
        seen = (name, path, rule.allowed if isinstance(rule, Rule) else str(rule))
        if rule in ("target", "training's") or (isinstance(rule, Rule) and rule.free) or seen in CHECKED:
            continue
        CHECKED.add(seen)
        bad = copy.deepcopy(cfg)
        with open_dict(bad):  # what `path=<value>` on the command line leaves in the composed config
            OmegaConf.update(bad, path, NONSENSE, merge=False)
        with pytest.raises(ConfigError) as raised:
            check_config(bad) if name == "train" else check_eval_config(bad)
            pytest.fail(f"{path}={NONSENSE} passed the start-up check")
        assert any(problem.startswith((f"{path}=", f"{path}:")) for problem in raised.value.problems), (
            path,
            raised.value.problems,
        )
