"""`scripts/bench/gpu_step.py` runs end to end (CPU smoke: the tiny model) and writes a results file with the phases,
token rates and machine record that the GPU run reports."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_gpu_step_bench_smoke_run_writes_its_results(tmp_path):
    out = tmp_path / "gpu_step.json"
    done = subprocess.run([sys.executable, "gpu_step.py", "--device", "cpu", "--models", "tiny", "--prompts", "2",
                           "--group", "2", "--max-new-tokens", "4", "--steps", "1", "--fast-path", "off", "on",
                           "--out", str(out)],
                          cwd=ROOT / "scripts" / "bench", capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    off, result = record["results"]
    assert (off["fast_path"], result["fast_path"]) == ("off", "on")
    assert off["time/statistics"] > 0 and off["trained_tokens"] == result["trained_tokens"]
    assert result["model"] == "tiny" and result["rows"] == 4
    assert result["generated_tokens"] == 4 * 4                 # a random model runs to max_new_tokens
    assert result["trained_tokens"] > result["generated_tokens"]   # prompts are trained through too
    assert all(result[f"time/{phase}"] > 0 for phase in ("generate", "update"))
    assert {"torch", "transformers", "lightning"} <= set(record["versions"]) and "cpu_model" in record["machine"]
