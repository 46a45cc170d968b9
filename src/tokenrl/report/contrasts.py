"""Pre-registered contrasts: named pairs `arm_a-arm_b` tested on a primary metric with Holm's correction, secondary
metrics as a separate family, and the primary family's power (the "Pre-registered contrasts" section of a report).

The contrasts come from the sweep's own config (the experiment's `report:` block, read from a job's
`.hydra/config.yaml`: `contrasts: [a-b, ...]`, `primary: pass@1`, `secondary: [pass@4, reward_auc, ...]`) or from
`scripts/report.py --contrasts a-b ... --primary ... --secondary ...`, which replace the config's. Each contrast is a
paired difference a − b over the seeds both arms completed (seed = graph in experiment=forks_oracle), with its 95% CI
and a two-sided paired t-test (`stats.paired_t_test`); each family's p-values get Holm's step-down adjustment
(`stats.holm`), and a contrast is *decided* where its adjusted p < α (0.05). The primary family reports, per
contrast, the minimum detectable effect: the smallest true Δ the test at Holm's first-step level α/m detects with 80%
power given n and the observed SD of the paired differences (`stats.min_detectable_effect`, noncentral t).

Metric names: `pass@K` (held-out pass@K after training), `pass@K_auc` (the held-out pass@K curve's area over the
validations from before step 0 to after the last, trapezoids, divided by the steps: its mean height) and
`reward_auc` (the training reward's mean over every rollout step: the reward curve's area per step) and
`<window>:<key>` (a logged step metric's mean over `all` steps or the `first`, `middle` or `last` 50: runs.window_mean).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tokenrl.report.runs import WINDOW, Run, final_validation, window_mean
from tokenrl.report.stats import PairedTest, holm, min_detectable_effect, paired_t_test

ALPHA = 0.05
POWER = 0.8
PASSK = re.compile(r"pass@(\d+)")
PASSK_AUC = re.compile(r"pass@(\d+)_auc")
STEP_WINDOW = re.compile(r"(all|first|middle|last):(\S+)")


def validation_auc(run: Run, key: str) -> float:
    """Area under the held-out curve `key` over `val/at_step` (trapezoids), divided by the span: its mean height.
    NaN with fewer than two validations."""
    points = sorted((step, values[key]) for step, values in run.validation.items() if key in values)
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return math.nan
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])


def reward_auc(run: Run) -> float:
    """The training reward's mean over every logged rollout step (the reward curve's area per step)."""
    return window_mean(run, "train/reward", "all")


def contrast_metric(name: str) -> tuple[str, Callable[[Run], float]]:
    """(title, per-run value) of a contrast metric name: pass@K, pass@K_auc or reward_auc."""
    if match := PASSK.fullmatch(name):
        key = f"val/pass@{match[1]}"
        return f"held-out pass@{match[1]} after training", lambda run: final_validation(run).get(key, math.nan)
    if match := PASSK_AUC.fullmatch(name):
        key = f"val/pass@{match[1]}"
        return f"held-out pass@{match[1]}, curve AUC (mean over the validations)", lambda run: validation_auc(run, key)
    if name == "reward_auc":
        return "training reward, curve AUC (mean over rollout steps)", reward_auc
    if match := STEP_WINDOW.fullmatch(name):
        window, key = match[1], match[2]
        steps = "all steps" if window == "all" else f"the {window} {WINDOW} steps"
        return f"{key}, mean over {steps}", lambda run: window_mean(run, key, window)
    raise ValueError(
        f"contrast metric {name!r}: expected pass@K, pass@K_auc, reward_auc or <all|first|middle|last>:<logged key>"
    )


def parse_contrast(text: str, labels: list[str]) -> tuple[str, str]:
    """`arm_a-arm_b` (or `arm_a - arm_b`) → (arm_a, arm_b). Labels may contain '-' (`lr=1e-3`): the split is the one
    whose two sides are both arms of the sweep; with none, the first '-' (the arms then show as missing)."""
    text = text.strip()
    cuts = [i for i, c in enumerate(text) if c == "-"]
    if not cuts:
        raise ValueError(f"contrast {text!r}: expected arm_a-arm_b")
    for i in cuts:
        a, b = text[:i].strip(), text[i + 1 :].strip()
        if a in labels and b in labels:
            return a, b
    a, b = text[: cuts[0]].strip(), text[cuts[0] + 1 :].strip()
    if not a or not b:
        raise ValueError(f"contrast {text!r}: expected arm_a-arm_b")
    return a, b


@dataclass(frozen=True)
class Spec:
    contrasts: tuple[str, ...]
    primary: str = "pass@1"
    secondary: tuple[str, ...] = ()
    source: str = ""


def spec_from_config(runs: list[Run]) -> Spec | None:
    """The `report:` block of the sweep's config (the first job's .hydra/config.yaml), or None."""
    for run in runs:
        path = run.folder / ".hydra" / "config.yaml"
        if not path.is_file():
            continue
        block = (yaml.safe_load(path.read_text()) or {}).get("report") or {}
        if not block.get("contrasts"):
            return None
        return Spec(
            tuple(block["contrasts"]),
            block.get("primary", "pass@1"),
            tuple(block.get("secondary") or ()),
            f"the sweep's config (`report:` in {Path(run.job) / '.hydra' / 'config.yaml'})",
        )
    return None


def _values(groups: dict[str, list[Run]], label: str, metric: Callable[[Run], float]) -> dict[int, float]:
    return {run.seed: metric(run) for run in groups.get(label, [])}


def family(
    groups: dict[str, list[Run]], contrasts: tuple[str, ...], metrics: tuple[str, ...], alpha: float = ALPHA
) -> list[dict]:
    """Every (metric, contrast) of one family: the paired test over the seeds both arms completed, then Holm over
    the whole family (m = len(metrics) · len(contrasts)); `decided`: Holm-adjusted p < alpha."""
    labels = list(groups)
    rows: list[dict[str, Any]] = []
    for name in metrics:
        title, metric = contrast_metric(name)
        for text in contrasts:
            a, b = parse_contrast(text, labels)
            va, vb = _values(groups, a, metric), _values(groups, b, metric)
            test = paired_t_test(va, vb)
            only_a = sorted(s for s, v in va.items() if not math.isnan(v) and s not in test.seeds)
            only_b = sorted(s for s, v in vb.items() if not math.isnan(v) and s not in test.seeds)
            rows.append(
                {"metric": name, "title": title, "contrast": f"{a} − {b}", "a": a, "b": b, "test": test}
                | {"only_a": only_a, "only_b": only_b, "absent": [x for x in (a, b) if x not in groups]}
            )
    for row, adjusted in zip(rows, holm([row["test"].p for row in rows])):
        row["holm"] = adjusted
        row["decided"] = not math.isnan(adjusted) and adjusted < alpha
    return rows


def _num(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:+.3f}"


def _p(value: float) -> str:
    if math.isnan(value):
        return "–"
    return "< 0.0001" if value < 1e-4 else f"{value:.4f}"


def _ci(test: PairedTest) -> str:
    if test.n < 2:
        return "–"
    return f"[{test.mean - test.half_width:+.3f}, {test.mean + test.half_width:+.3f}]"


def _n_note(row: dict) -> str:
    notes = [f"{x}: no complete run" for x in row["absent"]]
    if notes:
        return f"{row['test'].n} ({'; '.join(notes)})"
    if row["only_a"]:
        notes.append(f"seeds {', '.join(map(str, row['only_a']))} only in {row['a']}")
    if row["only_b"]:
        notes.append(f"seeds {', '.join(map(str, row['only_b']))} only in {row['b']}")
    return f"{row['test'].n}" + (f" ({'; '.join(notes)})" if notes else "")


def contrasts_section(groups: dict[str, list[Run]], spec: Spec, alpha: float = ALPHA, power: float = POWER) -> tuple:
    """The markdown section and its record: the primary family (with the minimum detectable effect per contrast at
    Holm's first-step level alpha/m), then the secondary family."""
    primary = family(groups, spec.contrasts, (spec.primary,), alpha)
    secondary = family(groups, spec.contrasts, spec.secondary, alpha) if spec.secondary else []
    m = len(primary)
    first_level = alpha / m
    for row in primary:
        test = row["test"]
        row["mde"] = min_detectable_effect(test.sd, test.n, first_level, power)
    title = primary[0]["title"]
    lines = [
        "## Pre-registered contrasts",
        "",
        f"Named before the runs, in {spec.source}. Each contrast is the paired difference a − b over the seeds "
        "(graphs) both arms completed (n; a seed only one arm completed is named and left out); 95% CI Student t; "
        f"p: two-sided paired t-test; Holm: Holm's step-down adjustment over the family; decided: Holm p < {alpha}.",
        "",
        f"### Primary: {title} (a family of {m}, Holm)",
        "",
        f"| contrast | n | Δ | 95% CI | p | Holm p | decided | MDE (80% power, α/m = {first_level:.3g}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in primary:
        test = row["test"]
        mde = "–" if math.isnan(row["mde"]) else f"±{row['mde']:.3f}"
        lines.append(
            f"| {row['contrast']} | {_n_note(row)} | {_num(test.mean)} | {_ci(test)} | {_p(test.p)} | "
            f"{_p(row['holm'])} | {'**yes**' if row['decided'] else 'no'} | {mde} |"
        )
    sds = [row["test"].sd for row in primary if not math.isnan(row["test"].sd)]
    ns = sorted({row["test"].n for row in primary})
    lines += [
        "",
        f"Power: with n = {', '.join(map(str, ns))} pairs and each contrast's observed SD of the paired differences "
        f"({', '.join(f'{s:.3f}' for s in sds) or '–'}), the test at Holm's first-step level α/m = {alpha}/{m} = "
        f"{first_level:.3g} (two-sided) detects a true Δ of the MDE column's size with {power:.0%} probability "
        "(noncentral t, exact; smaller effects are likely missed: an undecided contrast is not evidence of no "
        "effect). Later Holm steps test at α/(m − 1), …, α, so the MDE is the family's most demanding bound.",
        "",
    ]
    if secondary:
        lines += [
            f"### Secondary (a separate family of {len(secondary)}, Holm within it; not confirmatory)",
            "",
            "| metric | contrast | n | Δ | 95% CI | p | Holm p | decided |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in secondary:
            test = row["test"]
            lines.append(
                f"| {row['title']} | {row['contrast']} | {_n_note(row)} | {_num(test.mean)} | {_ci(test)} | "
                f"{_p(test.p)} | {_p(row['holm'])} | {'**yes**' if row['decided'] else 'no'} |"
            )
        lines.append("")
    record = {
        "source": spec.source,
        "alpha": alpha,
        "power": power,
        "primary": [_plain_row(row) for row in primary],
        "secondary": [_plain_row(row) for row in secondary],
    }
    return "\n".join(lines), record


def _plain_row(row: dict) -> dict:
    test = row["test"]
    out = {k: v for k, v in row.items() if k != "test"}
    out.update(
        {"n": test.n, "seeds": list(test.seeds), "delta": test.mean, "half_width": test.half_width, "sd": test.sd}
        | {"t": test.t, "p": test.p}
    )
    return out
