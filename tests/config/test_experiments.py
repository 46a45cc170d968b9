"""Experiment presets compose and run a tiny step; the selector sweep runs as a real Hydra multirun."""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from tests.conftest import CONFIG_DIR, ROOT, compose_config, needs_data
from tests.helpers.forked_cli import forked_python
from tokenrl.run.training import run

EXPERIMENTS = sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
SHRINK = [
    "model=tiny",
    "rollout=hf",
    "trainer=cpu",
    "trainer.precision=32-true",
    "logger=none",
    "total_steps=1",
    "rollout.max_new_tokens=8",
    "rollout.max_prompt_length=2048",
    "checkpoint.enabled=false",
    "trainer.enable_progress_bar=false",
    "algorithm.prompts_per_step=2",
    "validation.every_n_steps=0",
    "samples.every_n_steps=1",
    "selector_warmup_steps=0",
]  # the one step selects (a Θ >= total_steps is refused at start-up)
# what each paper setting must pin: model, training data, selector class
SETTINGS = {
    "cpu_study": ("smollm2_135m", "ArithmeticTask", "UniformSelector"),
    "entropy20_dapo": ("qwen1.5b", "BenchmarkTask", "Entropy20Selector"),
    "stapo_dapo": ("qwen1.5b", "BenchmarkTask", "STAPOSelector"),
    "ict_paper": ("qwen1.5b", "BenchmarkTask", "ICTSelector"),
    "ict_gsm8k_qwen0.5b": ("qwen0.5b", "BenchmarkTask", "ICTSelector"),
    "ict_gsm8k_qwen1.5b": ("qwen1.5b", "BenchmarkTask", "ICTSelector"),
    "ict_gsm8k_qwen7b": ("qwen7b", "BenchmarkTask", "ICTSelector"),
    "selector_comparison": ("qwen1.5b", "BenchmarkTask", "ICTSelector"),
    "ict_ratio_ablation": ("qwen1.5b", "BenchmarkTask", "ICTSelector"),
    "ict_warmup_ablation": ("qwen1.5b", "BenchmarkTask", "ICTSelector"),
    "ict_complement_ablation": ("qwen1.5b", "BenchmarkTask", "ICTSelector"),
    "token_methods": ("smollm2_135m", "ArithmeticTask", "UniformSelector"),
    "token_methods_gpu": ("qwen1.5b", "BenchmarkTask", "ICTSelector"),
    "forks_study": ("forks_tiny", "ForksTask", "UniformSelector"),
    "forks_oracle": ("forks_tiny", "ForksTask", "UniformSelector"),
    "forks_oracle_tune": ("forks_tiny", "ForksTask", "UniformSelector"),
    "forks_mechanism": ("forks_tiny", "ForksTask", "UniformSelector"),
    "forks_mechanism_tune": ("forks_tiny", "ForksTask", "UniformSelector"),
}
# forks_oracle's tuning stage: docs/forks.md lists it beside the study; the README lists studies with results
NOT_IN_README = {"forks_oracle_tune", "forks_mechanism_tune"}
FORKS_ARMS = "uniform,oracle,matched_random,ict,random,entropy20,ict_warmup"
METHODS = (
    "uniform,random,ict,entropy20,stapo,entropy_bonus,entropy_adaptive,ict_entropy_bonus,clip_cov,kl_cov,archer,gtpo,"
    "dr_grpo,gspo,cispo,kl_k1,kl_k2,dppo,sapo,gspo_seq,icepop"
)
SWEEPS = {
    "cpu_study": {"selector": "uniform,ict,entropy20,stapo,random", "seed": "0,1,2"},
    "selector_comparison": {"selector": "uniform,ict,entropy20,stapo,random", "seed": "0,1,2,3,4"},
    "ict_ratio_ablation": {"selector_ratio": "0.05,0.1,0.2,0.3", "seed": "0,1,2"},
    "ict_warmup_ablation": {"selector_warmup_steps": "10,20,40", "seed": "0,1,2"},
    "ict_complement_ablation": {"selector": "ict,ict_complement", "seed": "0,1,2"},
    "token_methods": {
        "method": "uniform,gspo,kl_cov,clip_cov,archer,dppo,sapo,gspo_seq,cispo,icepop,ict,random,entropy20,"
        "stapo,entropy_bonus,entropy_adaptive,ict_entropy_bonus,gtpo,dr_grpo,kl_k1,kl_k2",
        "seed": "0,1,2",
    },
    "token_methods_gpu": {"method": METHODS, "seed": "0,1,2,3,4"},
    "forks_study": {
        "method": "uniform,random,ict,entropy20,stapo,dppo,sapo,gspo_seq,kl_cov,clip_cov,gspo,archer,cispo,"
        "gtpo,dr_grpo,entropy_bonus,entropy_adaptive,ict_entropy_bonus,icepop,kl_k1,kl_k2",
        "seed": "0,1,2,3,4",
    },
    "forks_oracle": {"forks_arm": FORKS_ARMS, "seed": "0,1,2,3,4,5,6,7,8,9,10,11"},
    "forks_oracle_tune": {
        "forks_arm": "uniform,oracle,matched_random",
        "algorithm.optimizer.lr": "5.0e-4,1.0e-3,2.0e-3",
        "seed": "1000",
    },
    "forks_mechanism": {
        "forks_arm": "uniform,oracle,oracle_forced,matched_random,ict,uniform_at_oracle_lr,oracle_at_uniform_lr",
        "seed": "range(100,132)",
    },
    "forks_mechanism_tune": {
        "forks_arm": "uniform,oracle,oracle_forced,matched_random",
        "algorithm.optimizer.lr": "2.5e-4,5.0e-4,1.0e-3,2.0e-3,4.0e-3",
        "seed": "1005,1001,1007",
    },
}


