"""run/progress.py: one log line per rollout step (step k/N, reward, accuracy, entropy, selected fraction, time by
phase), in the console and in the run's train.log as it happens, also when the output is not a terminal."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time

import lightning as L
import pytest

from tests.conftest import ROOT
from tokenrl.run.training import build_components

LINE = re.compile(
    r"step (\d+)/(\d+) \| reward (\S+) \| acc (\S+) \| entropy (\S+) \| selected (\S+) \| "
    r"(\S+) s \(generate \S+, reward \S+, statistics \S+, update \S+, sync \S+\)"
)


class Recorder(L.Callback):
    def __init__(self) -> None:
        self.metrics: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.metrics.append({key: float(value) for key, value in trainer.callback_metrics.items()})


def test_one_line_per_rollout_step_with_the_steps_numbers(tiny_cfg, caplog):
    caplog.set_level(logging.INFO, logger="tokenrl.run.progress")
    L.seed_everything(0)
    module, datamodule, trainer = build_components(
        tiny_cfg("total_steps=3", "task.verifier=tests.helpers.rewards:length_reward")
    )
    recorder = Recorder()
    trainer.callbacks.append(recorder)
    trainer.fit(module, datamodule=datamodule)
    lines = [r.getMessage() for r in caplog.records if r.name == "tokenrl.run.progress"]
    assert len(lines) == 3, lines
    matches = [LINE.fullmatch(line) for line in lines]
    assert all(matches), lines
    assert [(int(m[1]), int(m[2])) for m in matches] == [(1, 3), (2, 3), (3, 3)]
    for match, metrics in zip(matches, recorder.metrics):  # each step's own logged numbers (3 / 1 decimals)
        shown = [float(value) for value in match.groups()[2:]]
        logged = [metrics[key] for key in ("train/reward", "train/accuracy", "train/entropy", "select/fraction")]
        assert shown[:4] == pytest.approx(logged, abs=1e-3) and shown[4] == pytest.approx(
            metrics["time/step"], abs=0.05
        )


@pytest.mark.slow
def test_a_redirected_run_writes_each_line_to_its_output_and_train_log_as_it_happens(tmp_path):
    out = tmp_path / "out.txt"
    log_file = tmp_path / "run" / "train.log"
    with out.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "train.py", "debug=default", f"hydra.run.dir={tmp_path / 'run'}"],
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        seen_while_running = False
        try:
            while proc.poll() is None:
                if log_file.is_file() and "step 1/3" in log_file.read_text() and "step 1/3" in out.read_text():
                    seen_while_running = proc.poll() is None
                    break
                time.sleep(0.1)
            assert proc.wait(timeout=600) == 0, out.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert seen_while_running  # step 1's line reached both files before the run ended (no buffering to the end)
    for text in (out.read_text(), log_file.read_text()):
        steps = [LINE.search(line) for line in text.splitlines() if "[tokenrl.run.progress]" in line]
        assert [m[1] for m in steps if m] == ["1", "2", "3"] and all(steps), text[-3000:]


def test_the_progress_bar_counts_rollout_steps_of_the_run(tiny_cfg, capfd):
    """A short run with the bar on: it counts rollout steps k/total_steps (tqdm's ETA follows), not an epoch's batches
    ("Epoch 0/-2" before)."""
    from tokenrl.run.training import run

    run(
        tiny_cfg(
            "trainer.enable_progress_bar=true", "total_steps=2", "task.verifier=tests.helpers.rewards:length_reward"
        )
    )
    captured = capfd.readouterr()
    bar = (captured.out + captured.err).replace("\r", "\n")
    renderings = [line for line in bar.splitlines() if "it/s" in line]
    assert renderings[-1].startswith("rollout steps: 100%") and "| 2/2 [" in renderings[-1], bar[-2000:]
    assert "/-" not in bar  # no epoch count of a run without epochs
