"""scripts/forks_choose.py on fabricated tuning sweeps: each arm's lr, the oracle's budget and ICT's matching ratio."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, compose_config

# held-out pass@1 after training per (arm, lr) on the validation graph
PASS1 = {
    ("uniform", 5e-4): 0.50,
    ("uniform", 1e-3): 0.70,
    ("uniform", 2e-3): 0.60,
    ("oracle", 5e-4): 0.40,
    ("oracle", 1e-3): 0.80,
    ("oracle", 2e-3): 0.80,  # a tie: the smaller lr
    ("ict", 5e-4): 0.55,
    ("ict", 1e-3): 0.45,
}
LENGTHS = [4, 5, 6]  # the oracle's recorded responses
BUDGET = 0.32  # the oracle's select/fraction


def write_tune_job(folder, job, arm, lr, seed=1000, complete=True, pass1=None, before=None):
    run = folder / str(job)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "total_steps": 2}))
    overrides = [f"forks_arm={arm}", f"algorithm.optimizer.lr={lr}", f"seed={seed}"]
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / "csv").mkdir()
    fields = ["train/rollout_step", "train/reward", "select/fraction", "val/at_step", "val/pass@1"]
    with (run / "csv" / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        fraction = BUDGET if arm == "oracle" else 1.0
        writer.writerow({"train/rollout_step": 1, "train/reward": 0.1, "select/fraction": fraction - 0.02})
        writer.writerow({"train/rollout_step": 2, "train/reward": 0.2, "select/fraction": fraction + 0.02})
        if before is not None:  # a validation before step 1: the curve's first point
            writer.writerow({"val/at_step": 0, "val/pass@1": before})
        writer.writerow({"val/at_step": 2, "val/pass@1": PASS1[arm, lr] if pass1 is None else pass1})
    if complete:
        (run / "summary.json").write_text(json.dumps({"rollout_steps": 2}))
    (run / "samples").mkdir()
    records = [{"tokens": ["x"] * t, "updated": [1] * t} for t in LENGTHS]
    (run / "samples" / "step_0001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def choose(*args):
    return subprocess.run(
        [sys.executable, "scripts/forks_choose.py", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def brute_force_ratio(budget, lengths):
    best = None
    for i in range(1, 100):
        r = i / 100
        share = sum(max(1, math.ceil(round(r * t, 9))) for t in lengths) / sum(lengths)
        if best is None or abs(share - budget) < best[0] - 1e-15:
            best = (abs(share - budget), r)
    return best[1]


def test_two_stages_choose_each_arms_lr_the_budget_and_the_ratio(tmp_path):
    stage1, stage2, out = tmp_path / "t1", tmp_path / "t2", tmp_path / "tuned.yaml"
    job = 0
    for arm in ("uniform", "oracle"):
        for lr in (5e-4, 1e-3, 2e-3):
            write_tune_job(stage1, job, arm, lr)
            job += 1
    write_tune_job(stage1, job, "uniform", 5e-4, seed=1001, complete=False)  # incomplete: left out
    done = choose(stage1, "--out", out)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(out.read_text())
    assert config["lr"]["uniform"] == 1e-3 and config["lr"]["oracle"] == 1e-3  # the tie went to the smaller lr
    assert config["budget"] == pytest.approx(BUDGET)
    # ⌈r·T⌉ over T = 4, 5, 6: r = 0.21 keeps 1 + 2 + 2 of 15 tokens (0.333), the closest to 0.32
    assert config["ratio"] == brute_force_ratio(BUDGET, LENGTHS) == 0.21
    assert config["tuned"] is False and config["chosen_arms"] == ["oracle", "uniform"]
    assert config["grid"]["uniform"][5e-4] == [0.5, 1]
    untuned = yaml.safe_load((ROOT / "configs" / "forks_tuned" / "untuned.yaml").read_text())
    assert set(untuned) <= set(config) and set(untuned["lr"]) == set(config["lr"])  # every key the arms read
    assert config["lr"]["ict"] == untuned["lr"]["ict"]  # not tuned yet: the placeholder
    for job, lr in enumerate((5e-4, 1e-3)):
        write_tune_job(stage2, job, "ict", lr)
    done = choose(stage1, stage2, "--out", out)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(out.read_text())
    assert config["lr"]["ict"] == 5e-4 and config["ratio"] == 0.21 and config["lr"]["uniform"] == 1e-3
    assert (
        config["tuned"] is False
        and "still untuned: entropy20, ict_warmup, matched_random, oracle_forced, random" in done.stdout
    )
    assert "# Written by scripts/forks_choose.py" in out.read_text()


def test_the_curve_auc_over_graphs_chooses_and_an_edge_winner_is_named(tmp_path):
    """--metric pass@1_auc: per (arm, lr) the mean over the graphs of (before + after) / 2 (two validations: the
    trapezoid's mean height), by hand; an arm whose winner is its grid's largest lr is named and not `tuned`."""
    folder, out = tmp_path / "t1", tmp_path / "mechanism.yaml"
    values = {}  # (arm, lr, seed) -> (before, after)
    job = 0
    for arm in ("uniform", "oracle"):
        for lr in (5e-4, 1e-3, 2e-3):
            for seed in (1000, 1001, 1002):
                before, after = 0.1 * (seed - 999), 0.3 + 0.1 * ((job * 7) % 5)
                values[arm, lr, seed] = (before, after)
                write_tune_job(folder, job, arm, lr, seed=seed, pass1=after, before=before)
                job += 1
    done = choose(folder, "--metric", "pass@1_auc", "--arms", "uniform", "oracle", "--out", out)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(out.read_text())
    for arm in ("uniform", "oracle"):
        auc = {lr: sum(sum(values[arm, lr, s]) / 2 for s in (1000, 1001, 1002)) / 3 for lr in (5e-4, 1e-3, 2e-3)}
        best = min(auc, key=lambda lr: (-auc[lr], lr))
        assert config["lr"][arm] == best
        assert config["grid"][arm][best] == [pytest.approx(auc[best], abs=1e-6), 3]
        assert (arm in config["edge"]) == (best in (5e-4, 2e-3))
    assert config["tuned"] is (not config["edge"]) and config["metric"] == "pass@1_auc"
    assert ("extend the grid past it" in done.stdout) == bool(config["edge"])


def test_the_difficulty_scan_ranks_graphs_and_picks_three_that_span_them(tmp_path):
    folder = tmp_path / "scan"
    auc = {1000 + i: value for i, value in enumerate((0.9, 0.2, 0.5, 0.7, 0.1, 0.6, 0.3, 0.8, 0.4))}
    for job, (seed, value) in enumerate(auc.items()):
        write_tune_job(folder, job, "uniform", 1e-3, seed=seed, pass1=value, before=value)
    done = choose("--difficulty", folder, "--metric", "pass@1_auc")
    assert done.returncode == 0, done.stderr
    ranked = sorted(auc, key=auc.get)  # hardest first: 0.1, 0.2, ..., 0.9
    assert done.stdout.strip().splitlines()[-1] == f"tune on: seed={ranked[1]},{ranked[4]},{ranked[7]}"
    assert [auc[s] for s in (ranked[1], ranked[4], ranked[7])] == [0.2, 0.5, 0.8]


def test_a_sweep_without_the_tuning_overrides_is_one_error_line(tmp_path):
    folder = tmp_path / "sweep"
    write_tune_job(folder, 0, "uniform", 1e-3)
    (folder / "0" / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["selector=uniform"]))
    done = choose(folder, "--out", tmp_path / "tuned.yaml")
    assert done.returncode == 2 and done.stderr.startswith("error: no complete run with forks_arm")


def test_the_study_and_its_tuning_stage_compose_as_designed():
    """Seed = graph (and warm-up); ≥ 200 steps, one optimizer step; the arms read forks_tuned; the tuning stage's
    graph is none of the study's; the contrasts of §4 are pre-registered."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.conftest import CONFIG_DIR

    study = compose_config(["experiment=forks_oracle", "seed=7", "forks_arm=ict"])
    assert (study.task.seed, study.task.warmup.seed, study.total_steps, study.algorithm.mini_batches) == (7, 7, 200, 1)
    assert study.selector_ratio == study.forks_tuned.ratio and study.selector.warmup_steps == 0
    assert compose_config(["experiment=forks_oracle", "forks_arm=ict_warmup"]).selector.warmup_steps == 20
    entropy = compose_config(["experiment=forks_oracle", "forks_arm=entropy20"])
    assert entropy.selector.ratio == entropy.forks_tuned.budget
    assert list(study.report.contrasts) == [
        "oracle-matched_random",
        "oracle-uniform",
        "ict-random",
        "ict-uniform",
        "entropy20-random",
    ]
    GlobalHydra.instance().clear()
    params = {}
    for name in ("forks_oracle", "forks_oracle_tune"):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(config_name="train", overrides=[f"experiment={name}"], return_hydra_config=True)
        params[name] = {k: str(v) for k, v in cfg.hydra.sweeper.params.items()}
        GlobalHydra.instance().clear()
    study_graphs = params["forks_oracle"]["seed"].split(",")
    assert len(study_graphs) >= 12 and params["forks_oracle_tune"]["seed"] not in study_graphs
    mechanism_only = {"oracle_forced", "uniform_at_oracle_lr", "oracle_at_uniform_lr"}
    arms = sorted(p.stem for p in (ROOT / "configs" / "forks_arm").glob("*.yaml") if p.stem not in mechanism_only)
    assert sorted(params["forks_oracle"]["forks_arm"].split(",")) == arms
    tune = compose_config(["experiment=forks_oracle_tune"])
    assert tune.task.seed == 1000 and tune.total_steps == study.total_steps and tune.report is None


def test_the_mechanism_study_holds_its_arms_swaps_and_new_graphs():
    """experiment=forks_mechanism (issue #48): the swaps read the other arm's tuned lr, oracle_forced adds the forced
    positions, the 32 graphs are none the earlier study or any tuning used, every arm is swept and contrasted."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.conftest import CONFIG_DIR

    def arm(name):
        return compose_config(["experiment=forks_mechanism", f"forks_arm={name}"])

    lr = arm("uniform").forks_tuned.lr
    assert arm("uniform_at_oracle_lr").algorithm.optimizer.lr == lr.oracle
    assert arm("uniform_at_oracle_lr").selector._target_.endswith("UniformSelector")
    assert arm("oracle_at_uniform_lr").algorithm.optimizer.lr == lr.uniform
    assert arm("oracle_at_uniform_lr").selector._target_.endswith("ForksOracleSelector")
    forced, oracle = arm("oracle_forced"), arm("oracle")
    assert forced.selector.with_forced is True and oracle.selector.with_forced is False
    assert forced.report.primary == "pass@1_auc" and forced.validation.every_n_steps == 25
    params = {}
    for name in ("forks_mechanism", "forks_mechanism_tune", "forks_oracle"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(config_name="train", overrides=[f"experiment={name}"], return_hydra_config=True)
        params[name] = {k: str(v) for k, v in cfg.hydra.sweeper.params.items()}
    GlobalHydra.instance().clear()
    assert params["forks_mechanism"]["seed"] == "range(100,132)"
    graphs = set(range(100, 132))
    assert not graphs & {int(s) for s in params["forks_oracle"]["seed"].split(",")}
    assert not graphs & {int(s) for s in params["forks_mechanism_tune"]["seed"].split(",")}
    arms = params["forks_mechanism"]["forks_arm"].split(",")
    contrasted = {side for text in oracle.report.contrasts for side in text.split("-", 1)}
    assert set(arms) == contrasted and len(arms) == 7 and len(oracle.report.contrasts) == 8
