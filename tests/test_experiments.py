"""Experiment presets compose and run a tiny step; the selector sweep runs as a real Hydra multirun."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CONFIG_DIR, ROOT, compose_config
from tokenrl.train import run

EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
SHRINK = ["model=tiny", "trainer=cpu", "trainer.precision=32-true", "logger=none", "total_steps=1",
          "rollout.max_new_tokens=8", "rollout.max_prompt_length=2048", "checkpoint.enabled=false",
          "trainer.enable_progress_bar=false", "algorithm.prompts_per_step=2", "task.limit=16"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_runs_one_tiny_step(name, tmp_path):
    paper = compose_config([f"experiment={name}"], output_dir=tmp_path)
    assert paper.model.name == "qwen1.5b" and paper.task._target_.endswith("BenchmarkTask")
    summary = run(compose_config([f"experiment={name}", *SHRINK], output_dir=tmp_path))
    assert summary["rollout_steps"] == 1 and summary["optimizer_steps"] == paper.algorithm.mini_batches


def test_native_bases_of_the_baselines():
    e20 = compose_config(["experiment=entropy20_dapo"])
    stapo = compose_config(["experiment=stapo_dapo"])
    ict = compose_config(["experiment=ict_paper"])
    for cfg in (e20, stapo):
        assert (cfg.algorithm.aggregation, cfg.algorithm.clip_low, cfg.algorithm.clip_high,
                cfg.algorithm.kl_coef) == ("token-mean", 0.2, 0.28, 0.0)
    assert (ict.algorithm.aggregation, ict.algorithm.clip_high, ict.algorithm.kl_coef,
            ict.selector.ratio, ict.selector.warmup_steps) == ("seq-mean-token-mean", 0.2, 0.001, 0.1, 20)


def test_selector_sweep_multirun_logs_diagnostics(tmp_path):
    selectors = ["uniform", "ict", "entropy20", "stapo", "random"]
    done = subprocess.run(
        [sys.executable, "train.py", "-m", f"selector={','.join(selectors)}", "model=tiny", "logger=csv",
         "total_steps=2", "rollout.max_new_tokens=10", "checkpoint.enabled=false", "diagnostics.js=true",
         "trainer.enable_progress_bar=false", f"hydra.sweep.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for job, selector in enumerate(selectors):
        rows = list(csv.DictReader((tmp_path / str(job) / "csv" / "metrics.csv").open()))
        logged = [r for r in rows if r.get("select/fraction")]
        assert len(logged) == 2, selector
        for key in ("select/p_selected", "select/entropy_selected", "select/renyi2_all", "select/js_q50",
                    "select/jaccard_entropy20", "select/jaccard_stapo"):
            assert logged[-1][key] != "", (selector, key)
        overrides = (tmp_path / str(job) / ".hydra" / "overrides.yaml").read_text()
        assert f"selector={selector}" in overrides


def test_ict_after_warmup_trains_on_about_ten_percent(tiny_cfg):
    summary = run(tiny_cfg("selector=ict", "selector.warmup_steps=0", "total_steps=2", "rollout.max_new_tokens=40",
                           "task.verifier=tests.helpers.rewards:length_reward"))
    assert 0.09 <= summary["select/fraction"] <= 0.2   # ⌈0.1·T_i⌉ per response
    assert summary["select/jaccard_entropy20"] < 1.0
