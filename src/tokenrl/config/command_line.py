"""What `python train.py <overrides>` adds to its command line before Hydra composes the config: the run folder a
resume continues in, and what a plain command adds for the machine it runs on.

A resume from `ckpt_path=<run>/checkpoints/<file>` (a single run, no run folder given) writes into `<run>/`
(`hydra.run.dir=<run>`).

train.yaml's defaults are the laptop's (`trainer=cpu`, `rollout=hf`, `task=arithmetic`). A command that leaves a choice
to them is completed here, visibly: on a machine with a GPU `trainer=gpu` (bf16-mixed) and `rollout=vllm_gpu` where vLLM
is installed (`rollout=hf` where it is not); with a model preset that names its paper's task (`model.paper_task`, e.g.
Qwen2.5's GSM8K), `task=<that task>`. Whatever the command names itself (`trainer=`, `rollout=`, `task=`), an
experiment (which states all three) and sweeps (`-m`: their jobs may run on other machines) are left as they are.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from tokenrl.config.presets import preset_value, wired_key_problem
from tokenrl.paths import CONFIG_DIR

AUTO = "auto"  # ckpt_path=auto: the run folder's own last.ckpt, when there is one (run/resume.py)
CHOICE = re.compile(r"^(trainer|rollout|task|experiment|model)=([^\s]+)$")


def machine_overrides(argv: list[str], gpu: bool, vllm: bool) -> list[str]:
    """The overrides a command leaves to train.yaml's defaults and this machine decides (see the module docstring)."""
    if any(arg in ("-m", "--multirun") for arg in argv):
        return []
    chosen = {match[1]: match[2] for arg in argv if (match := CHOICE.match(arg.lstrip("+")))}
    if "experiment" in chosen:
        return []
    added = []
    if gpu and "trainer" not in chosen:
        added.append("trainer=gpu")
    if gpu and "rollout" not in chosen:
        added.append("rollout=vllm_gpu" if vllm else "rollout=hf")
    task = preset_value("model", chosen["model"], "paper_task") if "model" in chosen and "task" not in chosen else None
    if task:
        added.append(f"task={task}")
    return added


def with_machine_defaults(argv: list[str]) -> list[str]:
    """`argv` completed for this machine, with one line on stderr saying what was added and how to choose otherwise."""
    if any(arg in ("-h", "--help", "--hydra-help") for arg in argv):
        return argv  # help is the same on every machine: no need to load torch to ask for a GPU
    import torch

    gpu = torch.cuda.is_available()
    added = machine_overrides(argv, gpu, importlib.util.find_spec("vllm") is not None)
    if added:
        where = "this machine has a GPU" if gpu else "this machine has no GPU (trainer=cpu, rollout=hf)"
        print(
            f"tokenrl: {where}; added {' '.join(added)} (name trainer=, rollout= or task= to choose otherwise)",
            file=sys.stderr,
        )
    return beside_the_overrides(argv, added)


def beside_the_overrides(argv: list[str], added: list[str]) -> list[str]:
    """`argv` with `added` right after its last override (before its first flag where it has none). Hydra's parser
    takes the overrides as one run of positionals: one after `--cfg job` (or `--info`, `-m`, ...) that is not part of
    that run is an unrecognized argument."""
    overrides = [i for i, arg in enumerate(argv) if "=" in arg and not arg.startswith("-")]
    at = overrides[-1] + 1 if overrides else next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    return [*argv[:at], *added, *argv[at:]]


def run_dir_override(argv: list[str]) -> list[str]:
    """`argv` plus `hydra.run.dir=<run>` when it resumes (`ckpt_path=<run>/checkpoints/<file>`, a single run, no
    run dir given), so the resumed run writes into the run it continues."""
    if any(arg in ("-m", "--multirun") or arg.startswith("hydra.run.dir=") for arg in argv):
        return argv
    paths = [arg.split("=", 1)[1] for arg in argv if arg.startswith("ckpt_path=")]
    if not paths or paths[-1] in ("", "null", AUTO):
        return argv
    folder = Path(paths[-1]).expanduser().resolve().parent
    if folder.name != "checkpoints" or not (folder.parent / ".hydra").is_dir():
        return argv  # a checkpoint outside a run folder: a new run folder
    return beside_the_overrides(argv, [f"hydra.run.dir={folder.parent}"])


