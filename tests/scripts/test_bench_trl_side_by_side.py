"""`scripts/bench/trl_side_by_side.py`: the step it gives both sides is the same one (tokenrl's overrides name the
GRPO settings TRL is given), and, where TRL is installed (an optional benchmark dependency), one step on each side
of a tiny random model does the same work: the same prompts' token ids, prompts x group completions, at most the
same number of new tokens, one optimizer step and a loss."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.conftest import ROOT
from tests.helpers.forked_cli import forked_python
from tests.helpers.scripts import load_script

BENCH = ROOT / "scripts" / "bench"


def load_side_by_side():
    return load_script("scripts/bench/trl_side_by_side.py")


def test_tokenrl_side_is_plain_grpo_without_kl_as_trl_is_configured():
    script = load_side_by_side()
    settings = {
        "device": "cuda",
        "engine": "vllm",
        "preset": "qwen0.5b",
        "folder": "/m",
        "data": "/d.jsonl",
        "instruction": "Put the final answer after ####.",
        "max_new_tokens": 256,
        "max_model_len": 4096,
        "prompts": 16,
        "group": 8,
        "micro_batch": 8,
        "lr": 1e-6,
        "seed": 0,
        "steps": 2,
        "workdir": "/w",
    }
    overrides = script.tokenrl_overrides(settings)
    for expected in (
        "selector=uniform",
        "algorithm.kl_coef=0",
        "algorithm.aggregation=seq-mean-token-mean",  # TRL's loss_type="grpo"
        "algorithm.adv_eps=1e-4",  # TRL's std epsilon
        "model.gradient_checkpointing=false",
        "model.dtype=fp32",
        "trainer=gpu",  # bf16 autocast over fp32 weights, as TRL's bf16=True over an fp32 model
        "rollout=vllm_gpu",
        "algorithm.prompts_per_step=16",
        "algorithm.group_size=8",
        "algorithm.micro_batch_size=8",
        "task.max_new_tokens=256",
    ):
        assert expected in overrides
    assert "rollout=hf" in script.tokenrl_overrides({**settings, "engine": "hf"})
    assert "rollout=vllm" in script.tokenrl_overrides({**settings, "device": "cpu"})
    assert script.is_shape("qwen0.5b") and script.is_shape("tiny") and not script.is_shape(str(ROOT))


def test_prompts_compared_as_rows_per_step():
    script = load_side_by_side()

    def run(*steps):
        return {"steps": [{"work": {"prompt_ids": ids}} for ids in steps]}

    same = {"runs": {"tokenrl": run([[1, 2], [3]]), "trl": run([[3], [1, 2]])}}
    other = {"runs": {"tokenrl": run([[1, 2], [3]]), "trl": run([[3], [1, 4]])}}
    assert script.same_prompts([same]) and not script.same_prompts([same, other])


@pytest.mark.slow  # two fresh processes, each a Lightning or a transformers Trainer run
def test_one_step_each_side_does_the_same_work(tmp_path):
    pytest.importorskip("trl")  # optional: the benchmark's own dependency, not the project's (CI has none)
    out = tmp_path / "side_by_side.json"
    done = forked_python(
        [
            "trl_side_by_side.py",
            "--device",
            "cpu",
            "--engine",
            "hf",
            "--model",
            "tiny",
            "--prompts",
            "2",
            "--group",
            "4",
            "--max-new-tokens",
            "6",
            "--micro-batch",
            "4",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--out",
            str(out),
        ],
        cwd=BENCH,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty_hf_home")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["same_prompt_ids"] is True
    (run,) = record["rounds"]
    assert run["order"] == ["tokenrl", "trl"]
    for framework in ("tokenrl", "trl"):
        side = run[framework]
        assert (side["rows"], side["prompts"], side["optimizer_steps"]) == (8, 2, 1)
        assert 0 < side["longest_completion"] <= 6 and side["completion_tokens"] <= 8 * 6
        assert math.isfinite(side["loss"])
        assert side["step_s"] >= side["generate_s"] > 0 and side["update_s"] > 0 and side["peak_rss_gib"] > 0
    assert run["tokenrl"]["prompt_tokens"] == run["trl"]["prompt_tokens"]
    assert {"torch", "transformers", "trl"} <= set(record["versions"]) and "cpu_model" in record["machine"]
    assert set(record["summary"]["ratios"]) == {"generate", "reward", "sync", "update", "step", "memory"}
