"""evaluation/runner.py's Validator during training: held-out pass@k logged before steps 0, N, 2N, … and after the
last, on the task's test split and on extra benchmarks with their own prompts and verifiers, with its own sampling."""

from __future__ import annotations

import csv

import pytest

from tests.conftest import DATA_DIR, needs_data
from tokenrl.run.training import run


def test_validation_is_logged_during_training(tiny_cfg):
    summary = run(
        tiny_cfg("total_steps=2", "validation.every_n_steps=1", "validation.limit=3", "validation.n_samples=4")
    )
    assert 0.0 <= summary["val/pass@1"] <= summary["val/pass@4"] <= 1.0
    assert summary["val/at_step"] == 2.0  # the last validation runs after the final update


@needs_data
def test_validation_on_extra_benchmarks_uses_their_prompts_and_verifiers(tiny_cfg):
    from tokenrl.data.benchmarks import benchmark
    from tokenrl.run.training import build_components

    cfg = tiny_cfg(
        "total_steps=1",
        "validation.every_n_steps=1",
        "validation.limit=2",
        "validation.n_samples=2",
        "validation.ks=[1,2]",
        "validation.benchmarks=[gsm8k,math500]",
        "rollout.max_prompt_length=1024",
    )
    module, _, _ = build_components(cfg)
    task_set, gsm8k, math500 = module.validator.sets
    assert (task_set.prefix, gsm8k.prefix, math500.prefix) == ("", "gsm8k/", "math500/")
    for validation_set, name in ((gsm8k, "gsm8k"), (math500, "math500")):
        bench = benchmark(name)
        assert cfg.paths.data_dir == DATA_DIR and validation_set.problems == bench.load(DATA_DIR)[:2]
        assert validation_set.instruction == bench.instruction
    assert {p.verifier for p in gsm8k.problems} == {"gsm8k_strict"} and {p.verifier for p in math500.problems} == {
        "math"
    }
    summary = run(cfg)
    for prefix in ("", "gsm8k/", "math500/"):
        assert 0.0 <= summary[f"val/{prefix}pass@1"] <= summary[f"val/{prefix}pass@2"] <= 1.0, prefix


def test_an_unknown_validation_benchmark_is_named(tiny_cfg):
    from tokenrl.run.training import build_components

    with pytest.raises(ValueError, match=r"validation.benchmarks: unknown benchmark 'math5000'; valid: .*'math500'"):
        build_components(tiny_cfg("validation.every_n_steps=1", "validation.benchmarks=[math5000]"))


def test_validation_samples_with_its_own_temperature_and_top_p(tiny_cfg):
    from tokenrl.run.training import build_components

    module, _, _ = build_components(
        tiny_cfg("validation.every_n_steps=1", "validation.top_p=0.7", "rollout.temperature=0.9")
    )
    settings = module.validator.settings
    assert (settings.temperature, settings.top_p) == (0.9, 0.7)  # follows the rollout unless set
    assert module.sampling.top_p == 1.0  # training rollouts keep theirs


def test_each_validation_is_one_csv_row(tiny_cfg, tmp_path):
    run(
        tiny_cfg(
            "total_steps=3", "validation.every_n_steps=2", "validation.limit=2", "validation.n_samples=4", "logger=csv"
        )
    )
    rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
    validations = [row for row in rows if row.get("val/pass@1")]
    assert [float(row["val/at_step"]) for row in validations] == [0.0, 2.0, 3.0]  # before 0 and 2, after the last
    assert len([row for row in rows if row.get("train/rollout_step")]) == 3
