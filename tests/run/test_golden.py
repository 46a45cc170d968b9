"""Golden trajectories (issue #23 §4): three rollout steps of every method of configs/method/ on a tiny fixed setting,
compared with the per-step values committed in tests/fixtures/golden/methods.json, so that a refactor that changes
what any method does fails here.

Regenerate the fixture (after a change that is meant to change a method's behaviour; say why in the commit):

    TOKENRL_REGOLD=1 python -m pytest tests/run/test_golden.py

which runs every method, rewrites the file and passes; commit the diff. A preset added to configs/method/ fails here
until the fixture is regenerated (it is read from the folder, as everywhere).

The setting: `model=tiny` (a random 2-layer Qwen2, character tokenizer), 64 prompts of the offline arithmetic task,
the `hf` engine, seed 0, 4 prompts × G 8, 12 new tokens, `tests.helpers.varied:share_reward` (rewards that vary
within every group), KL β 0.01, Θ = 0, each method's preset with tests/helpers/varied.py's `ACTS` (the overrides
without which a preset does nothing on the tiny model) and an engine whose sampling log-probs are off by ±1 nat on
some tokens (so that IcePop masks; no other method reads them). Three regimes per method: `preset` (its own
mini-batches; for the one-step presets the fused statistics path), `one_step` (`algorithm.mini_batches=1`: one
optimizer step per rollout step, where the ratio is 1) and `moving` (`algorithm.ppo_epochs=2`: the second epoch sees
a moved policy, so every ratio-driven part acts). Each runs through the real Trainer and `GRPOModule`
(scoring in-process: tests/helpers/varied.py), one after another in one process: ~45 s for all 63 runs.

Recorded per step: the mean reward, the loss, the selected fraction, the clip fraction (DPPO: dropped), the entropy and
KL of π_old, α of the entropy bonus, the engine weights' mean and masked share (IcePop), the mean response length, and
two fingerprints of the policy after the step (the float64 L2 norm of its weights and their dot product with a fixed
random ±1 vector) — they move with any change of any gradient, even one the logged loss does not show.

Tolerances. On one machine with one intra-op thread the run is bitwise deterministic (the same JSON from two
processes), and the discrete values — reward, selected fraction, response length, whose every change means other
tokens were sampled or chosen — are compared exactly. The continuous ones allow another CPU's float32 kernels (a
different SIMD width reorders sums: ~1e-7 relative per operation, amplified a little by three Adam steps): relative
1e-5, absolute 1e-7 (a loss that cancels to ~0 on-policy is float32 rounding of O(1) terms). A behavioural change —
another normaliser, clip bound, token chosen, coefficient — moves them by orders of magnitude more.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from tests.conftest import TINY, compose_config, once_per_run
from tests.helpers.varied import ACTS, METHODS, DisagreeingEngine, fit_recording

GOLDEN = Path(__file__).parents[1] / "fixtures" / "golden" / "methods.json"
REGOLD = os.environ.get("TOKENRL_REGOLD") == "1"
STEPS = 3
SETTING = TINY + [
    "task.verifier=tests.helpers.varied:share_reward",
    "task.train_size=64",
    "task.test_size=8",
    f"total_steps={STEPS}",
    "samples.every_n_steps=0",
    "selector_warmup_steps=0",
    "algorithm.kl_coef=0.01",
]
REGIMES = {"preset": [], "one_step": ["algorithm.mini_batches=1"], "moving": ["algorithm.ppo_epochs=2"]}
EXACT = ("train/reward", "select/fraction", "train/response_len")
CLOSE = (
    "train/loss",
    "train/clip_frac",
    "train/entropy",
    "train/kl",
    "train/entropy_coef",
    "train/tis_weight_mean",
    "train/tis_capped_frac",
    "policy/l2",
    "policy/probe",
)
RTOL, ATOL = 1e-5, 1e-7


class Trajectory(L.Callback):
    """Swaps in the disagreeing engine; after each rollout step records the metrics of `EXACT` and `CLOSE` that the
    step logged and the policy's fingerprints."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_start(self, trainer, module) -> None:
        module.engine = DisagreeingEngine(module.policy, module.tokenizer, module.run_state.optimizer_steps)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        logged = {key: float(value) for key, value in trainer.callback_metrics.items() if key in EXACT + CLOSE}
        flat = torch.cat([p.detach().double().flatten() for p in module.policy.parameters()])
        signs = torch.randint(0, 2, flat.shape, generator=torch.Generator().manual_seed(0)).double() * 2 - 1
        self.steps.append({**logged, "policy/l2": float(flat.norm()), "policy/probe": float(flat @ signs)})


