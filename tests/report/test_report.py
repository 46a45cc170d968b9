"""scripts/report.py on a synthetic multirun folder: known numbers in, known tables out; bad runs are named."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tokenrl.report.stats import mean_ci, paired_difference, t975

TOTAL_STEPS = 4
# held-out pass@1 after training per (selector, seed); pass@4 = pass@1 + 0.2
PASS1 = {
    ("uniform", 0): 0.5,
    ("uniform", 1): 0.6,
    ("uniform", 2): 0.7,
    ("ict", 0): 0.6,
    ("ict", 1): 0.8,
    ("ict", 2): 0.7,
}


def write_job(folder, job, selector, seed, *, steps=TOTAL_STEPS, finished=True, traceback=False):
    run = folder / str(job)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "total_steps": TOTAL_STEPS}))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"selector={selector}", f"seed={seed}"]))
    (run / "csv").mkdir()
    final = PASS1.get((selector, seed), 0.0)
    with (run / "csv" / "metrics.csv").open("w", newline="") as handle:
        fields = [
            "epoch",
            "step",
            "train/rollout_step",
            "train/reward",
            "train/entropy",
            "train/renyi2",
            "select/fraction",
            "time/step",
            "val/at_step",
            "val/pass@1",
            "val/pass@4",
            "val/math500/pass@1",
        ]
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        for step in range(steps):
            row = {
                "epoch": 0,
                "step": step,
                "train/rollout_step": step + 1,
                "train/reward": 0.1 * step + seed,
                "train/entropy": 2.0 - 0.1 * step,
                "train/renyi2": 1.0,
                "time/step": 10.0,
                "select/fraction": 1.0 if selector == "uniform" else 0.1,
            }
            if step == 0:
                row.update({"val/at_step": 0, "val/pass@1": 0.2, "val/pass@4": 0.4})
            if step == TOTAL_STEPS - 1:
                row.update(
                    {
                        "val/at_step": TOTAL_STEPS,
                        "val/pass@1": final,
                        "val/pass@4": final + 0.2,
                        "val/math500/pass@1": final / 2,
                    }
                )
            writer.writerow(row)
    (run / "train.log").write_text("Traceback (most recent call last):\nRuntimeError: boom\n" if traceback else "ok\n")
    if finished:
        (run / "summary.json").write_text(json.dumps({"rollout_steps": steps}))
    (run / "samples").mkdir()
    with_js = selector == "ict"  # as a run writes them: only a run that computes JS records u and ICT's choice
    record = {
        "step": 1,
        "row": 0,
        "group": 0,
        "selector": selector,
        "prompt": "user\nWhat is 1 + 1?\n",
        "tokens": ["2", "<eos>"],
        "reward": 1.0,
        "advantage": 0.5,
        "finish_reason": "stop",
        "entropy": [0.5, 0.1],
        "js": [0.2, 0.0] if with_js else None,
        "updated": [1, 1],
        "would_select": {**({"ict": [1, 0]} if with_js else {}), "entropy20": [1, 0], "stapo": [1, 1]},
    }
    (run / "samples" / "step_0001.jsonl").write_text(json.dumps(record) + "\n")


@pytest.fixture
def sweep(tmp_path):
    folder = tmp_path / "multirun"
    folder.mkdir()
    (folder / "multirun.yaml").write_text(
        yaml.safe_dump(
            {
                "hydra": {
                    "sweeper": {"params": {"selector": "uniform,ict,random", "seed": "0,1,2"}},
                    "overrides": {"task": ["experiment=cpu_study"]},
                }
            },
            sort_keys=False,
        )
    )
    job = 0
    for selector in ("uniform", "ict"):
        for seed in (0, 1, 2):
            write_job(folder, job, selector, seed)
            job += 1
    write_job(folder, job, "random", 0, steps=2, finished=False, traceback=True)  # crashed
    write_job(folder, job + 1, "random", 1, steps=3, finished=False)  # stopped / still running
    return folder  # random seed 2: never started


def test_student_t_quantiles():
    assert t975(2) == 4.303 and t975(30) == 2.042
    assert t975(35) == pytest.approx(2.030, abs=2e-3)  # tables: t_{0.975,35} = 2.030
    assert t975(1000) == pytest.approx(1.962, abs=2e-3)
    interval = mean_ci([1.0, 2.0, 3.0])
    assert (interval.n, interval.mean) == (3, 2.0) and interval.half_width == pytest.approx(4.303 / 3**0.5)
    paired = paired_difference({0: 0.6, 1: 0.8, 2: 0.7, 3: 9.9}, {0: 0.5, 1: 0.6, 2: 0.7})
    assert (
        paired.n == 3 and paired.mean == pytest.approx(0.1) and paired.half_width == pytest.approx(4.303 * 0.1 / 3**0.5)
    )


def test_report_tables_from_known_numbers(sweep, tmp_path):
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "scripts/report.py", str(sweep), "--out", str(out), "--title", "Synthetic"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = (out / "report.md").read_text()
    # uniform: 0.5, 0.6, 0.7 → 0.600 ± 4.303·0.1/√3 = 0.248; ict: 0.6, 0.8, 0.7 → 0.700;
    # paired Δ 0.1, 0.2, 0.0 → 0.100 ± 0.248
    assert "| uniform | 3 | 0.600 ± 0.248 | — | s0: 0.500, s1: 0.600, s2: 0.700 |" in report
    assert "| ict | 3 | 0.700 ± 0.248 | 0.100 ± 0.248 (n=3) | s0: 0.600, s1: 0.800, s2: 0.700 |" in report
    glance = report.split("## At a glance")[1].split("## Runs")[0]  # headline: same numbers, one row per group
    assert "| group | n | pass@1 after training | Δ vs uniform | pass@4 after training | Δ vs uniform |" in glance
    assert "| uniform | 3 | 0.600 ± 0.248 | — | 0.800 ± 0.248 | — | 1.800 ± 0.000 | 1.000 ± 0.000 |" in glance
    assert (
        "| ict | 3 | 0.700 ± 0.248 | 0.100 ± 0.248 | 0.900 ± 0.248 | 0.100 ± 0.248 | 1.800 ± 0.000 | 0.100 ± 0.000 |"
        in glance
    )
    assert "random" not in glance
    pass4 = report.split("### held-out pass@4 after training")[1].split("###")[0]
    assert "| ict | 3 | 0.900 ± 0.248 | 0.100 ± 0.248 (n=3) |" in pass4
    extra = report.split("### held-out math500/pass@1 after training")[1].split("###")[0]  # validation.benchmarks
    assert "| ict | 3 | 0.350 ± 0.124 | 0.050 ± 0.124 (n=3) |" in extra and "math500" not in glance
    before = report.split("### held-out pass@1 before training")[1].split("###")[0]
    assert "| ict | 3 | 0.200 ± 0.000 | 0.000 ± 0.000 (n=3) |" in before
    reward = report.split("### training reward, last 3 steps")[1].split("###")[0]
    assert "| uniform | 3 | 1.200 ± 2.484 |" in reward  # (0.1+0.2+0.3)/3 + seed → 0.2, 1.2, 2.2
    # failed / incomplete / never started are named and kept out of every mean
    assert "6 complete, 1 failed, 1 incomplete, 1 never started" in report
    assert "job 6 (random, seed 0) failed: RuntimeError: boom" in report
    assert "job 7 (random, seed 1) incomplete: 3 of 4 steps logged, no summary.json" in report
    assert "selector=random, seed=2 never started" in report
    assert "| random |" not in report.split("## Results")[1]
    assert "python train.py -m experiment=cpu_study" in report
    payload = json.loads((out / "report.json").read_text())
    assert payload["metrics"]["held-out pass@1 after training"]["ict"]["interval"]["mean"] == pytest.approx(0.7)
    for name in ("curves.png", "passk.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "samples.html").read_text()
    assert "identical in all 2 runs of seed 0" in page and "would select: ict" in page and "run ict: updated" in page


@pytest.mark.parametrize(
    "given,message",
    [
        ("missing", "{folder}: no such folder; a report is over a sweep's folder, logs/<task_name>/multiruns/<time>"),
        ("empty", "{folder} has no job folders (<n>/.hydra/config.yaml); a report is over a sweep's folder"),
        ("file", "{folder}: not a folder; a report is over a sweep's folder"),
        (
            "run",
            "{folder} is a single run's folder; a report is over a sweep's folder, logs/<task_name>/multiruns/<time>",
        ),
        ("reading", "--reading {folder}/notes.md: no such file"),
        ("option", "unrecognized arguments: --baseline-of"),
    ],
)
def test_each_bad_input_is_one_error_line_and_status_2(sweep, tmp_path, given, message):
    folder = {
        "missing": tmp_path / "nothing",
        "empty": tmp_path,
        "file": sweep / "multirun.yaml",
        "run": sweep / "0",
        "reading": sweep,
        "option": sweep,
    }[given]
    extra = {"reading": ["--reading", str(sweep / "notes.md")], "option": ["--baseline-of", "x"]}.get(given, [])
    done = subprocess.run(
        [sys.executable, "scripts/report.py", str(folder), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert message.format(folder=folder) in done.stderr
    assert not (sweep / "report").exists()


@pytest.mark.parametrize(
    "narrowed,seeds,missing",
    [("seed=0", ["0"], ["random/0"]), ("seed=range(0,2)", ["0", "1"], ["random/0", "uniform/1", "ict/1", "random/1"])],
)
def test_a_sweep_narrowed_on_the_command_line_misses_only_its_own_jobs(tmp_path, narrowed, seeds, missing):
    """`python train.py -m experiment=... seed=0`: the grid is the sweep's own, multirun.yaml's sweeper params with the
    command line's overrides applied, not the experiment's three seeds."""
    from tokenrl.report.runs import load_sweep, missing_runs, sweep_grid

    folder = tmp_path / "multirun"
    folder.mkdir()
    params = {"selector": "uniform,ict,random", "seed": "0,1,2"}
    task = ["experiment=cpu_study", "debug=default", "rollout=hf", narrowed]
    (folder / "multirun.yaml").write_text(
        yaml.safe_dump({"hydra": {"sweeper": {"params": params}, "overrides": {"task": task}}})
    )
    write_job(folder, 0, "uniform", 0)
    write_job(folder, 1, "ict", 0)
    assert sweep_grid(folder) == {"selector": ["uniform", "ict", "random"], "seed": seeds}
    assert [f"{m['selector']}/{m['seed']}" for m in missing_runs(folder, load_sweep(folder))] == missing
    done = subprocess.run(
        [sys.executable, "scripts/report.py", str(folder), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"2 complete runs, 0 not complete, {len(missing)} never started")


def test_a_single_runs_samples_open_by_step_counted_from_1(sweep, tmp_path):
    """`scripts/report.py <run> --samples [STEP]`: samples.html of every step the run recorded, or of STEP alone; a
    step it did not record, or a sweep's folder, is one error line."""
    run = sweep / "3"  # ict, seed 0: step_0001.jsonl; a later page added
    later = json.loads((run / "samples" / "step_0001.jsonl").read_text()) | {"step": 6, "prompt": "user\nLater?\n"}
    (run / "samples" / "step_0006.jsonl").write_text(json.dumps(later) + "\n")

    def report(*args):
        command = [sys.executable, "scripts/report.py", *map(str, args), "--out", str(tmp_path / "out")]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    done = report(run, "--samples")
    page = (tmp_path / "out" / "samples.html").read_text()
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "out" / "samples.html"), done.stderr
    assert "<h2>Step 1: <code>What is 1 + 1?</code>" in page and "<h2>Step 6: <code>Later?</code>" in page
    assert "would select: ict" in page and "run: updated" in page
    from tests.helpers.scripts import load_script

    one = load_script("scripts/report.py").run_samples(run, tmp_path / "one", 6).read_text()
    assert "<h2>Step 6" in one and "<h2>Step 1" not in one
    for args, message in (
        ((run, "--samples", "2"), f"error: {run} has no samples of step 2; it recorded steps 1, 6, counted from 1"),
        ((sweep, "--samples"), f"error: --samples opens a single run's folder (one with .hydra/config.yaml); {sweep}"),
    ):
        done = report(*args)
        assert done.returncode == 2 and done.stderr.startswith(message) and len(done.stderr.splitlines()) == 1


