"""`scripts/bench/gpu_step.py` runs end to end (a CPU smoke run of a Qwen preset with one layer) and writes a results
file with the phases, token rates and machine record that the GPU run reports."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import ROOT
from tests.helpers.forked_cli import forked_python

pytestmark = pytest.mark.slow  # multi-process runs (README: `-m "not slow"` is the quick loop)


def test_gpu_step_bench_runs_a_qwen_preset_offline_and_writes_its_results(tmp_path):
    """The Qwen2.5-0.5B preset with one decoder layer, random weights and the character tokenizer needs no Hub (GPU
    machines are often offline); the fast path off, then on, each in a process of its own; the results file holds the
    phases, token rates and machine record that the GPU run reports. The script itself is forked from the worker's
    server (tests/helpers/forked_cli.py: it only starts the variants and writes the file, one fresh start-up fewer);
    each variant, which builds the model, is the fresh `python` the script starts, with the offline environment."""
    out = tmp_path / "gpu_step.json"
    done = forked_python(
        [
            "gpu_step.py",
            "--device",
            "cpu",
            "--models",
            "qwen0.5b",
            "--layers",
            "1",
            "--prompts",
            "1",
            "--group",
            "2",
            "--max-new-tokens",
            "4",
            "--prompt-tokens",
            "100",
            "--steps",
            "1",
            "--fast-path",
            "off",
            "on",
            "--out",
            str(out),
        ],
        cwd=ROOT / "scripts" / "bench",
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty_hf_home")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    off, result = record["results"]
    assert (off["fast_path"], result["fast_path"]) == ("off", "on")
    assert off["time/statistics"] > 0 and off["trained_tokens"] == result["trained_tokens"]
    assert result["model"] == "qwen0.5b" and result["rows"] == 2
    assert result["parameters"] > 136_000_000  # the 151,936-token embedding
    assert result["generated_tokens"] == 2 * 4  # a random model runs to max_new_tokens
    prompt = result["trained_tokens"] / result["rows"] - 4
    assert 100 <= prompt <= 170  # ≈ 100 of preamble and the question, in the character tokenizer's own tokens
    assert all(result[f"time/{phase}"] > 0 for phase in ("generate", "update"))
    assert {"torch", "transformers", "lightning"} <= set(record["versions"]) and "cpu_model" in record["machine"]
    assert off["pid"] != result["pid"]  # each variant in a process of its own
