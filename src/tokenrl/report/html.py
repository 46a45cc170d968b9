"""The "branching tokens" page: sample rollouts with each selector's chosen tokens highlighted side by side.

Steps count from 1, as the console counts. Part 1 shows one group of rollouts of step 1 — identical in every run of
a seed (same weights, same sampling seed); the first seed whose group has a learning signal — once per selector:
ICT / 20-Entropy / STAPO as recorded in `would_select` (paper defaults, no warm-up) by the run of the seed that recorded
the most of them (only a run that computes JS records ICT), and what each run actually updated. Part 2 shows, for a
later step, what every run updated on its own rollouts. A run's row shows each token's weight as highlight strength
(a mask's are all or nothing), and one more row for each per-token field its method sets (ε_high, KL weight, token
advantage, drift penalty), strength |value| / the row's largest. Hovering a token shows its entropy H, JS score u
and the value shown.
`write_run_samples_page` shows one run's recorded steps the same way (`python scripts/report.py <run> --samples`).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from tokenrl.report.runs import Run

COLOURS = {
    "forks": "#e63946",
    "ict": "#f4a261",
    "entropy20": "#8ecae6",
    "stapo": "#b5e48c",
    "updated": "#e9c46a",
    "shaping": "#c77dff",
}
REFERENCES = {
    "ict": "ICT (top-10% JS per response)",
    "entropy20": "20-Entropy (top-20% entropy of the batch)",
    "stapo": "STAPO (silenced spurious tokens removed)",
}
SHAPING_LABELS = {
    "clip_high": "ε_high",
    "kl_weights": "KL weight",
    "advantages": "token advantage",
    "drift_coef": "drift penalty β",
}
STYLE = """
body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px;color:#222}
.resp{border:1px solid #ddd;border-radius:6px;margin:10px 0;padding:8px}
.row{display:flex;gap:8px;margin:3px 0;align-items:baseline}
.who{width:170px;flex:none;font-size:12px;color:#555}
.toks{font-family:ui-monospace,monospace;font-size:13px;white-space:pre-wrap;word-break:break-word}
.toks span{border-radius:3px}
.meta{font-size:12px;color:#666}
code{background:#f3f3f3;padding:1px 4px}
"""


def read_samples(run: Run, step: int) -> list[dict]:
    """The sample records of rollout step `step` (counted from 1), or [] where none were written."""
    path = run.folder / "samples" / f"step_{step:04d}.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tokens(record: dict, values: list[float], colour: str) -> str:
    """The response's tokens, each highlighted with strength |value| / the largest |value| of the row."""
    spans = []
    js = record.get("js") or [None] * len(record["tokens"])
    largest = max((abs(v) for v in values if v is not None), default=0.0) or 1.0
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    for token, value, entropy, score in zip(record["tokens"], values, record["entropy"], js):
        shown = "unbounded" if value is None else f"{value:g}"  # null: a non-finite value (an unbounded ε)
        title = f"H={entropy:.3f}" + ("" if score is None else f" u={score:.3f}") + f" value={shown}"
        strength = 0.0 if value is None else abs(value) / largest
        style = f' style="background:rgba({red},{green},{blue},{strength:.2f})"' if strength > 0 else ""
        spans.append(f'<span title="{title}"{style}>{html.escape(token)}</span>')
    return "".join(spans)


def _row(who: str, record: dict, values: list[float], colour: str) -> str:
    share = sum(1 for v in values if v is None or v) / max(len(values), 1)
    return (
        f'<div class="row"><div class="who">{html.escape(who)} ({share:.0%})</div>'
        f'<div class="toks">{_tokens(record, values, colour)}</div></div>'
    )


def recorded_steps(run: Run) -> set[int]:
    """The rollout steps (counted from 1) the run wrote samples of."""
    return {int(p.stem.split("_")[1]) for p in (run.folder / "samples").glob("step_*.jsonl")}


def _would_rows(record: dict) -> str:
    """What each reference selector would update in the response."""
    return "".join(
        _row(f"would select: {name}", record, mask, COLOURS.get(name.split("@")[0], "#ddd"))
        for name, mask in record["would_select"].items()
    )


def _fork_row(record: dict) -> str:
    """The response's true forks, on a task that names them (task=forks), else nothing."""
    forks = record.get("forks")
    return "" if forks is None else _row("true forks", record, forks, COLOURS["forks"])


def _run_rows(who: str, record: dict) -> str:
    """What a run did to a response: its token weights, then each per-token field its method set."""
    rows = [_row(f"{who}: updated", record, record["updated"], COLOURS["updated"])]
    for name, values in record.get("shaping", {}).items():
        rows.append(_row(f"{who}: {SHAPING_LABELS.get(name, name)}", record, values, COLOURS["shaping"]))
    return "".join(rows)


def _meta(record: dict) -> str:
    return (
        f'<div class="meta">response {record["row"]} · reward {record["reward"]:g} · advantage '
        f"{record['advantage']:+.3f} · {len(record['tokens'])} tokens · {record['finish_reason']}</div>"
    )


def question(record: dict) -> str:
    """The user's line of a decoded chat prompt (the last line that is not the assistant header)."""
    lines = [line for line in record["prompt"].strip().splitlines() if line.strip() and line.strip() != "assistant"]
    return lines[-1] if lines else ""


def signal_seed(runs: list[Run]) -> int:
    """The first seed whose step-1 samples carry a learning signal (some advantage ≠ 0), else the first seed."""
    seeds = sorted({run.seed for run in runs})
    for seed in seeds:
        records = [r for run in runs if run.seed == seed for r in read_samples(run, 1)]
        if any(abs(r["advantage"]) > 0 for r in records):
            return seed
    return seeds[0]


def first_step_section(runs: list[Run], rows: int) -> str:
    """One group of step-1 rollouts of one seed, highlighted by every selector."""
    seed = signal_seed(runs)
    same_seed = [run for run in runs if run.seed == seed and read_samples(run, 1)]
    if not same_seed:
        return "<p>No step-1 samples were recorded (samples.every_n_steps = 0?).</p>"
    records = {run.label: read_samples(run, 1) for run in same_seed}
    # the reference rows come from the run that recorded the most of them: ICT's only where JS was computed
    source = max(same_seed, key=lambda run: len(records[run.label][0]["would_select"]))
    first = records[source.label]
    identical = all([r["tokens"] for r in recs] == [r["tokens"] for r in first] for recs in records.values())
    note = (
        f"identical in all {len(records)} runs of seed {seed}"
        if identical
        else f"they differ between runs of seed {seed}, so the rows below come from run {source.job} only"
    )
    bases = [name.split("@")[0] for name in first[0]["would_select"]]  # `ict@0.1`: the reference at its own ratio
    shown = [REFERENCES.get(base, base) for base in bases]
    missing = (
        ""
        if "ict" in bases
        else f" ICT is not shown: no run of seed {seed} computed JS (a selector that reads JS, such as ict, or "
        f"diagnostics.js=true computes it)."
    )
    parts = [
        f"<h2>Step 1: the same rollouts, each selector's choice</h2><p>Seed {seed}, prompt "
        f"<code>{html.escape(question(first[0]))}</code>; "
        f"the rollouts are {note}. Rows: what {', '.join(shown)} would update (recorded by run {source.job}), "
        f"then what each run updated at this step (warm-up steps update every token).{missing}</p>"
    ]
    for index, record in enumerate(first[:rows]):
        lines = [_meta(record), _fork_row(record), _would_rows(record)]
        if identical:
            for label, recs in records.items():
                lines.append(_run_rows(f"run {label}", recs[index]))
        parts.append(f'<div class="resp">{"".join(lines)}</div>')
    return "".join(parts)


def later_step_section(runs: list[Run], rows: int) -> str:
    """For the last step every run of the seed recorded, what each run updated on its own rollouts."""
    seed = signal_seed(runs)
    same_seed = [run for run in runs if run.seed == seed]
    recorded = [recorded_steps(run) for run in same_seed]
    common = set.intersection(*recorded) - {1} if recorded else set()
    if not common:
        return ""
    step = max(common)
    parts = [
        f"<h2>Step {step}: what each run updated on its own rollouts (seed {seed})</h2>"
        "<p>The policies have diverged, so each run shows its own rollouts of the same prompt.</p>"
    ]
    for run in same_seed:
        records = read_samples(run, step)[:rows]
        body = "".join(_meta(r) + _fork_row(r) + _run_rows(run.label, r) for r in records)
        prompt = html.escape(question(records[0])) if records else ""
        parts.append(
            f'<h3>{html.escape(run.label)} (job {run.job}): <code>{prompt}</code></h3><div class="resp">{body}</div>'
        )
    return "".join(parts)


def _page(title: str, body: str) -> str:
    legend = " ".join(
        f'<span style="background:{c};padding:1px 6px;border-radius:3px">{n}</span>' for n, c in COLOURS.items()
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}: sample rollouts</h1>"
        f"<p>Highlight colours: {legend}. Hover a token for its entropy H and JS score u.</p>{body}"
        f"</body></html>"
    )


def write_samples_page(runs: list[Run], path: Path, title: str, rows: int = 8) -> Path:
    complete = [run for run in runs if run.complete]
    body = (
        first_step_section(complete, rows) + later_step_section(complete, min(rows, 4))
        if complete
        else "<p>No complete runs.</p>"
    )
    path.write_text(_page(title, body))
    return path


def write_run_samples_page(run: Run, path: Path, step: int | None = None) -> Path:
    """One run's samples: every recorded step (or `step` alone), each response with what the reference selectors
    would update and what the run updated."""
    recorded = sorted(recorded_steps(run))
    if step is not None and step not in recorded:
        where = f"steps {', '.join(map(str, recorded))}" if recorded else "no step (samples.every_n_steps=0?)"
        raise ValueError(f"{run.folder} has no samples of step {step}; it recorded {where}, counted from 1")
    parts = []
    for number in recorded if step is None else [step]:
        records = read_samples(run, number)
        prompt = html.escape(question(records[0])) if records else ""
        parts.append(f"<h2>Step {number}: <code>{prompt}</code></h2>")
        parts += [
            f'<div class="resp">{_meta(r)}{_fork_row(r)}{_would_rows(r)}{_run_rows("run", r)}</div>' for r in records
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_page(str(run.folder), "".join(parts) or "<p>No samples were recorded.</p>"))
    return path
