"""The configuration reference, docs/configuration.md, from configs/**/*.yaml: every config group, every file of it
and every key of every file, with the value the file sets and the comment the file writes beside it.

    python scripts/config_reference.py            # write docs/configuration.md (git ignores it) to read locally

The page is not committed: the docs site builds it from the configs (scripts/mkdocs_hooks.py), so it cannot drift and
a new config file needs no step of its own; tests/scripts/test_config_reference.py checks that every key YAML parses
out of every file appears on it. The YAML is read line by line (PyYAML drops comments): `key: value  # comment`, with a
comment continued on the following comment-only lines that start in the same column; a comment block on lines of its
own belongs to the key below it; the comment lines above the first key describe the file.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
OUT = ROOT / "docs" / "configuration.md"

# Groups in the order of train.yaml's defaults list, then the parts that are no group of their own.
GROUP_ORDER = [
    "selector",
    "model",
    "rollout",
    "algorithm",
    "task",
    "trainer",
    "logger",
    "paths",
    "hydra",
    "hydra/launcher",
    "experiment",
    "method",
    "forks_arm",
    "forks_tuned",
    "launcher",
    "local",
    "debug",
    "base",
    "batch",
]
GROUP_NOTES = {
    "selector": "which response tokens the policy-gradient update reaches, with what weight, and the loss normaliser "
    "([Methods](methods/index.md))",
    "model": "the policy: source, initialisation, dtype, LoRA; its batch preset (`batch/`) sets its `algorithm.*`",
    "rollout": "the generation engine and its sampling ([Concepts](concepts.md#rollout-engines-hf-or-vllm))",
    "algorithm": "GRPO and its switches: group size, aggregation, clip, KL, mini-batches, loss variants, optimizer",
    "task": "training problems, instruction, verifier and response budget; its test split feeds validation "
    "([Data and evaluation](data-and-evaluation.md))",
    "trainer": "Lightning accelerator, devices, strategy and precision ([GPUs and clusters](running.md))",
    "logger": "Lightning loggers",
    "paths": "where runs, data and prepared models live",
    "hydra": "run and sweep folders",
    "hydra/launcher": "how a sweep runs its jobs ([Sweeps and reports](sweeps.md))",
    "experiment": "paper settings and studies: each file states only its deltas ([Sweeps and reports](sweeps.md))",
    "method": "one token-level method each (selector + loss switches), for side-by-side sweeps "
    "([Methods](methods/index.md))",
    "forks_arm": "the arms of `experiment=forks_oracle` and its tuning stage, one file each "
    "([Which tokens matter](forks.md))",
    "forks_tuned": "each forks_oracle arm's learning rate, written by `scripts/forks_choose.py` from the tuning stage",
    "launcher": "sweeps in parallel on this machine (`local`) or as SLURM jobs (`slurm`)",
    "local": "machine-local overrides",
    "debug": "smoke runs",
    "base": "shared parts that presets pull in with `@_here_`; not a choice of any group",
    "batch": "each model's batch preset (`algorithm.prompts_per_step`, `micro_batch_size`, `optimizer.lr`), pulled "
    "in by its model preset; not a choice of any group",
}

KEY = re.compile(
    r"""^(?P<indent> *)(?P<key>"[^"]*"|'[^']*'|[^\s#:'"\-][^:#]*?|-[^\s][^:#]*?)\s*:(?:\s+(?P<value>.*))?$"""
)


@dataclass
class Key:
    path: str  # dotted, from the config root
    value: str  # as written in the file ('' for a mapping)
    comment: list[str] = field(default_factory=list)


@dataclass
class ConfigFile:
    rel: str  # path under configs/
    package: str  # '' (global) or a dotted prefix
    header: list[str] = field(default_factory=list)
    defaults: list[str] = field(default_factory=list)
    keys: list[Key] = field(default_factory=list)
    trailer: list[str] = field(default_factory=list)


