"""The memory plan (run/memory_plan.py) against `python train.py` runs: a small random model's measured peak memory at
several token budgets, and a run the plan refuses (issue #50 §9). scripts/bench/memory_plan.py measures larger models
the same way."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers.forked_cli import forked_python

pytestmark = pytest.mark.slow  # runs of train.py (README: `-m "not slow"` is the quick loop)

# Qwen2's shape with a 32,768-token vocabulary, 4 layers of width 256 (12M parameters), random weights: responses
# run to their 48-token budget like the plan's worst case, and logits, activations and the backward's gradient shares
# all weigh in the update
SMALL = [
    "model=tiny",
    "model.architecture.vocab_size=32768",
    "model.architecture.hidden_size=256",
    "model.architecture.intermediate_size=768",
    "model.architecture.num_hidden_layers=4",
    "task.max_new_tokens=48",
    "total_steps=2",  # the second step's update runs beside the optimizer's moments
    "validation.every_n_steps=0",
    "checkpoint.enabled=false",
    "samples.every_n_steps=0",
    "export.enabled=false",
    "logger=none",
    "trainer.enable_progress_bar=false",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("budget", [512, 2048])
def test_the_plan_is_within_ten_percent_of_the_measured_peak_at_two_token_budgets(tmp_path, budget):
    """The run is a process of its own (forked from one that imported tokenrl: tests/helpers/forked_cli.py); its
    summary.json holds the plan's peak and the process's peak resident memory (on CPU the plan's device is the host).
    Budgets: a few rows (44 + 48 tokens each) per micro-batch and above the whole step (one micro-batch); a budget below
    one row, each row alone, is tests/run/test_memory_plan.py's `largest_micro_batch` case (32 micro-batches here would
    cost a minute of the suite)."""
    done = forked_python(
        ["train.py", *SMALL, f"algorithm.micro_batch_tokens={budget}", f"hydra.run.dir={tmp_path}"], env=ENV
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    ratio = summary["peak_host_memory_gib"] / summary["memory_plan_peak_gib"]
    assert 0.9 <= ratio <= 1.1, ratio


def test_a_run_that_does_not_fit_shows_the_table_once_and_offers_only_what_is_off(tmp_path):
    """Qwen2.5-7B trained in full on the CPU needs far more than any host here: refused before the model loads, its
    table printed once (in the error, not also in the log before it), the advice without gradient checkpointing, which
    is on."""
    done = forked_python(
        [
            "train.py",
            "debug=default",
            "model=qwen7b",
            "model.init=random",
            "model.tokenizer=char",
            "trainer=cpu",
            "task=arithmetic",
            "model.gradient_checkpointing=true",
            f"hydra.run.dir={tmp_path}",
        ],
        env=ENV,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "more than its" in done.stderr, output[-3000:]
    assert output.count("peak ") == 1 and output.count("policy weights") == 1, output[-3000:]
    assert "gradient_checkpointing" not in output and "LoRA (model.lora)" in done.stderr
