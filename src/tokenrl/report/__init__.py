"""Reports over a Hydra multirun folder: markdown tables (mean ± 95% CI over seeds, paired differences against a
baseline), PNG curves and pass@k bars, and an HTML page of sample rollouts (`python scripts/report.py`)."""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import yaml

from tokenrl.report.html import write_samples_page
from tokenrl.report.plots import plot_curves, plot_passk
from tokenrl.report.runs import Run, final_validation, last_mean, load_sweep, missing_runs
from tokenrl.report.stats import Interval, mean_ci, paired_difference

Metric = Callable[[Run], float]


def _get(values: dict[str, float], key: str) -> float:
    return values.get(key, math.nan)


def metrics(ks: list[str]) -> dict[str, Metric]:
    """Title → per-run value; `ks` are the pass@k names found in the runs (e.g. pass@1, pass@4)."""
    table: dict[str, Metric] = {}
    for k in ks:
        table[f"held-out {k} after training"] = lambda run, k=k: _get(final_validation(run), f"val/{k}")
    for k in ks:
        table[f"held-out {k} before training"] = lambda run, k=k: _get(run.validation.get(0, {}), f"val/{k}")
    table.update({
        "training reward, last 3 steps": lambda run: last_mean(run, "train/reward"),
        "token entropy, last 3 steps (nats)": lambda run: last_mean(run, "train/entropy"),
        "Rényi-2 entropy, last 3 steps (nats)": lambda run: last_mean(run, "train/renyi2"),
        "fraction of tokens updated, last 3 steps": lambda run: last_mean(run, "select/fraction"),
        "mean π of updated tokens, last 3 steps": lambda run: last_mean(run, "select/p_selected"),
        "seconds per rollout step": lambda run: last_mean(run, "time/step", last=10**9),
    })
    return table


PASSK_KEY = re.compile(r"val/((?:[^/]+/)?pass@\d+)")   # val/pass@k (the task) or val/<benchmark>/pass@k


def passk_names(runs: list[Run]) -> list[str]:
    """The pass@k names the runs validated: the task's (pass@1, pass@4) first, then each extra benchmark's."""
    names = {match.group(1) for run in runs for values in run.validation.values() for key in values
             if (match := PASSK_KEY.fullmatch(key))}
    return sorted(names, key=lambda name: ("/" in name, name.rsplit("pass@", 1)[0], int(name.rsplit("@", 1)[1])))


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Complete runs by label, in the order the sweep listed them."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        if run.complete:
            groups.setdefault(run.label, []).append(run)
    return groups


def metric_table(title: str, metric: Metric, groups: dict[str, list[Run]], baseline: str | None) -> tuple[str, dict]:
    """A markdown table of one metric: per group n, mean ± 95% CI, paired Δ vs the baseline, per-seed values."""
    base = {run.seed: metric(run) for run in groups.get(baseline, [])} if baseline else {}
    header = f"| group | n | mean ± 95% CI | Δ vs {baseline} (paired over seeds) | per seed |" if base else \
        "| group | n | mean ± 95% CI | per seed |"
    lines = [f"### {title}", "", header, "|" + "---|" * (header.count("|") - 1)]
    record = {}
    for label, members in groups.items():
        values = {run.seed: metric(run) for run in members}
        interval = mean_ci(list(values.values()))
        seeds = ", ".join(f"s{seed}: {value:.3f}" for seed, value in sorted(values.items()) if not math.isnan(value))
        record[label] = {"interval": asdict(interval), "per_seed": values}
        if base:
            delta = paired_difference(values, base) if label != baseline else None
            record[label]["delta"] = asdict(delta) if delta else None
            shown = "—" if delta is None else f"{delta.format()} (n={delta.n})"
            lines.append(f"| {label} | {interval.n} | {interval.format()} | {shown} | {seeds} |")
        else:
            lines.append(f"| {label} | {interval.n} | {interval.format()} | {seeds} |")
    return "\n".join(lines), record