def split_comment(line: str) -> tuple[str, str | None, int]:
    """(code, comment text or None, column of the '#') of a YAML line; a '#' inside quotes is not a comment."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'" and (i == 0 or line[i - 1] in " :[{,"):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i + 1 :].strip(), i
    return line.rstrip(), None, -1


def default_package(rel: str, including: dict[str, str]) -> str:
    """Hydra's package of a file: `# @package` if stated, else the group path (a `/base/<name>@_here_` part: the
    group of the files that pull it in)."""
    group = rel.rsplit("/", 1)[0] if "/" in rel else ""
    if group == "base":
        return including.get(rel, "")
    if group == "batch":  # pulled in by a model preset as `/batch/<name>@_global_.algorithm`
        return "algorithm"
    return group.replace("/", ".")


def parse(path: Path, including: dict[str, str]) -> ConfigFile:
    rel = path.relative_to(CONFIGS).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    package = default_package(rel, including)
    for line in lines[:3]:
        match = re.match(r"#\s*@package\s+(\S+)", line)
        if match:
            package = "" if match[1] == "_global_" else match[1]
    cfg = ConfigFile(rel, package)
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    pending: list[str] = []  # comment lines waiting for the key below them
    last: Key | None = None
    last_column = -1  # where the last key's inline comment starts
    in_defaults = False
    for line in lines:
        code, comment, column = split_comment(line)
        if not code.strip():
            if comment is None:
                last_column = -1 if not line.strip() else last_column
                continue
            if comment.startswith("@package"):
                continue
            if last is not None and column == last_column:
                last.comment.append(comment)  # the key's comment, continued
            elif not cfg.keys and not cfg.defaults and not in_defaults:
                cfg.header.append(comment)
            else:
                pending.append(comment)
                last_column = -1
            continue
        indent = len(code) - len(code.lstrip())
        if code.lstrip().startswith("- "):
            if not in_defaults:
                raise ValueError(f"{rel}: a list item outside `defaults:` is not supported: {line!r}")
            cfg.defaults.append(line.strip())
            continue
        match = KEY.match(code)
        if not match:
            raise ValueError(f"{rel}: cannot read {line!r}")
        key, value = match["key"].strip("'\""), (match["value"] or "").strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if indent == 0 and key == "defaults" and not value:
            in_defaults = True
            continue
        in_defaults = False
        prefix = ".".join([cfg.package] * bool(cfg.package) + [name for _, name in stack])
        last = Key(f"{prefix}.{key}" if prefix else key, value, pending + ([comment] if comment is not None else []))
        cfg.keys.append(last)
        pending, last_column = [], column if comment is not None else -1
        if not value:
            stack.append((indent, key))
    cfg.trailer = pending
    return cfg


def base_packages() -> dict[str, str]:
    """base/<name>.yaml -> the package of the group whose files pull it in with `- /base/<name>@_here_`."""
    found: dict[str, str] = {}
    for path in sorted(CONFIGS.rglob("*.yaml")):
        for name in re.findall(r"^\s*-\s*/base/([\w.]+)@_here_", path.read_text(encoding="utf-8"), re.M):
            group = path.relative_to(CONFIGS).parent.as_posix()
            found[f"base/{name}.yaml"] = group.replace("/", ".")
    return found


def group_of(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def files() -> list[ConfigFile]:
    including = base_packages()
    parsed = [parse(path, including) for path in sorted(CONFIGS.rglob("*.yaml"))]
    unknown = sorted({group_of(c.rel) for c in parsed} - set(GROUP_ORDER) - {""})
    if unknown:
        raise ValueError(f"config groups without a place on the page (add them to GROUP_ORDER): {unknown}")
    order = {group: i for i, group in enumerate(["", *GROUP_ORDER])}
    top = {"train.yaml": 0, "eval.yaml": 1}
    return sorted(parsed, key=lambda c: (order[group_of(c.rel)], top.get(c.rel, 2), c.rel))


def text(comment: str) -> str:
    """Comment text as Markdown: code spans kept as written; outside them the characters Markdown would read as
    markup (a table's `|`, HTML's `<`, emphasis, math's `$`) are escaped."""
    parts = re.split(r"(`[^`]*`)", comment)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            out.append(
                part.replace("\\", "\\\\")
                .replace("|", "\\|")
                .replace("<", "&lt;")
                .replace(">", "&gt;")
                .replace("*", "\\*")
                .replace("$", "\\$")
                .replace("[", "\\[")
            )
    return "".join(out)


def prose(comments: list[str]) -> str:
    return text(" ".join(c for c in comments if c))


def code(value: str) -> str:
    if not value:
        return ""
    ticks = "``" if "`" in value else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{value.replace('|', chr(92) + '|')}{pad}{ticks}"


def render(configs: list[ConfigFile]) -> str:
    keys = sum(len(c.keys) for c in configs)
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/config_reference.py from configs/**/*.yaml when the docs are built: edit the YAML,",
        "     not this page. -->",
        "",
        f"Every file of `configs/` ({len(configs)} files, {keys} keys), with each key as the command line writes it,",
        "the value the file sets and the comment the file writes beside it. How the groups compose, the top-level",
        "knobs and examples: [Configuring runs](configuring.md). `python train.py --cfg job` prints the composed "
        "config",
        "of a command; an unknown key or choice is refused at start-up, naming the nearest valid one.",
        "",
        "A file marked *global* (`# @package _global_`) writes keys from the root of the config, so it can set any "
        "group",
        "(an `experiment`, a `method`); the others write under their group. `${...}` values are interpolations,",
        "resolved when the run starts; `???` marks a value every preset must set.",
        "",
    ]
    current = None
    for cfg in configs:
        group = group_of(cfg.rel)
        if group != current:
            current = group
            if group:
                out += [f"## `{group}`", "", f"`configs/{group}/`: {GROUP_NOTES[group]}.", ""]
            else:
                out += [
                    "## Top level",
                    "",
                    "`configs/train.yaml` (`python train.py`) and `configs/eval.yaml`"
                    " (`python eval.py`): the defaults lists and the keys outside any group.",
                    "",
                ]
        name = cfg.rel.rsplit("/", 1)[-1].removesuffix(".yaml")
        title = f"`{group}={name}`" if group and group not in ("base", "batch") else f"`configs/{cfg.rel}`"
        out += [f"### {title}", ""]
        where = "" if not group or group == "base" else f"`configs/{cfg.rel}`" + ", *global*" * (cfg.package == "")
        if group in ("base", "batch"):
            where = f"Pulled into `{cfg.package}`"
        out += [(f"{where}. " * bool(where) + prose(cfg.header)).rstrip(), ""]
        if cfg.defaults:
            out += ["```yaml", "defaults:", *[f"  {item}" for item in cfg.defaults], "```", ""]
        if cfg.keys:
            out += ["| key | value | what |", "|---|---|---|"]
            out += [f"| `{k.path}` | {code(k.value)} | {prose(k.comment)} |" for k in cfg.keys]
            out.append("")
        elif not cfg.defaults:
            out += ["No keys.", ""]
        if cfg.trailer:
            out += [prose(cfg.trailer), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    OUT.write_text(render(files()), encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
