"""The scorer runs verifiers in a worker: a broken or hanging check costs one sample, not the run, and adversarial
answers finish within the time limit without running anything."""

from __future__ import annotations

import logging
import os
import time

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import tokenrl.rewards.scorer as scorer_module
from tests.conftest import CONFIG_DIR
from tokenrl.rewards.scorer import SafeScorer


def test_raising_and_hanging_verifiers_score_zero_and_scoring_goes_on(caplog):
    scorer = SafeScorer(timeout_s=1.0)
    try:
        with caplog.at_level(logging.WARNING):
            start = time.perf_counter()
            scores = scorer.score(
                [
                    ("tests.helpers.rewards:hanging", "fine", "x"),
                    ("tests.helpers.rewards:hanging", "please hang", "x"),
                    ("tests.helpers.rewards:raising", "anything", "x"),
                    ("gsm8k_strict", "#### 4", "4"),
                ]
            )
            elapsed = time.perf_counter() - start
        assert scores == [1.0, 0.0, 0.0, 1.0]
        assert elapsed < 30
        assert "exceeded 1.0s" in caplog.text and "RuntimeError: this verifier always fails" in caplog.text
    finally:
        scorer.close()


ADVERSARIAL = [
    r"\boxed{10^{10^{10^{10^{10}}}}}",  # huge exponents
    r"\boxed{9^{9^{9^{9^{9^{9}}}}}!}",
    r"\boxed{" + r"\frac{1}{" * 400 + "2" + "}" * 400 + "}",  # deeply nested LaTeX
    r"\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}",
    r"\boxed{__import__('os').system('touch PWNED_PY')}",  # Python code
    r"\boxed{eval(\"open('PWNED_EVAL','w')\")}",
    r"\boxed{$(touch PWNED_SH)}",  # shell commands
    "#### `touch PWNED_TICK`; rm -rf / ",
    r"\boxed{x" + "+x" * 5000 + "}",
]


@pytest.mark.slow
def test_adversarial_answers_finish_in_time_and_run_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scorer = SafeScorer(timeout_s=3.0)
    try:
        items = [(name, text, "2") for text in ADVERSARIAL for name in ("math", "gsm8k_strict", "choice")]
        start = time.perf_counter()
        scores = scorer.score(items)
        elapsed = time.perf_counter() - start
    finally:
        scorer.close()
    assert scores == [0.0] * len(items)
    assert elapsed < 3.0 * len(items) + 30  # each check bounded by its limit (plus worker restarts)
    assert not [name for name in os.listdir(tmp_path) if name.startswith("PWNED")]


@pytest.mark.parametrize("config", ["train", "eval"])
def test_a_bad_time_limit_names_the_key_the_configs_have(config):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name=config)
    assert cfg.reward_timeout_s > 0  # the top-level key the message names
    with pytest.raises(ValueError, match=r"^reward_timeout_s=0 must be > 0"):
        SafeScorer(timeout_s=0)


def test_a_batch_larger_than_both_pipes_scores_every_item_in_order():
    """3,000 responses of 2 KB each (6 MB through a 64 KB pipe, and more results than the return pipe holds): the
    old send-everything-then-read loop deadlocked here; every score must come back, in order."""
    items = [
        ("gsm8k_flexible", "x " * 1000 + f"The answer is {i % 7}", str(i % 7 if i % 3 else 99)) for i in range(3000)
    ]
    scorer = SafeScorer(timeout_s=30.0)
    try:
        scores = scorer.score(items)
    finally:
        scorer.close()
    assert scores == [0.0 if i % 3 == 0 else 1.0 for i in range(3000)]


def _spin() -> None:
    while True:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="the runqueue wait is Linux's schedstat")
def test_a_check_starved_of_cpu_is_not_timed_out_but_a_sleeping_one_is(caplog, monkeypatch):
    """The worker pinned to one CPU beside a busy process gets at most half of it: a check that needs 0.6 s of CPU
    takes over a second of wall time, which a wall-clock limit of 1 s would score 0. The wall-clock cap is lifted: on
    a loaded machine the share can be far below half."""
    import multiprocessing as mp

    monkeypatch.setattr(scorer_module, "STALL_CAP", 1000)
    scorer = SafeScorer(timeout_s=1.0)
    hogs = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(1)]
    try:
        assert scorer.score([("tests.helpers.rewards:busy", "0", "x")]) == [1.0]  # the worker is up
        cpu = {min(os.sched_getaffinity(0))}
        for hog in hogs:
            hog.start()
            os.sched_setaffinity(hog.pid, cpu)
        os.sched_setaffinity(scorer._proc.pid, cpu)
        with caplog.at_level(logging.WARNING):
            start = time.perf_counter()
            scores = scorer.score([("tests.helpers.rewards:busy", "0.6", "x")])
            starved = time.perf_counter() - start
            hanging = scorer.score([("tests.helpers.rewards:hanging", "please hang", "x")])
    finally:
        for hog in hogs:
            hog.kill()
        scorer.close()
    assert starved > 1.0  # the check really was starved past the limit's wall time
    assert scores == [1.0]
    assert hanging == [0.0]  # asleep, not waiting for a CPU: its own time runs out
    assert caplog.text.count("exceeded 1.0s") == 1
