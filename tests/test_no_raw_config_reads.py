"""Below `run/` no module reads a raw config key (#49): the config is read once, into the typed records
(`records/settings.py`, `AlgorithmConfig`, `FastPath`), and code reads their attributes. This scans every module
outside `run/`, `cli/` and `config/` (which read the composed config) and `report/` (which reads finished runs'
folders: their summaries, metrics and the seed and step count of their saved config, not this run's settings) for a
subscript or `.get` of a config key on a config-like name; the records' own constructors (`of`, `from_node`) are where
a node is read. And no shipped YAML sets a setting's old name (`RENAMED`): one name per setting."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from tests.conftest import ROOT
from tokenrl.config.known_settings import RENAMED

PACKAGE, CONFIGS = ROOT / "src" / "tokenrl", ROOT / "configs"
READERS = ("run", "cli", "config", "report")  # the folders that may read the config itself
NODES = {"cfg", "config", "node", "settings", "model", "rollout"}  # config-like names, and their `_cfg` /
# `_settings` forms (`self.model_settings`)
NODES |= {f"{node}{suffix}" for node in ("model", "rollout") for suffix in ("_cfg", "_settings")}
CONSTRUCTORS = {"of", "from_node"}


def yaml_files() -> list[Path]:
    return sorted(path for path in CONFIGS.rglob("*.yaml") if "hydra" not in path.relative_to(CONFIGS).parts)


def key_paths(node: object, prefix: str = "") -> set[str]:
    """Every dotted key path a YAML mapping sets (its `defaults` list left out)."""
    if not isinstance(node, dict):
        return set()
    paths = set()
    for key, value in node.items():
        if key != "defaults":
            path = f"{prefix}{key}"
            paths |= {path} | key_paths(value, f"{path}.")
    return paths


def config_keys() -> set[str]:
    """The setting names of every shipped config (not Hydra's `_target_`-style keys)."""
    leaves = {path.rsplit(".", 1)[-1] for file in yaml_files() for path in key_paths(yaml.safe_load(file.read_text()))}
    return {key for key in leaves if not key.startswith("_")}


def raw_reads(source: str, keys: set[str]) -> list[int]:
    """The lines of `source` that read `<node>["key"]` or `<node>.get("key")` for a config `key` on a config-like name
    (a variable or an attribute: `cfg`, `self.model_cfg`), outside the records' constructors."""
    found = []

    def visit(tree: ast.AST, inside: str | None) -> None:
        for child in ast.iter_child_nodes(tree):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            target, key = None, None
            if isinstance(child, ast.Subscript):
                target, key = child.value, child.slice
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "get":
                target, key = child.func.value, child.args[0] if child.args else None
            name = getattr(target, "id", None) or getattr(target, "attr", None)
            if name in NODES and isinstance(key, ast.Constant) and key.value in keys and inside not in CONSTRUCTORS:
                found.append(child.lineno)
            visit(child, inside)

    visit(ast.parse(source), None)
    return found


def test_no_module_below_run_reads_a_raw_config_key():
    keys = config_keys()
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in READERS
        for line in raw_reads(path.read_text(), keys)
    ]
    assert found == [], "raw config reads below run/: read a record's attribute (records/settings.py) instead"


def test_the_scan_finds_a_raw_read():
    """The check itself: a new raw read in rollout/ is found, as a subscript or a `.get`, on a variable or an
    attribute; a data row's field, a record's attribute and a record's own constructor are not."""
    source = (
        "def generate(cfg, row, settings):\n"
        "    budget = cfg['max_new_tokens']\n"
        "    top = self.rollout_cfg.get('top_p')\n"
        "    answer = row['answer']\n"
        "    return settings.temperature\n"
        "class Record:\n"
        "    @classmethod\n"
        "    def of(cls, node):\n"
        "        return cls(node['engine'])\n"
    )
    assert raw_reads(source, config_keys()) == [2, 3]


def test_no_config_sets_an_old_name():
    """Each YAML's keys under the package it is composed into (`# @package`, its group, or where a defaults entry puts
    it: `/base/rollout@_here_`, `/batch/tiny@_global_.algorithm`)."""
    packages: dict[Path, set[str]] = {}
    for file in yaml_files():
        header = file.read_text().partition("\n")[0]
        group = file.parent.relative_to(CONFIGS).as_posix()
        package = header.removeprefix("# @package ").strip() if header.startswith("# @package") else group
        packages[file] = {"" if package in ("_global_", ".") else package}
    for _ in range(3):  # defaults entries that place another file (a base preset inside a model preset's package)
        for file in yaml_files():
            for entry in (yaml.safe_load(file.read_text()) or {}).get("defaults", []):
                name, _, where = entry.partition("@") if isinstance(entry, str) else ("", "", "")
                if where:
                    target = CONFIGS / f"{name.strip('/')}.yaml"
                    placed = packages[file] if where == "_here_" else {where.removeprefix("_global_").strip(".")}
                    packages[target] |= placed
    set_paths = {
        f"{package}.{path}" if package else path
        for file in yaml_files()
        for package in packages[file]
        for path in key_paths(yaml.safe_load(file.read_text()))
    }
    assert {"model.stats_chunk_size", "rollout.temperature", "algorithm.micro_batch_size"} <= set_paths  # placed
    assert sorted(set_paths & set(RENAMED)) == []
