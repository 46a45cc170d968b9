"""Evaluation: the unbiased pass@k estimator and the benchmark runner."""