def glance_table(records: dict[str, dict], groups: dict[str, list[Run]], ks: list[str], baseline: str | None) -> str:
    """One row per group: held-out pass@k after training (with the paired Δ against the baseline), final entropy
    and updated fraction — the headline of the per-metric tables below, from the same numbers."""
    def cell(record: dict | None) -> str:
        return "–" if not record else Interval(**record).format()

    columns = [(f"held-out {k} after training", True) for k in ks] + [
        ("token entropy, last 3 steps (nats)", False), ("fraction of tokens updated, last 3 steps", False)]
    header = ["group", "n"]
    for title, paired in columns:
        header.append(title.replace("held-out ", ""))
        if paired and baseline:
            header.append(f"Δ vs {baseline}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, members in groups.items():
        row = [label, str(len(members))]
        for title, paired in columns:
            record = records[title][label]
            row.append(cell(record["interval"]))
            if paired and baseline:
                row.append("—" if label == baseline else cell(record.get("delta")))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def reproduce_command(folder: Path) -> str:
    path = folder / "multirun.yaml"
    if not path.is_file():
        return "(multirun.yaml missing: the command is unknown)"
    task = ((yaml.safe_load(path.read_text()).get("hydra") or {}).get("overrides") or {}).get("task") or []
    return "python train.py -m " + " ".join(task)


def runs_section(runs: list[Run], missing: list[dict[str, str]]) -> str:
    counts = {status: sum(run.status == status for run in runs) for status in ("complete", "failed", "incomplete")}
    lines = ["## Runs", "",
             f"{counts['complete']} complete, {counts['failed']} failed, {counts['incomplete']} incomplete, "
             f"{len(missing)} never started. **Only complete runs enter the tables and plots.**", ""]
    bad = [run for run in runs if not run.complete]
    if bad or missing:
        lines.append("⚠ Left out: " + "; ".join(
            [f"job {run.job} ({run.label}, seed {run.seed}) {run.status}: {run.reason}" for run in bad] +
            [f"{', '.join(f'{k}={v}' for k, v in combo.items())} never started" for combo in missing]))
        lines.append("")
    lines += ["| job | group | seed | status | steps logged | note |", "|---|---|---|---|---|---|"]
    for run in runs:
        lines.append(f"| {run.job} | {run.label} | {run.seed} | {run.status} | {len(run.steps)}/{run.total_steps} | "
                     f"{run.reason} |")
    return "\n".join(lines)


def build_report(folder: Path, out: Path, baseline: str | None = "uniform", title: str | None = None,
                 reading: Path | None = None) -> dict:
    """Write report.md, report.json, curves.png, passk.png and samples.html for the multirun `folder` into `out`."""
    folder, out = Path(folder), Path(out)
    runs = load_sweep(folder)
    missing = missing_runs(folder, runs)
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    if baseline not in groups:
        baseline = None
    title_option = f' --title "{title}"' if title else ""
    title = title or f"Sweep {folder.name}"
    ks = passk_names([run for members in groups.values() for run in members])
    sections, records = [], {}
    for name, metric in metrics(ks).items():
        text, records[name] = metric_table(name, metric, groups, baseline)
        sections.append(text)
    before = {k: mean_ci([_get(run.validation.get(0, {}), f"val/{k}") for m in groups.values() for run in m]).mean
              for k in ks}
    figures = []
    if groups:
        figures.append(plot_curves(groups, out / "curves.png").name)
        if ks:
            figures.append(plot_passk(groups, ks, before, out / "passk.png").name)
    write_samples_page(runs, out / "samples.html", title)
    command = reproduce_command(folder)
    report = [f"# {title}", "", "Reproduce:", "", "```bash", command,
              f"python scripts/report.py {folder} --out {out}{title_option}" + (f" --reading {reading}" if reading else ""),
              "```", ""]
    if reading:
        report += [Path(reading).read_text().strip(), ""]
    if groups:
        report += ["## At a glance", "", "Mean ± 95% CI over seeds; Δ = paired difference against "
                   f"`{baseline}` (details and per-seed values under Results)." if baseline else
                   "Mean ± 95% CI over seeds (details and per-seed values under Results).", "",
                   glance_table(records, groups, [k for k in ks if "/" not in k], baseline), ""]
    report += [runs_section(runs, missing), "", "## Results", "",
               "Mean ± 95% CI over seeds (Student t, n − 1 degrees of freedom); Δ = paired difference against "
               f"`{baseline}` over the seeds both completed." if baseline else "Mean ± 95% CI over seeds.", ""]
    report += [s + "\n" for s in sections]
    report += ["## Figures", ""] + [f"![{name}]({name})" for name in figures]
    report += ["", "Sample rollouts with each selector's chosen tokens: [samples.html](samples.html)", ""]
    (out / "report.md").write_text("\n".join(report))
    payload = {"folder": str(folder), "command": command, "baseline": baseline,
               "runs": [{"job": r.job, "label": r.label, "seed": r.seed, "status": r.status, "reason": r.reason}
                        for r in runs],
               "missing": missing, "metrics": records}
    (out / "report.json").write_text(json.dumps(payload, indent=2, default=_plain))
    return payload


def _plain(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else str(value)


__all__ = ["Interval", "build_report", "load_sweep", "mean_ci", "paired_difference"]
