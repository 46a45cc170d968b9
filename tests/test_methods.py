"""`configs/method/`: every token-level method end to end through `GRPOModule` with the real Trainer and the tiny
model — it composes, trains, logs, records what it set per token in the samples — and the entropy bonus and its
adaptive coefficient act on the loss as docs/algorithms.md §11.5 says."""
from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from tests.conftest import CONFIG_DIR
from tokenrl.train import build_components

METHODS = sorted(path.stem for path in (Path(CONFIG_DIR) / "method").glob("*.yaml"))
# what each method's selection sets per token beyond its weights (the samples' `shaping`)
SHAPING = {"archer": {"clip_high", "kl_weights"}, "gtpo": {"advantages"}, "kl_cov": {"clip_high", "drift_coef"}}
ONE_STEP = ["task.verifier=tests.helpers.rewards:length_reward", "total_steps=1", "samples.every_n_steps=1",
            "samples.rows=8", "selector_warmup_steps=0", "algorithm.kl_coef=0.01"]


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
    assert set(METHODS) == {"uniform", "random", "ict", "entropy20", "stapo", "entropy_bonus", "entropy_adaptive",
                            "ict_entropy_bonus", "clip_cov", "kl_cov", "archer", "gtpo", "dr_grpo", "gspo", "cispo",
                            "kl_k1", "kl_k2"}


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains_end_to_end(tiny_cfg, method):
    cfg = tiny_cfg(*ONE_STEP, f"method={method}")
    module, metrics = fit(cfg)
    assert module.optimizer_steps == 1
    step = metrics.steps[-1]
    assert torch.isfinite(torch.tensor(step["train/loss"])) and 0 < step["select/fraction"] <= 1
    records = [json.loads(line) for line in
               (Path(cfg.paths.output_dir) / "samples" / "step_0000.jsonl").read_text().splitlines()]
    assert set(records[0]["shaping"]) == SHAPING.get(method, set())
    weights = [w for record in records for w in record["updated"]]
    assert all(w in (0, 1) for w in weights)
    if method == "clip_cov":   # the default r = 2e-4 detaches ⌊r·N⌋ ≥ 1 token when a candidate exists
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
    settings = ["method=entropy_adaptive", "algorithm.entropy_target=50.0", "algorithm.entropy_coef=0.001",
                "algorithm.entropy_coef_delta=0.002", "algorithm.entropy_coef_max=0.004", "total_steps=3"]
    module, metrics = fit(tiny_cfg(*ONE_STEP, *settings))
    assert [round(step["train/entropy_coef"], 9) for step in metrics.steps] == [0.001, 0.003, 0.004]
    assert module.entropy_control.state_dict() == {"coef": 0.004, "on": True}
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    fresh, _, _ = build_components(tiny_cfg(*ONE_STEP, *settings))
    fresh.on_load_checkpoint(checkpoint)
    assert fresh.entropy_control.state_dict() == module.entropy_control.state_dict()
    _, above = fit(tiny_cfg(*ONE_STEP, *settings[:1], "algorithm.entropy_target=0.2", "total_steps=2",
                            "algorithm.entropy_coef=0.001"))
    assert [round(step["train/entropy_coef"], 9) for step in above.steps] == [0.001, 0.0]   # above target: off
