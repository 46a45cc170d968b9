"""scripts/config_reference.py, the page the docs build generates (docs/configuration.md, not committed): its line
reader finds every key that YAML itself finds in every file of configs/, under the right package, and the page names
each of them."""

from __future__ import annotations

import re

import pytest
import yaml

from scripts.config_reference import CONFIGS, files, main, parse, render

PAGE = render(files())


def yaml_keys(node, prefix: str = "") -> set[str]:
    """Every key of a loaded YAML mapping, dotted, mappings included (the defaults list is no key)."""
    keys = set()
    for key, value in (node or {}).items():
        if key == "defaults" and not prefix:
            continue
        path = f"{prefix}.{key}" if prefix else str(key)
        keys.add(path)
        if isinstance(value, dict):
            keys |= yaml_keys(value, path)
    return keys


def test_the_script_writes_the_page_the_site_builds(tmp_path, monkeypatch):
    target = tmp_path / "configuration.md"
    monkeypatch.setattr("scripts.config_reference.OUT", target)
    monkeypatch.setattr("scripts.config_reference.ROOT", tmp_path)
    assert main([]) == 0
    assert target.read_text(encoding="utf-8") == render(files())


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.yaml")), ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_every_key_of_every_file_is_on_the_page(path):
    parsed = next(c for c in files() if c.rel == path.relative_to(CONFIGS).as_posix())
    prefix = parsed.package
    expected = {f"{prefix}.{key}" if prefix else key for key in yaml_keys(yaml.safe_load(path.read_text()))}
    assert {k.path for k in parsed.keys} == expected
    page = PAGE
    section = page.split(f"`configs/{parsed.rel}`", 1)[1]
    assert all(f"| `{key}` |" in section for key in expected)
    raw = yaml.safe_load(path.read_text()) or {}
    assert [item.split("#")[0].strip().removeprefix("- ") for item in parsed.defaults] == [
        f"{key}: {'null' if value is None else value}" if isinstance(d, dict) else d
        for d in raw.get("defaults", [])
        for key, value in (d.items() if isinstance(d, dict) else [(d, None)])
    ]


def test_packages_follow_hydra():
    by_file = {c.rel: c.package for c in files()}
    assert by_file["train.yaml"] == "" and by_file["algorithm/grpo.yaml"] == "algorithm"
    assert by_file["experiment/ict_paper.yaml"] == "" and by_file["task/forks.yaml"] == ""  # @package _global_
    assert by_file["hydra/launcher/fresh_process.yaml"] == "hydra.launcher"
    assert by_file["base/qwen2.5.yaml"] == "model" and by_file["base/rollout.yaml"] == "rollout"  # @_here_


def test_comments_follow_their_key(tmp_path):
    (tmp_path / "group").mkdir()
    path = tmp_path / "group" / "x.yaml"
    path.write_text(
        "# what the file is\n"
        "a: 1        # first line\n"
        "            # second line\n"
        "# a note on b\n"
        "b:\n"
        "  c: 'x # not a comment'   # c's\n"
    )
    import scripts.config_reference as ref

    saved = ref.CONFIGS
    ref.CONFIGS = tmp_path
    try:
        cfg = parse(path, {})
    finally:
        ref.CONFIGS = saved
    assert cfg.header == ["what the file is"] and cfg.package == "group"
    assert [(k.path, k.value, k.comment) for k in cfg.keys] == [
        ("group.a", "1", ["first line", "second line"]),
        ("group.b", "", ["a note on b"]),
        ("group.b.c", "'x # not a comment'", ["c's"]),
    ]


def test_every_config_group_is_on_the_page():
    page = PAGE
    groups = {p.parent.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml")} - {"."}
    assert groups <= set(re.findall(r"^## `([\w/]+)`$", page, re.M))
