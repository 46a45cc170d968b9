"""Sample n completions per problem with a rollout engine, score them (time-limited) and compute pass@k."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tokenrl.data.prompts import PromptFormatter, with_instruction
from tokenrl.evaluation.passk import PassAtK
from tokenrl.records.problem import Problem
from tokenrl.rewards.scorer import SafeScorer
from tokenrl.rollout.engine import RolloutEngine, SamplingParams
from tokenrl.utils import derived_seed

log = logging.getLogger(__name__)
PROGRESS_AFTER_S = 5.0  # an evaluation shorter than this stays quiet


@dataclass(frozen=True)
class EvalSettings:
    n_samples: int
    ks: tuple[int, ...]
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 1024
    max_prompt_length: int = 2048
    batch_prompts: int = 8
    seed: int = 0

    def decoding(self) -> dict[str, Any]:
        """The sampling these settings apply: greedy with top_k=1 (temperature and top-p then change nothing), else
        temperature, top-p and top-k (0: off)."""
        if self.top_k == 1:
            return {"decoding": "greedy", "temperature": None, "top_p": None, "top_k": 1}
        return {"decoding": "sampling", "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


def evaluate(
    name: str,
    problems: list[Problem],
    instruction: str,
    engine: RolloutEngine,
    formatter: PromptFormatter,
    scorer: SafeScorer,
    settings: EvalSettings,
    samples_path: Path | None = None,
) -> dict:
    """pass@k for k in settings.ks, avg@n and counts; one JSON line per sample in `samples_path` (no question text).
    Once it has run `PROGRESS_AFTER_S`, a line per batch of prompts says how far it is and about how long is left.

    Prompts longer than `max_prompt_length` tokens are skipped (counted in `skipped_long_prompts`)."""
    if any(k > settings.n_samples for k in settings.ks):
        raise ValueError(
            f"eval.ks={list(settings.ks)} needs eval.n_samples >= {max(settings.ks)} (got {settings.n_samples})"
        )
    prompts, kept = [], []
    for problem in problems:
        ids = formatter.token_ids(with_instruction(problem.question, instruction))
        if len(ids) <= settings.max_prompt_length:
            prompts.append(ids)
            kept.append(problem)
    skipped = len(problems) - len(kept)
    if skipped:
        log.warning("%s: skipped %d prompts longer than %d tokens", name, skipped, settings.max_prompt_length)
    params = SamplingParams(
        n=settings.n_samples,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        max_new_tokens=settings.max_new_tokens,
    )
    metrics = {k: PassAtK(k) for k in settings.ks}
    correct_total, tokens, start = 0.0, 0, time.perf_counter()
    handle = samples_path.open("w") if samples_path else None
    try:
        batches = range(0, len(kept), settings.batch_prompts)
        for done, first in enumerate(batches, start=1):
            chunk = kept[first : first + settings.batch_prompts]
            rollouts = engine.generate(
                prompts[first : first + settings.batch_prompts],
                params,
                seed=derived_seed(settings.seed, "eval", name, first),
            )
            answers = [p for p in chunk for _ in range(settings.n_samples)]
            scores = scorer.score([(p.verifier, text, p.answer) for p, text in zip(answers, rollouts.texts)])
            per_problem = torch.tensor(scores).reshape(len(chunk), settings.n_samples)
            correct = (per_problem >= 1.0).sum(1)
            for metric in metrics.values():
                metric.update(correct, settings.n_samples)
            correct_total += float(per_problem.sum())
            tokens += int(rollouts.response_mask.sum())
            elapsed = time.perf_counter() - start
            if elapsed > PROGRESS_AFTER_S:
                log.info(
                    "%s: %d/%d batches of %d prompts × %d samples, %.0f s, about %.0f s left",
                    name,
                    done,
                    len(batches),
                    settings.batch_prompts,
                    settings.n_samples,
                    elapsed,
                    elapsed / done * (len(batches) - done),
                )
            if handle:
                for row, (problem, text, score, reason) in enumerate(
                    zip(answers, rollouts.texts, scores, rollouts.finish_reasons)
                ):
                    handle.write(
                        json.dumps(
                            {
                                "id": problem.id,
                                "sample": row % settings.n_samples,
                                "score": score,
                                "answer": problem.answer,
                                "finish_reason": reason,
                                "response": text,
                            }
                        )
                        + "\n"
                    )
    finally:
        if handle:
            handle.close()
    seconds = time.perf_counter() - start
    n_problems = len(kept)
    result = {
        "benchmark": name,
        "problems": n_problems,
        "skipped_long_prompts": skipped,
        "n_samples": settings.n_samples,
        **settings.decoding(),
        "max_new_tokens": settings.max_new_tokens,
        f"avg@{settings.n_samples}": correct_total / max(n_problems * settings.n_samples, 1),
        **{f"pass@{k}": float(m.compute()) for k, m in metrics.items()},
        "generated_tokens": tokens,
        "seconds": seconds,
    }
    return result


@dataclass(frozen=True)
class ValidationSet:
    """Held-out problems validated during training; metrics are logged as `val/<prefix>pass@k`."""

    prefix: str  # "" for the task's test split, "<benchmark>/" for an extra benchmark
    problems: list[Problem]
    instruction: str


class Validator:
    """Periodic validation during training: pass@k on each held-out set with the training prompt format."""

    def __init__(self, sets: list[ValidationSet], formatter: PromptFormatter, settings: EvalSettings) -> None:
        for validation_set in sets:
            if not validation_set.problems:
                raise ValueError(
                    f"validation set {validation_set.prefix or 'of the task'!r} has no problems: raise "
                    "validation.limit or set validation.every_n_steps=0"
                )
        self.sets, self.formatter, self.settings = sets, formatter, settings

    def __call__(self, engine: RolloutEngine, scorer: SafeScorer) -> dict[str, float]:
        out = {}
        for validation_set in self.sets:
            result = evaluate(
                f"val/{validation_set.prefix}".rstrip("/"),
                validation_set.problems,
                validation_set.instruction,
                engine,
                self.formatter,
                scorer,
                self.settings,
            )
            out.update(
                {
                    f"{validation_set.prefix}{key}": float(value)
                    for key, value in result.items()
                    if key.startswith(("pass@", "avg@"))
                }
            )
        return out
