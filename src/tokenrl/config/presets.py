"""What the preset files of a config group say, read before Hydra composes them: a preset's own value of a key (the
command line's machine defaults read `model.paper_task`), and a key a preset takes from another setting (ICT's
`ratio: ${selector_ratio}`), which has that setting's name only (one name per setting)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tokenrl.paths import CONFIG_DIR


def preset_value(group: str, name: str, key: str) -> Any:
    """`key` of the preset configs/<group>/<name>.yaml, or of a `/base/...@_here_` file it pulls in (None: neither
    sets it, or there is no such preset: Hydra will say so)."""
    path = Path(CONFIG_DIR) / group / f"{name}.yaml"
    if not path.is_file():
        return None
    node = yaml.safe_load(path.read_text()) or {}
    if key in node:
        return node[key]
    for entry in node.get("defaults", []):
        if isinstance(entry, str) and entry.startswith("/base/") and entry.endswith("@_here_"):
            base = entry.removeprefix("/base/").removesuffix("@_here_")
            value = preset_value("base", base, key)
            if value is not None:
                return value
    return None


WIRED = re.compile(r"\$\{([\w.]+)\}")  # a preset's value that is another setting: `ratio: ${selector_ratio}`


def wired_key_problem(arg: str, choices: dict[str, Any]) -> str | None:
    """The one line for an override of a key that its group's chosen preset takes from another setting (ICT's
    `ratio: ${selector_ratio}`, shared with its controls): that setting is its one name. None otherwise, also for a
    default that follows a setting of the same node (`gen_prompts_per_step: ${algorithm.prompts_per_step}`)."""
    key, sep, value = arg.lstrip("+").partition("=")
    group, _, leaf = key.partition(".")
    name = choices.get(group)
    if not sep or not leaf or "." in leaf or not isinstance(name, str):
        return None
    wired = WIRED.fullmatch(str(preset_value(group, name, leaf)))
    if wired is None or wired[1].startswith(f"{group}."):
        return None  # a default that follows a setting of its own node (gen_prompts_per_step) is a setting of its own
    return f"{key}={value}: {group}={name} takes it from {wired[1]} (one name per setting): write {wired[1]}={value}"
