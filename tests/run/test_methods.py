"""`configs/method/`: every token-level method end to end through `GRPOModule` with the real Trainer and the tiny
model — it composes, trains, logs, records what it set per token in the samples — and the entropy bonus and its
adaptive coefficient act on the loss as docs/algorithms.md §11.5 says. The ratio-driven methods (GSPO in both forms,
DPPO, SAPO) coincide with GRPO where the ratio is 1 (one optimizer step per rollout step) and differ from it where the
ratio moves (their presets' four mini-batches); the engine-weight modes act where the engine disagrees."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.conftest import CONFIG_DIR, TINY, compose_config
from tests.step.test_update import CaptureUpdate, plain_backend
from tokenrl.algorithms.config import AlgorithmConfig
from tokenrl.models import build_model
from tokenrl.run.training import build_components
from tokenrl.step.update import UpdateRun, ppo_update
from tokenrl.utils import derived_seed

METHODS = sorted(path.stem for path in (Path(CONFIG_DIR) / "method").glob("*.yaml"))
# what each method's selection sets per token beyond its weights (the samples' `shaping`)
SHAPING = {"archer": {"clip_high", "kl_weights"}, "gtpo": {"advantages"}, "kl_cov": {"clip_high", "drift_coef"}}
ONE_STEP = [
    "task.verifier=tests.helpers.rewards:length_reward",
    "total_steps=1",
    "samples.every_n_steps=1",
    "samples.rows=8",
    "selector_warmup_steps=0",
    "algorithm.kl_coef=0.01",
]


class Metrics(L.Callback):
    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.steps.append({key: float(value) for key, value in trainer.callback_metrics.items()})


def fit(cfg) -> tuple[object, Metrics]:
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    metrics = Metrics()
    trainer.callbacks.append(metrics)
    trainer.fit(module, datamodule=datamodule)
    return module, metrics


def test_the_method_catalogue_is_complete():
    assert set(METHODS) == {
        "uniform",
        "random",
        "ict",
        "entropy20",
        "stapo",
        "entropy_bonus",
        "entropy_adaptive",
        "ict_entropy_bonus",
        "clip_cov",
        "kl_cov",
        "archer",
        "gtpo",
        "dr_grpo",
        "gspo",
        "cispo",
        "kl_k1",
        "kl_k2",
        "gspo_seq",
        "dppo",
        "sapo",
        "icepop",
    }


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_end_to_end(tiny_cfg, method):
    cfg = tiny_cfg(*ONE_STEP, f"method={method}")
    module, metrics = fit(cfg)
    assert module.run_state.optimizer_steps == cfg.algorithm.mini_batches * cfg.algorithm.ppo_epochs
    step = metrics.steps[-1]
    assert torch.isfinite(torch.tensor(step["train/loss"])) and 0 < step["select/fraction"] <= 1
    records = [
        json.loads(line)
        for line in (Path(cfg.paths.output_dir) / "samples" / "step_0001.jsonl").read_text().splitlines()
    ]
    assert set(records[0]["shaping"]) == SHAPING.get(method, set())
    weights = [w for record in records for w in record["updated"]]
    assert all(w in (0, 1) for w in weights)
    if method == "clip_cov":  # the default r = 2e-4 detaches ⌊r·N⌋ ≥ 1 token when a candidate exists
        assert step["select/fraction"] >= 1 - 2 / sum(len(r["tokens"]) for r in records)


def test_entropy_bonus_lowers_the_loss_by_alpha_times_the_mean_entropy(tiny_cfg):
    """First step, token-mean, every token: the policy-gradient part is the same with and without the bonus (same
    rollouts, π_θ = π_old), so the logged losses differ by −α·(mean entropy of the response tokens)."""
    base = [*ONE_STEP, "algorithm.kl_coef=0", "algorithm.aggregation=token-mean"]
    _, plain = fit(tiny_cfg(*base))
    _, bonus = fit(tiny_cfg(*base, "method=entropy_bonus", "algorithm.entropy_coef=0.05"))
    assert bonus.steps[0]["train/entropy_coef"] == pytest.approx(0.05) and plain.steps[0]["train/entropy_coef"] == 0.0
    assert bonus.steps[0]["train/entropy"] == pytest.approx(plain.steps[0]["train/entropy"], rel=1e-6)
    expected = -0.05 * plain.steps[0]["train/entropy"]
    assert bonus.steps[0]["train/loss"] - plain.steps[0]["train/loss"] == pytest.approx(expected, rel=1e-4)


def test_adaptive_entropy_coefficient_follows_skywork_rule_and_resumes(tiny_cfg):
    """Target above the tiny model's entropy (~4.8 nats): α starts at c₀ and grows by Δ per step up to the cap;
    below-target steps keep the bonus on. The coefficient travels in the checkpoint."""
    settings = [
        "method=entropy_adaptive",
        "algorithm.entropy_target=50.0",
        "algorithm.entropy_coef=0.001",
        "algorithm.entropy_coef_delta=0.002",
        "algorithm.entropy_coef_max=0.004",
        "total_steps=3",
    ]
    module, metrics = fit(tiny_cfg(*ONE_STEP, *settings))
    assert [round(step["train/entropy_coef"], 9) for step in metrics.steps] == [0.001, 0.003, 0.004]
    assert module.entropy_control.state_dict() == {"coef": 0.004, "on": True}
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    fresh, _, _ = build_components(tiny_cfg(*ONE_STEP, *settings))
    fresh.on_load_checkpoint(checkpoint)
    assert fresh.entropy_control.state_dict() == module.entropy_control.state_dict()
    _, above = fit(
        tiny_cfg(
            *ONE_STEP, *settings[:1], "algorithm.entropy_target=0.2", "total_steps=2", "algorithm.entropy_coef=0.001"
        )
    )
    assert [round(step["train/entropy_coef"], 9) for step in above.steps] == [0.001, 0.0]  # above target: off


@pytest.fixture(scope="module")
def captured_step(tmp_path_factory):
    """One real rollout step of the tiny model (statistics pass, reference log-probs, 4 mini-batches' worth of rows):
    its TrainBatch, the weights before its update and the module that made it."""
    cfg = compose_config(TINY + ONE_STEP + ["algorithm.mini_batches=4"], output_dir=tmp_path_factory.mktemp("step"))
    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    capture = CaptureUpdate()
    trainer.callbacks.append(capture)
    trainer.fit(module, datamodule=datamodule)
    return capture, module


def replay(captured_step, *overrides: str, batch=None):
    """The captured step's update again, under `overrides` (a method, its mini-batches) from the same weights and the
    same mini-batch order, with the plain backend of tests/step/test_update.py: (the weights after, flat; the
    metrics)."""
    capture, module = captured_step
    cfg = compose_config(TINY + ONE_STEP + list(overrides))
    algorithm = AlgorithmConfig.from_node(
        OmegaConf.to_container(cfg.algorithm, resolve=True), int(cfg.rollout.max_new_tokens)
    )
    policy = build_model(module.model_settings, seed=cfg.seed)
    policy.load_state_dict(capture.before)
    policy.train()
    optimizer = instantiate(cfg.algorithm.optimizer)([p for p in policy.parameters() if p.requires_grad])
    backend = plain_backend(
        policy, algorithm, module.sampling.temperature, optimizer, module.model_settings.stats_chunk_size
    )
    shuffle = torch.Generator().manual_seed(derived_seed(cfg.seed, "shuffle", 0))
    run = UpdateRun(instantiate(cfg.selector), algorithm, shuffle)
    result = ppo_update(capture.train if batch is None else batch, capture.stats, run, backend)
    assert result.optimizer_steps == algorithm.batch.mini_batches
    return torch.cat([p.detach().flatten() for p in policy.parameters()]), result.metrics


def relative_change(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("method", ["sapo", "dppo", "gspo_seq"])
def test_ratio_driven_methods_are_grpo_on_policy_and_differ_once_the_ratio_moves(captured_step, method):
    """One optimizer step: r = 1 on every token, so SAPO's gate has slope 1, DPPO drops nothing and GSPO's s_i = 1 —
    the update is GRPO's (to float rounding). Four mini-batches (the presets' regime): from the second on π_θ ≠ π_old
    and each method's update differs from GRPO's."""
    grpo_once, _ = replay(captured_step, "method=uniform", "algorithm.mini_batches=1")
    once, metrics = replay(captured_step, f"method={method}", "algorithm.mini_batches=1")
    assert relative_change(once, grpo_once) < 1e-5 and metrics["clip_frac"] == 0.0
    grpo_moving, _ = replay(captured_step, "method=uniform")
    moving, _ = replay(captured_step, f"method={method}")  # the preset: 4 mini-batches
    assert relative_change(moving, grpo_moving) > 1e-3
    assert relative_change(moving, once) > 1e-3


def test_gspo_sequence_and_token_forms_train_alike_unless_advantages_are_per_token(captured_step):
    """Four mini-batches: GSPO-token and GSPO's sequence form give the same update with one advantage per response
    (the paper's identity, docs/algorithms.md §11.10), also where the 3e-4 clip binds (lr 0.01 moves the sequence
    ratios past it); with GTPO's per-token advantages they part."""
    token, _ = replay(captured_step, "method=gspo", "algorithm.mini_batches=4", "algorithm.optimizer.lr=0.01")
    sequence, metrics = replay(captured_step, "method=gspo_seq", "algorithm.optimizer.lr=0.01")
    assert relative_change(sequence, token) < 1e-4 and metrics["clip_frac"] > 0  # float32 rounding, through Adam
    token, _ = replay(captured_step, "method=gspo", "algorithm.mini_batches=4", "selector=gtpo")
    sequence, _ = replay(captured_step, "method=gspo_seq", "selector=gtpo")
    assert relative_change(sequence, token) > 1e-3