def sweep_params(name: str) -> dict[str, str]:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={name}"], return_hydra_config=True)
    return {key: str(value) for key, value in (cfg.hydra.sweeper.params or {}).items()}


@pytest.mark.parametrize("name", ["forks_study", "token_methods", "token_methods_gpu"])
def test_the_method_sweeps_run_every_method_preset(name):
    presets = {p.stem for p in (Path(CONFIG_DIR) / "method").glob("*.yaml")}
    assert set(SWEEPS[name]["method"].split(",")) == presets


def test_every_experiment_file_is_listed():
    assert sorted(SETTINGS) == EXPERIMENTS
    readme = (ROOT / "README.md").read_text()
    sweeps = (ROOT / "docs" / "sweeps.md").read_text()
    for name in EXPERIMENTS:
        assert f"`{name}`" in sweeps, f"experiment {name} is missing from docs/sweeps.md's table"
        if name not in NOT_IN_README:
            assert f"`{name}`" in readme, f"experiment {name} is missing from the README table"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_what_its_paper_setting_pins(name):
    paper = compose_config([f"experiment={name}"])
    model, task, selector = SETTINGS[name]
    assert (paper.model.name, paper.task._target_.rsplit(".", 1)[-1]) == (model, task)
    assert paper.selector._target_.endswith(selector)
    assert sweep_params(name) == SWEEPS.get(name, {})