def single_run_overrides(argv: list[str]) -> list[str] | None:
    """The overrides of a single run's command line, without Hydra's own (`hydra.*`); None for a sweep or a command
    with flags (`--cfg job`, `--help`: Hydra answers those itself)."""
    if any(arg in ("-m", "--multirun") or arg.startswith("-") for arg in argv):
        return None
    return [arg for arg in argv if "=" in arg and not arg.startswith("hydra.")]


def compose_overrides(config_name: str, overrides: list[str], with_hydra: bool = False) -> Any:
    """The config `config_name` composed with `overrides`, outside a Hydra run (`with_hydra`: with its `hydra` node)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            return compose(config_name, overrides=overrides, return_hydra_config=with_hydra)
    finally:
        GlobalHydra.instance().clear()


def check_settings(argv: list[str]) -> None:
    """`check_config` on the train config a single run's command line composes, before Hydra makes the run folder and
    the training stack loads: bad settings stop in seconds and leave no folder behind (the run checks its config again,
    as each sweep job does). Raises `ConfigError`."""
    overrides = single_run_overrides(argv)
    if overrides is None:
        return
    from omegaconf import open_dict

    from tokenrl.config.check import check_config

    cfg = compose_overrides("train", overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = "<the run folder>"  # Hydra's, made once the settings pass
    check_config(cfg, overrides)


def composition_problem(argv: list[str], config_name: str = "train") -> str | None:
    """The one-line error of a command line Hydra cannot compose into `config_name`, or None: a setting's old name, or
    a key its preset takes from another setting (`wired_key_problem`); an override that does not parse; a preset that
    does not exist (with the group's presets and the nearest name); an override of a key the composed config lacks —
    Hydra's own hint for it, `+key=value`, adds a key that nothing reads (a selector without a ratio does not start
    taking one), so this names the nearest key, or the presets of the group that have the key. Single runs only (a
    sweep's values are not one config)."""
    overrides = single_run_overrides(argv)
    if overrides is None:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, OverrideParseException
    from omegaconf import OmegaConf

    from tokenrl.config.known_settings import renamed_problem

    for arg in overrides:
        problem = renamed_problem(*arg.lstrip("+~").split("=", 1)) if "=" in arg else None
        if problem:
            return problem
    parser = OverridesParser.create()
    for arg in overrides:
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as err:
            reason = str(err).splitlines()[0]
            return f"{arg}: not a valid override ({reason}); write key=value, +key=value or group=preset"
    try:
        choices = compose_overrides(config_name, overrides, with_hydra=True).hydra.runtime.choices
    except ConfigCompositionException as err:
        text = str(err)
    else:
        return next(filter(None, (wired_key_problem(arg, dict(choices)) for arg in overrides)), None)
    missing = re.search(r"Could not find '([\w/]+)/([^']+)'", text)
    if missing:
        group, name = missing.groups()
        presets = sorted(path.stem for path in (Path(CONFIG_DIR) / group).glob("*.yaml"))
        close = difflib.get_close_matches(name, presets, n=1)
        nearest = f"; did you mean {group}={close[0]}?" if close else ""
        return f"{group}={name}: no such preset (the {group} presets: {', '.join(presets)}){nearest}"
    match = re.search(r"Could not override '([\w.]+)'", text)
    if match is None:
        return None  # Hydra's own message names the problem
    key = match[1]
    given = next(arg for arg in overrides if arg.split("=", 1)[0] == key)
    parent, _, leaf = key.rpartition(".")
    try:
        cfg = compose_overrides(config_name, [arg for arg in overrides if arg != given], with_hydra=True)
    except ConfigCompositionException:
        return None
    node = OmegaConf.select(cfg, parent) if parent else cfg
    keys = sorted(k for k in (node.keys() if hasattr(node, "keys") else []) if k not in ("hydra", "_target_"))
    close = difflib.get_close_matches(leaf, keys, n=1)
    choice = cfg.hydra.runtime.choices.get(parent) if parent else None
    if close:
        hint = f"did you mean {parent + '.' if parent else ''}{close[0]}?"
    elif choice is not None:
        having = sorted(
            path.stem for path in (Path(CONFIG_DIR) / parent).glob("*.yaml") if preset_value(parent, path.stem, leaf)
        )
        hint = (
            f"the {parent} presets that have it: {', '.join(having)} (e.g. {parent}={having[0]} {given})"
            if having
            else f"no {parent} preset has it"
        )
    else:
        hint = f"{parent or 'the config'}'s keys: {', '.join(keys)}"
    where = f"{parent}={choice}" if choice is not None else (parent or "the config")
    return f"{given}: {where} has no setting '{leaf}' (its settings: {', '.join(keys)}); {hint}"