def test_plot_curves_counts_rollout_steps_as_the_report_does(sweep):
    from tests.helpers.scripts import load_script
    from tokenrl.report.runs import load_run, rollout_step_index

    plot_curves = load_script("scripts/plot_curves.py")
    steps, values = plot_curves.read_metric(sweep / "0", "train/reward")
    run = load_run(sweep / "0")
    assert steps == sorted(run.steps) == list(range(TOTAL_STEPS))  # logged 1 … N, keyed from 0
    assert values == [run.steps[s]["train/reward"] for s in steps]
    assert rollout_step_index("1.0") == rollout_step_index(1) == 0


@pytest.mark.parametrize("order", [("uniform", "ict"), ("ict", "uniform"), ("uniform",)])
def test_samples_page_shows_ict_from_the_run_that_computed_js_whatever_the_run_order(tmp_path, order):
    """Only an ict run records ICT's choice (and u); the page shows it when that run is not the seed's first, and
    says why ICT is missing when no run computed JS."""
    from tokenrl.report.html import write_samples_page
    from tokenrl.report.runs import load_sweep

    for job, selector in enumerate(order):
        write_job(tmp_path, job, selector, 0)
    page = write_samples_page(load_sweep(tmp_path), tmp_path / "samples.html", "t").read_text()
    if "ict" in order:
        assert "would select: ict" in page and "u=0.200" in page and "ICT is not shown" not in page
        assert f"recorded by run {order.index('ict')}" in page and "run uniform: updated" in page
    else:
        assert "would select: ict" not in page and "ICT is not shown: no run of seed 0 computed JS" in page
    assert "would select: entropy20" in page and "would select: stapo" in page


