"""Shared pieces of the method-invariance and golden-trajectory tests (tests/step/test_invariance.py,
tests/run/test_golden.py): a setting where every method of configs/method/ acts on the tiny random model.

* `share_reward`: a deterministic verifier whose rewards vary within every group of the tiny model's rollouts
  (`tests.helpers.rewards:length_reward` saturates at 12 characters: with `rollout.max_new_tokens=12` most groups get
  equal rewards and zero advantages).
* `ACTS`: per method, the overrides without which its preset does nothing on the tiny model (its token probabilities
  are ≈ 1/128 and its covariances small), so that what the tests pin down is the method acting.
* `disagree` / `DisagreeingEngine`: an engine whose sampling log-probs are off by −1, 0 or +1 nat per token (seeded;
  a bf16 engine, much exaggerated): only the engine-weight methods (`icepop`, any `algorithm.tis_cap`) read them, and
  with the hf engine's exact log-probs they would have nothing to mask.
* `InProcessScorer`: scores in the calling process — `SafeScorer` spawns a worker process per fit (seconds of imports
  on a busy 2-core machine, more than a tiny fit); what the tests check does not depend on where a verifier runs.
* `METHODS`: every preset of configs/method/, read from the folder (a new preset is covered without a code change).
"""

from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path

import torch

from tokenrl.records.rollout_batch import RolloutBatch, concat_rollouts
from tokenrl.rewards.verifiers import resolve
from tokenrl.rollout.hf import HFEngine

ROOT = Path(__file__).resolve().parents[2]
METHODS = sorted(path.stem for path in (ROOT / "configs" / "method").glob("*.yaml"))
FAVOURED = set("0123456789+-=abcdefghij")
ACTS = {
    # candidates need π(o_t) < τ_p: the preset's 0.002 is below every probability of the tiny model (≈ 1/128)
    "stapo": ["selector.tau_p=0.01"],
    # the near-uniform tiny model's Cov_t stays under the preset's lower bound 1; detach 5% instead of ⌊2e-4·N⌋ = 1
    "clip_cov": ["selector.cov_low=0.0", "selector.ratio=0.05"],
    # penalise 5% of the tokens instead of ⌊2e-3·N⌋ = 1
    "kl_cov": ["selector.ratio=0.05"],
    # c₀ = 0 makes α = 0 at the first step; a target above the tiny model's entropy (~4.8 nats) keeps the bonus on
    "entropy_adaptive": ["algorithm.entropy_coef=0.001", "algorithm.entropy_target=50.0"],
}


def share_reward(response: str, answer: str) -> float:
    """The share of the response's characters in a fixed set (digits, + - =, a to j): about 0.2 for a random policy
    over the 128-symbol character vocabulary, different for nearly every response, and learnable."""
    return sum(c in FAVOURED for c in response) / max(len(response), 1)


def disagree(rollouts: RolloutBatch, seed: int) -> RolloutBatch:
    """`rollouts` with each response token's sampling log-prob moved by −1, 0 or +1 nat (seeded by `seed`)."""
    generator = torch.Generator().manual_seed(seed)
    shift = torch.randint(-1, 2, rollouts.sampling_logprobs.shape, generator=generator).float()
    return dataclasses.replace(rollouts, sampling_logprobs=rollouts.sampling_logprobs + shift * rollouts.response_mask)


class DisagreeingEngine(HFEngine):
    """The hf engine, with `disagree` applied to what it returns. `per_prompt`: each prompt sampled (and shifted) on
    its own, seeded by its tokens, so that every rank count sees the same rollouts (tests/helpers/ddp_step.py:
    `PerPromptEngine`)."""

    per_prompt = False

    def _generate(self, prompt_ids: list[list[int]], params, seed: int) -> RolloutBatch:
        if not self.per_prompt:
            return disagree(super()._generate(prompt_ids, params, seed), seed)
        parts = []
        for ids in prompt_ids:
            own = zlib.crc32(str(ids).encode())
            parts.append(disagree(super()._generate([ids], params, own), own))
        return concat_rollouts(parts, self.tokenizer.pad_token_id)


class InProcessScorer:
    """`SafeScorer`'s interface (rewards/scorer.py), scoring in this process without a time limit."""

    timeout_s = 5.0

    def score(self, items: list[tuple[str, str, str]]) -> list[float]:
        return [float(resolve(name)(response, answer)) for name, response, answer in items]

    def close(self) -> None:
        pass


def fit_recording(cfg, callback):
    """Fit the run `cfg` describes, seeded, scoring in this process, with `callback` watching; returns the module."""
    import lightning as L

    from tokenrl.run.training import build_components

    L.seed_everything(cfg.seed)
    module, datamodule, trainer = build_components(cfg)
    module.collector.scorer = InProcessScorer()
    trainer.callbacks.append(callback)
    trainer.fit(module, datamodule=datamodule)
    return module
