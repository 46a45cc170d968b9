"""`AlgorithmConfig` (algorithms/config.py): every algorithm preset becomes a valid record, and every bad setting
fails at start-up with an error that names the key as the command line writes it."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.run.training import build_components


def node(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_config(list(overrides)).algorithm, resolve=True)


@pytest.mark.parametrize("preset", ["grpo", "dapo"])
def test_every_preset_is_a_valid_record_with_typed_fields(preset):
    cfg = AlgorithmConfig.from_node(node(f"algorithm={preset}"), max_new_tokens=1024)
    assert isinstance(cfg.batch.group_size, int) and isinstance(cfg.loss.clip_high, float)
    assert isinstance(cfg.loss.kl_masked, bool)
    assert (cfg.loss.aggregation, cfg.loss.dual_clip) == (
        ("seq-mean-token-mean", None) if preset == "grpo" else ("token-mean", 10.0)
    )
    with pytest.raises(AttributeError):
        cfg.loss.kl_coef = 1.0  # frozen: the hot path reads, never writes


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "aggregation",
            "sum",
            r"algorithm.aggregation='sum' is not one of \('seq-mean-token-mean', 'token-mean', "
            r"'seq-mean-token-sum-norm'\)",
        ),
        ("kl_estimator", "k4", r"algorithm.kl_estimator='k4' is not one of \('k1', 'k2', 'k3', 'low_var_kl'\)"),
        (
            "policy_loss",
            "ppg",
            r"algorithm.policy_loss='ppg' is not one of \('ppo', 'gspo', 'gspo_seq', 'cispo', "
            r"'dppo', 'sapo'\)",
        ),
        ("entropy_target", -0.1, r"algorithm.entropy_target=-0.1 must be > 0"),
        ("entropy_coef", -1.0, r"algorithm.entropy_coef=-1.0 must be >= 0"),
        ("filter_groups", "score", r"algorithm.filter_groups='score' is not one of \('acc', 'reward'\)"),
        ("dual_clip", 0.5, r"algorithm.dual_clip=0.5 must be > 1"),
        ("tis_cap", -1.0, r"algorithm.tis_cap=-1.0 must be > 0"),
        ("overlong_buffer", 2000, r"algorithm.overlong_buffer=2000 must lie in \[0, rollout.max_new_tokens=1024\]"),
        ("lr_warmup_steps", -1, r"algorithm.lr_warmup_steps=-1 must be >= 0"),
        ("mini_batches", 0, r"algorithm.mini_batches=0 must be >= 1"),
        ("micro_batch_tokens", 0, r"algorithm.micro_batch_tokens=0 must be >= 1 \(or null"),
        ("group_size", 2.5, r"algorithm.group_size=2.5 is not a valid int"),
        ("kl_masked", "yes", r"algorithm.kl_masked='yes' is not a valid bool"),
        ("clip_low", None, r"algorithm.clip_low=null is not allowed"),
        ("grad_clip", 0.0, r"algorithm.grad_clip=0.0 must be > 0"),
        ("clip_hihg", 0.3, r"algorithm.clip_hihg is not a setting of the algorithm"),
    ],
)
def test_a_bad_setting_is_named(key, value, message):
    with pytest.raises(ValueError, match=message):
        AlgorithmConfig.from_node({**node(), key: value}, max_new_tokens=1024)


def test_a_bad_setting_fails_when_the_run_is_built(tiny_cfg):
    with pytest.raises(ValueError, match=r"algorithm.dual_clip=0.9 must be > 1"):
        build_components(tiny_cfg("algorithm.dual_clip=0.9"))