def test_samples_page_shows_weights_and_per_token_fields_as_highlight_strength():
    """A run's row colours each token with strength |weight| / the row's largest, and a method's per-token fields
    (here GTPO's token advantages) get a row each with strength |value| / the row's largest |value|."""
    from tokenrl.report.html import _run_rows

    record = {
        "tokens": ["a", "b", "c", "d"],
        "entropy": [0.1, 0.2, 0.3, 0.4],
        "js": None,
        "updated": [0, 0.5, 1, 1],
        "shaping": {"advantages": [-2.0, 1.0, 0.5, 0.0]},
    }
    html_rows = _run_rows("run gtpo", record)
    updated, advantages = html_rows.split('<div class="row">')[1:]
    assert "run gtpo: updated (75%)" in updated and "run gtpo: token advantage (75%)" in advantages
    assert [part.split(")")[0].split(",")[-1] for part in updated.split("rgba(")[1:]] == ["0.50", "1.00", "1.00"]
    assert [part.split(")")[0].split(",")[-1] for part in advantages.split("rgba(")[1:]] == ["1.00", "0.50", "0.25"]
    assert 'title="H=0.100 value=-2"' in advantages


def test_fork_tables_and_paired_differences_against_uniform_and_random(tmp_path):
    """task=forks runs log forks/*: the report adds the selection-vs-forks tables, each with Δ vs both baselines."""
    folder = tmp_path / "multirun"
    precision = {"uniform": 0.3, "random": 0.3, "ict": 0.6}
    job = 0
    for selector in ("uniform", "random", "ict"):
        for seed in (0, 1, 2):
            write_job(folder, job, selector, seed)
            path = folder / str(job) / "csv" / "metrics.csv"
            rows = list(csv.DictReader(path.open()))
            for step, row in enumerate(rows):
                row.update(
                    {
                        "forks/rate": 0.3,
                        "forks/precision": precision[selector] + 0.1 * seed,
                        "forks/recall": 1.0 if selector == "uniform" else 0.2,
                        "train/reward": 0.7 * step / 3 if selector == "ict" else 0.1,
                    }
                )
            with path.open("w", newline="") as handle:
                writer = csv.DictWriter(handle, list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            job += 1
    done = subprocess.run(
        [sys.executable, "scripts/report.py", str(folder), "--out", str(tmp_path / "out"), "--also-against", "random"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "out" / "report.md").read_text()
    table = report.split("### precision of updated tokens on true forks")[1].split("###")[0]
    assert "| group | n | mean ± 95% CI | Δ vs uniform (paired over seeds) | Δ vs random (paired over seeds) |" in table
    # ict: 0.6, 0.7, 0.8 → 0.700 ± 0.248; paired Δ vs uniform and vs random: 0.3 each seed → 0.300 ± 0.000
    assert "| ict | 3 | 0.700 ± 0.248 | 0.300 ± 0.000 (n=3) | 0.300 ± 0.000 (n=3) |" in table
    assert "| random | 3 | 0.400 ± 0.248 | 0.000 ± 0.000 (n=3) | — |" in table
    above = report.split("### precision above the fork rate")[1].split("###")[0]
    assert "| ict | 3 | 0.400 ± 0.248 | 0.300 ± 0.000 (n=3) | 0.300 ± 0.000 (n=3) |" in above  # 0.3, 0.4, 0.5
    steps = report.split("### steps to a training reward of 0.6")[1].split("###")[0]
    # ict's rewards 0, 0.233, 0.467, 0.7 never average 0.6 over 5 steps: censored at the 4 steps it ran, no mean ± CI
    assert "| ict | 3 | > 4 in 3 of 3 runs (censored); median > 4 | censored: no Δ | censored: no Δ |" in steps
    assert "--also-against random" in report


def test_each_runs_lr_is_resolved_from_its_own_config_and_shown_with_its_updated_share(tmp_path):
    """Provenance (issue #48): a run's lr is the value its saved config resolves `algorithm.optimizer.lr` to (here
    through `${forks_tuned.lr.oracle}`), shown in the runs table and report.json beside its mean select/fraction."""
    from tokenrl.report.runs import load_run
    from tokenrl.report.tables import runs_section

    folder = tmp_path / "0"
    write_job(tmp_path, 0, "oracle", 3)
    config = {
        "seed": 3,
        "total_steps": TOTAL_STEPS,
        "forks_tuned": {"lr": {"oracle": 2.0e-3}},
        "algorithm": {"optimizer": {"lr": "${forks_tuned.lr.oracle}"}},
    }
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    run = load_run(folder)
    fractions = [values["select/fraction"] for values in run.steps.values() if "select/fraction" in values]
    assert run.lr == 2.0e-3 and fractions
    assert run.updated_share == pytest.approx(sum(fractions) / len(fractions), abs=1e-12)
    assert f"| 0 |  | 3 | 0.002 | {run.updated_share:.3f} | complete |" in runs_section([run], [])
    config["algorithm"]["optimizer"]["lr"] = "${forks_tuned.lr.missing}"
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    assert math.isnan(load_run(folder).lr)  # does not resolve: nan, not a crash