@functools.cache
def composed(method: str) -> DictConfig:
    """`method`'s preset with its `ACTS` composed through Hydra onto `SETTING` (once per method: composing takes about
    as long as a fit)."""
    return compose_config(SETTING + [f"method={method}", *ACTS.get(method, [])])


def trajectory(method: str, regime: str, out: Path) -> list[dict[str, float]]:
    cfg = copy.deepcopy(composed(method))
    for override in REGIMES[regime]:  # `key=value`, set on the composed config as on the command line
        key, value = override.split("=")
        OmegaConf.update(cfg, key, yaml.safe_load(value))
    cfg.paths.output_dir = str(out)
    record = Trajectory()
    fit_recording(cfg, record)
    assert len(record.steps) == STEPS
    return record.steps


@pytest.fixture(scope="module")
def runs(one_thread, tmp_path_factory, worker_id):
    """Every method in every regime, one after another in one process, once per test run; with TOKENRL_REGOLD=1
    written to the fixture."""
    runs = once_per_run(
        tmp_path_factory,
        worker_id,
        "golden",
        lambda out: {
            method: {regime: trajectory(method, regime, out / f"{method}_{regime}") for regime in REGIMES}
            for method in METHODS
        },
    )
    if REGOLD:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        setting = {
            "overrides": SETTING,
            "regimes": REGIMES,
            "acts": ACTS,
            "torch": torch.__version__,
            "regenerate": "TOKENRL_REGOLD=1 python -m pytest tests/run/test_golden.py",
        }
        GOLDEN.write_text(json.dumps({"setting": setting, "methods": runs}, indent=1) + "\n")
    return runs


@pytest.fixture(scope="module")
def golden() -> dict:
    assert GOLDEN.exists(), f"{GOLDEN} is missing: TOKENRL_REGOLD=1 python -m pytest tests/run/test_golden.py"
    return json.loads(GOLDEN.read_text())["methods"]


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_method_follows_its_golden_trajectory(runs, golden, method):
    assert method in golden, (
        f"no golden trajectory for method={method}: regenerate with "
        "TOKENRL_REGOLD=1 python -m pytest tests/run/test_golden.py"
    )
    for regime, steps in golden[method].items():
        ran = runs[method][regime]
        for index, (want, got) in enumerate(zip(steps, ran)):
            assert got.keys() == want.keys(), (regime, index)
            for key, value in want.items():
                where = f"method={method}, regime {regime}, step {index}, {key}: {got[key]!r}, golden {value!r}"
                if key in EXACT:
                    assert got[key] == value, where
                else:
                    assert math.isclose(got[key], value, rel_tol=RTOL, abs_tol=ATOL), where


def test_golden_trajectories_tell_methods_apart(golden):
    """The fixture pins behaviour, not a constant: where the ratio moves every method's trajectory differs from every
    other's. With one optimizer step per rollout step GSPO (s_i = 1) and KL-Cov (its penalty's gradient is 0 at
    π_θ = π_old; no token's ratio to clip) are GRPO exactly (docs/algorithms.md §11.2, §11.6), to the last bit; their
    presets run 4 mini-batches, where they act and differ from GRPO."""
    moving = {method: tuple(step["policy/probe"] for step in golden[method]["moving"]) for method in golden}
    assert len(set(moving.values())) == len(moving)
    for method in ("gspo", "kl_cov"):
        assert golden[method]["one_step"] == golden["uniform"]["one_step"], method
        assert golden[method]["preset"] != golden["uniform"]["preset"], method
