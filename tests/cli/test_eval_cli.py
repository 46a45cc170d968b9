"""eval.py: `python eval.py` end to end (tiny model, real engine, real files), checkpoints (files and sharded folders)
loaded, its config folder.

Validation during training (evaluation/runner.py's Validator): tests/evaluation/test_evaluation_runner.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, needs_data
from tests.helpers.forked_cli import forked_python
from tokenrl.run.training import run


@pytest.mark.slow
@needs_data
def test_eval_cli_writes_results_samples_and_table(tmp_path):
    done = forked_python(
        [
            "eval.py",
            "model=tiny",
            "benchmark=[gsm8k,aime24]",
            "eval.limit=3",
            "eval.n_samples=4",
            "eval.max_new_tokens=6",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["benchmark"] for r in results] == ["gsm8k", "aime24"]
    for r in results:
        assert r["problems"] == 3 and r["n_samples"] == 4 and 0 <= r["pass@1"] <= r["pass@4"] <= 1
        lines = (tmp_path / f"{r['benchmark']}.samples.jsonl").read_text().splitlines()
        assert len(lines) == 12 and {"id", "sample", "score", "response"} <= set(json.loads(lines[0]))
    assert "| gsm8k | 3 | 4 |" in (tmp_path / "summary.md").read_text()
    assert_reproduction_record(results)


def assert_reproduction_record(results):
    """results.json says what produced each number: model, data file and its hash, prompt, sampling, engine,
    versions."""
    import hashlib

    from tokenrl.data.benchmarks import BENCHMARKS, LOCAL

    for r in results:
        record, bench = r["reproduce"], BENCHMARKS[r["benchmark"]]
        assert record["model"]["name"] == "tiny" and record["model"]["init"] == "random"
        assert record["model"]["ckpt_path"] is None and record["model"]["dtype"]
        data = record["benchmark"]
        assert data["name"] == r["benchmark"] and data["route"] == "local" and data["limit"] == 3
        assert data["file"] == str((ROOT / os.environ["TOKENRL_DATA_DIR"]).resolve() / LOCAL[r["benchmark"]])
        assert data["sha256"] == hashlib.sha256(open(data["file"], "rb").read()).hexdigest()
        prompt = record["prompt"]
        assert prompt["instruction"] == bench.instruction and prompt["template"].count("{question}") == 1
        assert prompt["template"].rstrip().endswith(bench.instruction) and prompt["max_prompt_length"] == 2048
        assert record["sampling"] == {
            **record["sampling"],
            "n": 4,
            "ks": [1, 4],
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "max_new_tokens": 6,
            "seed": 0,
        }
        assert not {"temperature", "top_p", "top_k", "max_new_tokens"} & set(record["engine"])  # one sampling setting
        assert record["engine"]["engine"] == "hf" and record["verifiers"] == [
            "gsm8k_strict" if r["benchmark"] == "gsm8k" else "math"
        ]
        versions = record["versions"]
        assert versions["torch"] == torch.__version__.split("+")[0] or versions["torch"] == torch.__version__
        assert versions["tokenrl"] and versions["transformers"] and "vllm" in versions
        assert "eval.limit=3" in record["command"] and record["date"] and "tokenrl_commit" in record


@pytest.mark.slow
@needs_data
def test_eval_greedy_is_top_k_1_and_recorded(tmp_path):
    """`eval.top_k=1` decodes greedily (what scripts/compare_harness.py compares with lm-eval): every sample of a
    problem is the same text, whatever the seed."""
    done = forked_python(
        [
            "eval.py",
            "model=tiny",
            "benchmark=gsm8k",
            "eval.limit=2",
            "eval.n_samples=4",
            "eval.max_new_tokens=8",
            "eval.top_k=1",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "results.json").read_text())[0]["reproduce"]["sampling"]["top_k"] == 1
    lines = [json.loads(line) for line in (tmp_path / "gsm8k.samples.jsonl").read_text().splitlines()]
    for problem in {line["id"] for line in lines}:
        assert len({line["response"] for line in lines if line["id"] == problem}) == 1


def one_gsm8k_problem(folder) -> str:
    """A data folder holding a one-problem gsm8k/test.jsonl: eval.py runs without the benchmark files."""
    (folder / "gsm8k").mkdir(parents=True)
    (folder / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "1+1=?", "answer": "1 and 1 #### 2"}) + "\n")
    return f"paths.data_dir={folder}"


def quick_eval(out, data: str, *overrides: str) -> list[dict]:
    """`python eval.py model=tiny` on the one problem, 2 samples of 2 tokens; its results.json."""
    done = forked_python(
        ["eval.py", "model=tiny", data, "eval.n_samples=2", "eval.ks=[1]", "eval.max_new_tokens=2", *overrides]
        + [f"hydra.run.dir={out}"]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_eval_labels_the_weights_by_what_they_are(tiny_cfg, tmp_path):
    """summary.md's title and results.json's `weights`: a checkpoint, a tokenrl export (naming the run its card
    names), another model folder (base weights) or random weights."""
    import shutil

    run_dir, data = tmp_path / "run", one_gsm8k_problem(tmp_path / "data")
    cfg = tiny_cfg("total_steps=1", "checkpoint.enabled=true", "task.verifier=tests.helpers.rewards:length_reward")
    cfg.paths.output_dir = str(run_dir)
    run(cfg)
    plain = shutil.copytree(run_dir / "model", tmp_path / "plain", ignore=shutil.ignore_patterns("README.md"))
    folder = ["model.init=pretrained", "model.tokenizer=null"]
    cases = {
        "checkpoint": ([f"ckpt_path={run_dir}/checkpoints/last.ckpt"], f"checkpoint `{run_dir}/checkpoints/last.ckpt`"),
        "export": (
            [f"model.source={run_dir}/model", *folder],
            f"`{run_dir}/model`, exported by tokenrl from the end of its training run `{run_dir}`",
        ),
        "plain": ([f"model.source={plain}", *folder], f"base weights `{plain}`"),
        "random": (["seed=3"], "random weights (seed 3)"),
    }
    for name, (overrides, label) in cases.items():
        assert quick_eval(tmp_path / name, data, *overrides)[0]["weights"] == label
        assert (tmp_path / name / "summary.md").read_text().startswith(f"# tiny: {label}, "), name


def test_results_name_the_sampling_the_run_used(tmp_path):
    """results.json's top-level sampling is what was applied: greedy for eval.top_k=1 (no temperature), else the
    temperature, top-p and top-k."""
    data = one_gsm8k_problem(tmp_path / "data")
    greedy = quick_eval(tmp_path / "greedy", data, "eval.top_k=1")[0]
    assert (greedy["decoding"], greedy["temperature"], greedy["top_p"], greedy["top_k"]) == ("greedy", None, None, 1)
    sampled = quick_eval(tmp_path / "sampled", data, "eval.temperature=0.7", "eval.top_p=0.9", "eval.top_k=5")[0]
    assert (sampled["decoding"], sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (
        "sampling",
        0.7,
        0.9,
        5,
    )


BAD_INPUTS = [
    ("benchmark=nope", "error: 1 bad setting:\n  - benchmark='nope': must be a benchmark ("),
    ("paths.data_dir=/nonexistent", "/nonexistent/gsm8k/test.jsonl does not exist: set paths.data_dir"),
    ("eval.n_samples=2", "eval.ks=[1, 4]: each k must be <= eval.n_samples=2"),
    ("eval.temperature=0", "eval.temperature=0: must be a number > 0 (greedy decoding: eval.top_k=1)"),
]


@pytest.fixture(scope="module")
def bad_input_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """`python eval.py model=tiny eval.limit=2 <override>` for every bad input, each forked from the worker's process
    that imported tokenrl once (tests/helpers/forked_cli.py)."""
    base = tmp_path_factory.mktemp("bad_inputs")
    overrides = [case.values[0] if hasattr(case, "values") else case[0] for case in BAD_INPUTS]
    return {
        override: forked_python(["eval.py", "model=tiny", "eval.limit=2", override, f"hydra.run.dir={base / str(n)}"])
        for n, override in enumerate(overrides)
    }


@pytest.mark.parametrize("override,message", BAD_INPUTS)
@pytest.mark.slow
def test_eval_bad_input_is_named(override, message, bad_input_runs):
    done = bad_input_runs[override]
    assert done.returncode == 2 and message in done.stderr, done.stderr[-3000:]


def test_eval_loads_the_policy_of_a_training_checkpoint(tiny_cfg, tmp_path):
    from tests.helpers.tiny import tiny_policy, tiny_settings
    from tokenrl.run.checkpointing import load_policy

    run(
        tiny_cfg(
            "total_steps=1",
            "checkpoint.enabled=true",
            "validation.every_n_steps=0",
            "task.verifier=tests.helpers.rewards:length_reward",
        )
    )
    model, _ = tiny_policy()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_policy(model, str(tmp_path / "checkpoints" / "last.ckpt"), tiny_settings(), seed=0)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_eval_loads_the_policy_of_a_sharded_checkpoint(tmp_path):
    """trainer=fsdp's checkpoints are folders of shards (checkpointing.AtomicFSDPStrategy); tokenrl-eval reads them
    into one process (the same policy_state_dict as a .ckpt file)."""
    from tests.helpers.tiny import tiny_policy, tiny_settings
    from tokenrl.run.checkpointing import AtomicFSDPStrategy, load_policy

    trained, _ = tiny_policy(seed=1)
    AtomicFSDPStrategy(state_dict_type="sharded").save_checkpoint(
        {"state_dict": {f"policy.{k}": v for k, v in trained.state_dict().items()}, "tokenrl": {"rollout_step": 1}},
        tmp_path / "last.ckpt",
    )
    model, _ = tiny_policy(seed=0)
    assert not torch.equal(model.state_dict()["lm_head.weight"], trained.state_dict()["lm_head.weight"])
    load_policy(model, str(tmp_path / "last.ckpt"), tiny_settings(), seed=0)
    assert all(torch.equal(value, trained.state_dict()[key]) for key, value in model.state_dict().items())


@pytest.mark.slow
def test_eval_finds_its_configs_without_importing_the_train_entry_point():
    code = (
        "import sys; import tokenrl.cli.eval as e; import tokenrl.paths as p; "
        "print(e.CONFIG_DIR == p.CONFIG_DIR, 'tokenrl.run.training' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "False"]
    from tokenrl.cli.train import CONFIG_DIR as train_config_dir
    from tokenrl.paths import CONFIG_DIR

    assert CONFIG_DIR == train_config_dir == str(ROOT / "configs")
