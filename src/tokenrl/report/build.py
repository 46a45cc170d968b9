"""`build_report`: a multirun folder in, report.md, report.json, curves.png, passk.png and samples.html out."""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

import yaml

from tokenrl.report.contrasts import Spec, contrasts_section, spec_from_config
from tokenrl.report.html import write_samples_page
from tokenrl.report.plots import plot_curves, plot_passk
from tokenrl.report.runs import load_sweep, missing_runs
from tokenrl.report.stats import mean_ci
from tokenrl.report.tables import (
    glance_table,
    group_runs,
    held_out,
    logs_forks,
    metric_table,
    metrics,
    passk_names,
    runs_section,
)


def reproduce_command(folder: Path) -> str:
    path = folder / "multirun.yaml"
    if not path.is_file():
        return "(multirun.yaml missing: the command is unknown)"
    task = ((yaml.safe_load(path.read_text()).get("hydra") or {}).get("overrides") or {}).get("task") or []
    return "python train.py -m " + " ".join(task)


def build_report(folder: Path, out: Path, options: Namespace) -> dict:
    """Write report.md, report.json, curves.png, passk.png and samples.html for the multirun `folder` into `out` by
    scripts/report.py's parsed `options`: paired differences against `--baseline` (the headline's) and each group of
    `--also-against`; the pre-registered contrasts of `--contrasts`, else the sweep config's `report:` block
    (report/contrasts.py); none: no contrasts section."""
    folder, out, title, reading = Path(folder), Path(out), options.title, options.reading
    also_against = options.also_against
    runs = load_sweep(folder)
    missing = missing_runs(folder, runs)
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    baseline = options.baseline if options.baseline in groups else None
    baselines = [name for name in (baseline, *also_against) if name in groups]
    title_option = (f' --title "{title}"' if title else "") + (
        f" --also-against {' '.join(also_against)}" if also_against else ""
    )
    title = title or f"Sweep {folder.name}"
    contrasts = options.contrasts and Spec(
        tuple(options.contrasts), options.primary, tuple(options.secondary), "the command line (--contrasts)"
    )
    spec = contrasts or spec_from_config(runs)
    if contrasts:
        title_option += f" --contrasts {' '.join(contrasts.contrasts)} --primary {contrasts.primary}" + (
            f" --secondary {' '.join(contrasts.secondary)}" if contrasts.secondary else ""
        )
    contrast_text, contrast_record = contrasts_section(groups, spec) if spec and groups else ("", None)
    ks = passk_names([run for members in groups.values() for run in members])
    sections, records = [], {}
    for name, metric in metrics(ks, logs_forks(runs)).items():
        text, records[name] = metric_table(name, metric, groups, baselines)
        sections.append(text)
    before = {
        k: mean_ci([held_out(run, f"val/{k}", before=True) for m in groups.values() for run in m]).mean for k in ks
    }
    figures = []
    if groups:
        figures.append(plot_curves(groups, out / "curves.png").name)
        if ks:
            figures.append(plot_passk(groups, ks, before, out / "passk.png").name)
    write_samples_page(runs, out / "samples.html", title)
    command = reproduce_command(folder)
    report = [
        f"# {title}",
        "",
        "Reproduce:",
        "",
        "```bash",
        command,
        f"python scripts/report.py {folder} --out {out}{title_option}" + (f" --reading {reading}" if reading else ""),
        "```",
        "",
    ]
    if reading:
        report += [Path(reading).read_text().strip(), ""]
    if groups:
        report += [
            "## At a glance",
            "",
            "Mean ± 95% CI over seeds; Δ = paired difference against "
            f"`{baseline}` (details and per-seed values under Results)."
            if baseline
            else "Mean ± 95% CI over seeds (details and per-seed values under Results).",
            "",
            glance_table(records, groups, [k for k in ks if "/" not in k], baseline),
            "",
        ]
    if contrast_text:
        report += [contrast_text, ""]
    against = " and ".join(f"`{name}`" for name in baselines)
    report += [
        runs_section(runs, missing),
        "",
        "## Results",
        "",
        "Mean ± 95% CI over seeds (Student t, n − 1 degrees of freedom); Δ = paired difference against "
        f"{against} over the seeds both completed."
        if baselines
        else "Mean ± 95% CI over seeds.",
        "",
    ]
    report += [s + "\n" for s in sections]
    report += ["## Figures", ""] + [f"![{name}]({name})" for name in figures]
    report += ["", "Sample rollouts with each selector's chosen tokens: [samples.html](samples.html)", ""]
    (out / "report.md").write_text("\n".join(report))
    payload = {
        "folder": str(folder),
        "command": command,
        "baseline": baseline,
        "baselines": baselines,
        "runs": [
            {"job": r.job, "label": r.label, "seed": r.seed, "status": r.status, "reason": r.reason}
            | {"lr": r.lr, "updated_share": r.updated_share}
            for r in runs
        ],
        "missing": missing,
        "metrics": records,
        "contrasts": contrast_record,
    }
    (out / "report.json").write_text(json.dumps(payload, indent=2, default=_plain))
    return payload


def _plain(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else str(value)
