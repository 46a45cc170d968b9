"""The algorithm record refuses bad loss settings naming them (dual clip, importance-sampling cap and mode, overlong
buffer, DPPO, SAPO) and accepts the new losses with theirs."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tokenrl.algorithms.config import AlgorithmConfig


def algorithm_config(max_new_tokens: int = 1024, **changes):
    """The `grpo` preset's AlgorithmConfig with `changes` (the record that validates every algorithm setting)."""
    node = OmegaConf.to_container(compose_config([]).algorithm, resolve=True)
    return AlgorithmConfig.from_node({**node, **changes}, max_new_tokens)


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_dual_clip_must_exceed_one(c):
    with pytest.raises(ValueError, match=rf"algorithm.dual_clip={c} must be > 1"):
        algorithm_config(dual_clip=c)


def test_truncated_importance_sampling_rejects_a_bad_cap():
    with pytest.raises(ValueError, match="algorithm.tis_cap"):
        algorithm_config(tis_cap=0.0)


def test_overlong_buffer_beyond_the_response_budget_is_named():
    with pytest.raises(
        ValueError, match=r"algorithm.overlong_buffer=300 must lie in \[0, rollout.max_new_tokens=256\]"
    ):
        algorithm_config(overlong_buffer=300, max_new_tokens=256)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(policy_loss="dppo", dppo_divergence="js"),
            r"algorithm.dppo_divergence='js' is not one of \('tv', 'kl'\)",
        ),
        (dict(dppo_low=0.0), r"algorithm.dppo_low=0.0 must be > 0"),
        (dict(sapo_tau_neg=-1.0), r"algorithm.sapo_tau_neg=-1.0 must be > 0"),
        (
            dict(policy_loss="sapo", dual_clip=3.0),
            r"algorithm.dual_clip=3.0 does not apply to algorithm.policy_loss=sapo",
        ),
        (dict(tis_mode="token_clip", tis_cap=2.0), r"algorithm.tis_mode='token_clip' is not one of \('token_truncate'"),
        (dict(tis_mode="token_mask"), r"algorithm.tis_mode=token_mask has no effect while algorithm.tis_cap=null"),
        (dict(tis_min=0.5), r"algorithm.tis_min=0.5 has no effect while algorithm.tis_cap=null"),
        (dict(tis_min=3.0, tis_cap=2.0), r"algorithm.tis_min=3.0 must lie in \(0, algorithm.tis_cap=2.0\)"),
    ],
)
def test_bad_dppo_sapo_and_engine_weight_settings_are_named(changes, message):
    with pytest.raises(ValueError, match=message):
        algorithm_config(**changes)


def test_new_losses_are_named_and_valid_with_their_settings():
    for kind in ("gspo_seq", "dppo", "sapo"):
        assert algorithm_config(policy_loss=kind).loss.policy_loss == kind
    cfg = algorithm_config(tis_mode="sequence_mask", tis_min=0.5, tis_cap=5.0, dppo_divergence="kl")
    assert (cfg.engine_is.tis_mode, cfg.engine_is.tis_min, cfg.engine_is.tis_cap, cfg.loss.dppo_divergence) == (
        "sequence_mask",
        0.5,
        5.0,
        "kl",
    )