@pytest.mark.parametrize("divergence, delta", [("tv", 0.002), ("kl", 0.0002)])
def test_dppo_drops_tokens_once_the_policy_has_moved(captured_step, divergence, delta):
    """The tiny model's token probabilities are ≈ 1/128, so within a step they move by less than the preset's
    δ = 0.15 even where ratios move by e^±0.5 (DPPO's point: a ratio bound over-constrains rare tokens). With δ = 0.002
    (TV) or 0.0002 (binary KL) tokens are dropped from the second mini-batch on (train/clip_frac is DPPO's dropped
    share); on-policy none is."""
    settings = [
        "method=dppo",
        "algorithm.optimizer.lr=0.01",
        f"algorithm.dppo_divergence={divergence}",
        f"algorithm.dppo_low={delta}",
        f"algorithm.dppo_high={delta}",
    ]
    _, once = replay(captured_step, *settings, "algorithm.mini_batches=1")
    _, moving = replay(captured_step, *settings)
    assert once["clip_frac"] == 0.0 and moving["clip_frac"] > 0.0


def test_icepop_masks_where_the_engine_disagrees(captured_step):
    """The hf engine samples from the trainer's own weights: every engine ratio is ≈ 1, method=icepop keeps them all
    and trains as GRPO. An engine whose log-probs are off by ±1 nat on some tokens (a bf16 engine, much exaggerated)
    gets those tokens masked (ratio outside [0.5, 5]) and the update changes; sequence_mask masks whole responses."""
    capture, _ = captured_step
    grpo, _ = replay(captured_step, "method=uniform", "algorithm.mini_batches=1")
    agreeing, metrics = replay(captured_step, "method=icepop")
    assert metrics["tis_capped_frac"] == 0.0 and metrics["tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert relative_change(agreeing, grpo) < 1e-3
    rollouts = capture.train.rollouts
    generator = torch.Generator().manual_seed(5)
    shift = torch.randint(-1, 2, rollouts.sampling_logprobs.shape, generator=generator).float() * rollouts.response_mask
    off = dataclasses.replace(
        capture.train, rollouts=dataclasses.replace(rollouts, sampling_logprobs=rollouts.sampling_logprobs + shift)
    )
    masked, token = replay(captured_step, "method=icepop", batch=off)
    assert 0.0 < token["tis_capped_frac"] < 1.0 and relative_change(masked, agreeing) > 1e-3
    _, sequence = replay(captured_step, "method=icepop", "algorithm.tis_mode=sequence_mask", batch=off)
    assert sequence["tis_capped_frac"] > token["tis_capped_frac"]  # a response with one bad token goes whole