@pytest.mark.parametrize(
    "name",  # a benchmark task trains a step on GSM8K train: the benchmark files
    [pytest.param(name, marks=needs_data) if SETTINGS[name][1] == "BenchmarkTask" else name for name in EXPERIMENTS],
)
def test_experiment_runs_one_tiny_step(name, tmp_path):
    paper = compose_config([f"experiment={name}"], output_dir=tmp_path)
    task = SETTINGS[name][1]
    smaller_task = "task.limit=16" if task == "BenchmarkTask" else "task.train_size=16"
    if task == "ForksTask":  # a two-step warm-up, cached in the test's folder
        smaller_task += f" task.warmup.steps=2 paths.model_cache={tmp_path / 'models'}"
    shaping = ["algorithm.overlong_buffer=4"] if paper.algorithm.overlong_buffer else []  # within the 8 tokens
    if paper.algorithm.filter_groups:  # one round of as many prompts as the step trains on
        shaping += ["algorithm.gen_prompts_per_step=2", "algorithm.max_gen_rounds=1"]
    summary = run(compose_config([f"experiment={name}", *SHRINK, *smaller_task.split(), *shaping], output_dir=tmp_path))
    assert summary["rollout_steps"] == 1 and summary["optimizer_steps"] == paper.algorithm.mini_batches
    assert (tmp_path / "samples" / "step_0001.jsonl").is_file()


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_every_swept_value_composes(name):
    for key, values in SWEEPS[name].items():
        bounds = re.fullmatch(r"range\((\d+),(\d+)\)", values)  # Hydra's range(a,b): its first and last value
        for value in [bounds[1], str(int(bounds[2]) - 1)] if bounds else values.split(","):
            cfg = compose_config([f"experiment={name}", f"{key}={value}"])
            if key == "selector":
                assert cfg.selector._target_ == compose_config([f"selector={value}"]).selector._target_
            elif key == "selector_warmup_steps":
                assert cfg.selector.warmup_steps == int(value)  # reaches the selector via ${selector_warmup_steps}
            elif key == "selector_ratio":
                assert cfg.selector.ratio == float(value)  # reaches the selector via ${selector_ratio}
            elif key == "forks_arm":  # the arm's selector (configs/forks_arm/<arm>.yaml: override /selector)
                arm = yaml.safe_load((Path(CONFIG_DIR) / "forks_arm" / f"{value}.yaml").read_text())
                selector = arm["defaults"][0]["override /selector"]
                assert cfg.selector._target_ == compose_config([f"selector={selector}"]).selector._target_
            elif key == "method":  # the method's selector wins over the experiment's
                method = compose_config([f"method={value}"])
                assert cfg.selector._target_ == method.selector._target_
                assert cfg.algorithm.policy_loss == method.algorithm.policy_loss
            elif key == "algorithm.optimizer.lr":
                assert OmegaConf.select(cfg, key) == float(value)
            else:
                assert str(OmegaConf.select(cfg, key)) == value


def test_native_bases_of_the_baselines():
    e20 = compose_config(["experiment=entropy20_dapo"])
    stapo = compose_config(["experiment=stapo_dapo"])
    ict = compose_config(["experiment=ict_paper"])
    for cfg in (e20, stapo):
        assert (cfg.algorithm.aggregation, cfg.algorithm.clip_low, cfg.algorithm.clip_high, cfg.algorithm.kl_coef) == (
            "token-mean",
            0.2,
            0.28,
            0.0,
        )
    for cfg in (
        e20,
        stapo,
    ):  # both recipes: lr 1e-6 after 10 warm-up steps, grad clip 1.0 (docs/algorithms.md §3.2, §4.5)
        assert (cfg.algorithm.optimizer.lr, cfg.algorithm.lr_warmup_steps, cfg.algorithm.grad_clip) == (1e-6, 10, 1.0)
    assert (e20.algorithm.prompts_per_step, e20.algorithm.group_size, e20.algorithm.mini_batches) == (512, 16, 16)
    assert (
        e20.algorithm.filter_groups,
        e20.algorithm.gen_prompts_per_step,
        e20.algorithm.max_gen_rounds,
        e20.algorithm.dual_clip,
    ) == ("acc", 3 * 512, 10, 10.0)
    assert list(e20.validation.benchmarks) == ["math500", "aime24"]
    assert stapo.algorithm.filter_groups is None  # STAPO's base runs without dynamic sampling (§4.5)
    assert (e20.algorithm.optimizer.weight_decay, e20.validation.top_p, e20.selector.ratio) == (0.1, 0.7, 0.2)
    assert e20.algorithm.overlong_buffer / e20.rollout.max_new_tokens == pytest.approx(4096 / 20480, abs=1e-3)
    assert (stapo.algorithm.prompts_per_step, stapo.algorithm.group_size, stapo.algorithm.mini_batches) == (256, 8, 4)
    assert (
        ict.algorithm.aggregation,
        ict.algorithm.clip_high,
        ict.algorithm.kl_coef,
        ict.algorithm.kl_estimator,
        ict.selector.ratio,
        ict.selector.warmup_steps,
    ) == ("seq-mean-token-mean", 0.2, 0.001, "low_var_kl", 0.1, 20)


