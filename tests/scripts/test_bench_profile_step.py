"""scripts/bench/profile_step.py's summary of a profile: each phase's wall time (a nested range of the same phase
counted once), its host syncs, the GPU-busy union against a brute-force count, and the top operators without the
phases' own markers."""

from __future__ import annotations

import random

import torch

from tests.helpers.scripts import load_script
from tokenrl.utils import StepTimer

profile_step = load_script("scripts/bench/profile_step.py")


def test_busy_time_is_the_union_of_the_intervals_within_the_range():
    rng = random.Random(0)
    for _ in range(200):
        intervals = [(a, a + rng.randint(0, 30)) for a in (rng.randint(0, 100) for _ in range(rng.randint(0, 8)))]
        start, end = sorted(rng.sample(range(0, 131), 2))
        covered = sum(any(a <= t < b for a, b in intervals) for t in range(start, end))  # unit cells, brute force
        assert profile_step.busy_us(intervals, start, end) == covered


def test_a_profiled_step_is_summarised_by_phase():
    timer, x = StepTimer(), torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        with timer("generate"), timer("generate"):  # the module's and the collector's range: one phase
            for _ in range(3):
                (x @ x).sum().item()
        with timer("update"):
            (x @ x).relu().mean().item()
    found = profile_step.summary(profile, "cpu")
    assert set(found["phases"]) == {"generate", "update"}
    assert (found["phases"]["generate"]["syncs"], found["phases"]["update"]["syncs"]) == (3, 1)
    assert 0 < found["phases"]["generate"]["wall_s"] <= timer.seconds["generate"] / 2 + 1e-3  # counted once
    assert found["phases"]["update"]["gpu_busy"] is None  # no device on a CPU
    names = [row["name"] for row in found["top"]]
    assert "aten::mm" in names and not any(name.startswith("phase/") for name in names)
    assert abs(sum(row["share"] for row in found["top"]) - 1) < 1e-9 or len(found["top"]) == profile_step.TOP
