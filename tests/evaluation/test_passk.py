"""The unbiased pass@k estimator equals brute-force enumeration over all k-subsets of the n samples."""

from __future__ import annotations

import itertools

import pytest
import torch

from tokenrl.evaluation.passk import PassAtK, pass_at_k


def brute_force(outcomes: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_enumeration(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(outcomes, k), abs=1e-12)


def test_pass_at_1_is_the_fraction_correct():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


def test_metric_averages_over_problems():
    metric = PassAtK(4)
    counts = torch.tensor([0, 1, 5, 8])
    metric.update(counts, 8)
    expected = sum(brute_force([True] * c + [False] * (8 - c), 4) for c in counts.tolist()) / 4
    assert float(metric.compute()) == pytest.approx(expected)


def test_k_above_n_is_rejected_with_the_setting_named():
    with pytest.raises(ValueError, match="eval.n_samples"):
        pass_at_k(2, 1, 4)