SELECTORS = ["uniform", "ict", "entropy20", "stapo", "random"]
DIAGNOSTICS = (
    "select/p_selected",
    "select/entropy_selected",
    "select/renyi2_all",
    "select/js_q50",
    "select/jaccard_entropy20",
    "select/jaccard_stapo",
)


def logged_diagnostics(run_dir: Path) -> list[dict[str, str]]:
    """The CSV logger's rows of a run that carry the selection diagnostics."""
    return [row for row in csv.DictReader((run_dir / "csv" / "metrics.csv").open()) if row.get("select/fraction")]


@pytest.mark.parametrize("selector", SELECTORS)
def test_every_selector_logs_every_diagnostic_each_step(tiny_cfg, tmp_path, selector):
    run(
        tiny_cfg(
            f"selector={selector}", "logger=csv", "total_steps=2", "rollout.max_new_tokens=10", "diagnostics.js=true"
        )
    )
    logged = logged_diagnostics(tmp_path)
    assert len(logged) == 2
    assert all(logged[-1][key] != "" for key in DIAGNOSTICS), logged[-1]


@pytest.mark.slow
def test_selector_sweep_multirun_logs_diagnostics(tmp_path):
    """A real Hydra multirun over selectors: each job's own folder, overrides and diagnostics (every selector's
    diagnostics in one process: the test above). With `launcher=local` (the fresh-process launcher, 2 jobs side by
    side): each job in a fresh process, and each parallel slot sees its own one of the parent's CUDA_VISIBLE_DEVICES."""
    selectors = ["ict", "stapo"]
    done = forked_python(
        [
            "train.py",
            "-m",
            f"selector={','.join(selectors)}",
            "model=tiny",
            "logger=csv",
            "launcher=local",
            "total_steps=2",
            "rollout.max_new_tokens=10",
            "checkpoint.enabled=false",
            "diagnostics.js=true",
            "trainer.enable_progress_bar=false",
            f"hydra.sweep.dir={tmp_path}",
        ],
        timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "5,7"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Launching 2 jobs, 2 at a time, each in a fresh process" in done.stdout + done.stderr
    seen = {
        line.split("CUDA_VISIBLE_DEVICES=")[1].strip()
        for job in ("0", "1")
        for line in (tmp_path / job / "train.log").read_text().splitlines()
        if "CUDA_VISIBLE_DEVICES=" in line
    }
    assert seen == {"5", "7"}
    for job, selector in enumerate(selectors):
        logged = logged_diagnostics(tmp_path / str(job))
        assert len(logged) == 2, selector
        assert all(logged[-1][key] != "" for key in DIAGNOSTICS), (selector, logged[-1])
        overrides = (tmp_path / str(job) / ".hydra" / "overrides.yaml").read_text()
        assert f"selector={selector}" in overrides


def test_ict_after_warmup_trains_on_about_ten_percent(tiny_cfg):
    summary = run(
        tiny_cfg(
            "selector=ict",
            "selector_warmup_steps=0",
            "total_steps=2",
            "rollout.max_new_tokens=40",
            "task.verifier=tests.helpers.rewards:length_reward",
        )
    )
    assert 0.09 <= summary["select/fraction"] <= 0.2  # ⌈0.1·T_i⌉ per response
    assert summary["select/jaccard_entropy20"] < 1.0


def test_slurm_launcher_config_composes():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            config_name="train",
            overrides=["experiment=selector_comparison", "launcher=slurm", "hydra.launcher.partition=gpu"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.partition, launcher.gpus_per_node, launcher.tasks_per_node) == ("gpu", 1, 1)
    assert cfg.hydra.sweeper.params.seed == "0,1,2,3,4"
    assert cfg.ckpt_path == "auto" and launcher.signal_delay_s >= 120  # a requeued job resumes from its last.ckpt


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_gpu_preset_rolls_out_with_vllm_and_cuda_graphs(name):
    """A GPU preset with the `hf` engine would run one `generate` over thousands of sequences (terabytes of KV
    cache)."""
    cfg = compose_config([f"experiment={name}"])
    if cfg.trainer.accelerator != "gpu":
        return
    assert cfg.rollout.engine == "vllm", name
    assert not cfg.rollout.enforce_eager and cfg.rollout.enable_chunked_prefill and cfg.rollout.sleep_level == 2, name
