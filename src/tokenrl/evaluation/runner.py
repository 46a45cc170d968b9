"""Evaluation: sample n completions per problem, score them (time-limited) and compute pass@k
(`ProblemSet.evaluate`); during training on held-out sets (`Validator`); and `python eval.py`'s benchmarks
(`evaluate_benchmarks`), written under the run folder with a `reproduce` record each (docs/data-and-evaluation.md)."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import platform
import socket
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, cast

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tokenrl.data.benchmarks import LOCAL, Benchmark, benchmark
from tokenrl.data.prompts import PromptFormatter, with_instruction
from tokenrl.evaluation.passk import PassAtK
from tokenrl.paths import CONFIG_DIR
from tokenrl.records.problem import Problem
from tokenrl.records.settings import ModelSettings
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


@dataclass(frozen=True)
class ProblemSet:
    """Problems and the instruction their prompts add, under a name (in the logs, results and batch seeds)."""

    name: str
    problems: list[Problem]
    instruction: str

    def evaluate(
        self,
        engine: RolloutEngine,
        formatter: PromptFormatter,
        scorer: SafeScorer,
        settings: EvalSettings,
        samples_path: Path | None = None,
    ) -> dict:
        """pass@k for k in settings.ks, avg@n and counts; a JSON line per sample in `samples_path` (no question text).
        Prompts over `max_prompt_length` tokens are skipped; after `PROGRESS_AFTER_S`, each batch logs its progress."""
        if any(k > settings.n_samples for k in settings.ks):
            raise ValueError(
                f"eval.ks={list(settings.ks)} needs eval.n_samples >= {max(settings.ks)} (got {settings.n_samples})"
            )
        prompts, kept = [], []
        for problem in self.problems:
            ids = formatter.token_ids(with_instruction(problem.question, self.instruction))
            if len(ids) <= settings.max_prompt_length:
                prompts.append(ids)
                kept.append(problem)
        skipped = len(self.problems) - len(kept)
        if skipped:
            log.warning("%s: skipped %d prompts longer than %d tokens", self.name, skipped, settings.max_prompt_length)
        params = SamplingParams(
            settings.n_samples, settings.temperature, settings.top_p, settings.top_k, settings.max_new_tokens
        )
        metrics = {k: PassAtK(k) for k in settings.ks}
        correct_total, tokens, start = 0.0, 0, time.perf_counter()
        with samples_path.open("w") if samples_path else nullcontext() as handle:
            batches = range(0, len(kept), settings.batch_prompts)
            for done, first in enumerate(batches, start=1):
                batch = slice(first, first + settings.batch_prompts)
                chunk = kept[batch]
                seed = derived_seed(settings.seed, "eval", self.name, first)
                rollouts = engine.generate(prompts[batch], params, seed=seed)
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
                        self.name,
                        done,
                        len(batches),
                        settings.batch_prompts,
                        settings.n_samples,
                        elapsed,
                        elapsed / done * (len(batches) - done),
                    )
                if handle:
                    rows = zip(answers, rollouts.texts, scores, rollouts.finish_reasons)
                    for row, (problem, text, score, reason) in enumerate(rows):
                        sample = {
                            "id": problem.id,
                            "sample": row % settings.n_samples,
                            "score": score,
                            "answer": problem.answer,
                            "finish_reason": reason,
                            "response": text,
                        }
                        handle.write(json.dumps(sample) + "\n")
        n_problems = len(kept)
        return {
            "benchmark": self.name,
            "problems": n_problems,
            "skipped_long_prompts": skipped,
            "n_samples": settings.n_samples,
            **settings.decoding(),
            "max_new_tokens": settings.max_new_tokens,
            f"avg@{settings.n_samples}": correct_total / max(n_problems * settings.n_samples, 1),
            **{f"pass@{k}": float(m.compute()) for k, m in metrics.items()},
            "generated_tokens": tokens,
            "seconds": time.perf_counter() - start,
        }


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
        for held_out in self.sets:
            problem_set = ProblemSet(f"val/{held_out.prefix}".rstrip("/"), held_out.problems, held_out.instruction)
            result = problem_set.evaluate(engine, self.formatter, scorer, self.settings)
            scores = {key: float(value) for key, value in result.items() if key.startswith(("pass@", "avg@"))}
            out.update({f"{held_out.prefix}{key}": value for key, value in scores.items()})
        return out


# rollout.* keys of training that eval ignores (it samples by eval.*)
TRAINING_SAMPLING = ("temperature", "top_p", "top_k", "max_new_tokens", "max_prompt_length")
VERSIONED = ("tokenrl", "torch", "transformers", "vllm", "math-verify", "datasets", "lightning", "peft")


def package_versions() -> dict[str, str | None]:
    """Installed versions of what decides a number (None: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for package in VERSIONED:
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def resolved_path(path: str | None) -> str | None:
    """An existing local path made absolute; anything else (a hub id, null) as given."""
    return str(Path(path).expanduser().resolve()) if path and Path(path).expanduser().exists() else path


def source_commit() -> str | None:
    """The git commit of this tokenrl checkout (`+dirty` with uncommitted changes); None outside a git checkout."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=Path(CONFIG_DIR).parent, capture_output=True, text=True, timeout=10)

    try:
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return (commit + ("+dirty" if dirty.stdout.strip() else "")) if head.returncode == 0 and commit else None


def data_record(bench: Benchmark, data_dir: str | None) -> dict[str, Any]:
    """Where the problems came from: the local file and its sha256, or the Hub repository, config, split, revision."""
    if data_dir:
        path = Path(data_dir).expanduser().resolve() / LOCAL[bench.name]
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        return {"route": "local", "file": str(path), "sha256": sha256}
    hub = bench.hub
    return {
        "route": "hub",
        "repo": hub.repo,
        "configs": [c for c in hub.configs if c] or None,
        "split": hub.split,
        "revision": hub.revision or "main (no pinned revision)",
        "columns_renamed": hub.columns or None,
    }


def reproduction_record(
    cfg: DictConfig, bench: Benchmark, settings: EvalSettings, formatter: PromptFormatter, verifiers: list[str]
) -> dict[str, Any]:
    """Everything needed to reproduce one benchmark's numbers (results.json's `reproduce`): model, data (the local
    file's sha256 or the Hub revision), prompt template, sampling and seeds, engine, verifiers, command and versions."""
    model = ModelSettings.of(cast("dict[str, Any]", OmegaConf.to_container(cfg.model, resolve=True)))
    rollout = cast("dict[str, Any]", OmegaConf.to_container(cfg.rollout, resolve=True))
    # without Hydra's runtime (tests, scripts): the process's command line
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
    return {
        "model": {
            "name": model.name,
            "source": resolved_path(model.source),
            "init": model.init,
            "ckpt_path": resolved_path(cfg.ckpt_path),
            "dtype": model.dtype,
            "tokenizer": resolved_path(model.tokenizer) or "the source's",
            "lora": model.lora,
        },
        "benchmark": {"name": bench.name, **data_record(bench, cfg.paths.data_dir), "limit": cfg.eval.limit},
        "prompt": {
            "instruction": bench.instruction,
            "chat_template": formatter.chat,
            "system_prompt": formatter.system_prompt,
            "max_prompt_length": settings.max_prompt_length,
            "template": formatter.text(with_instruction("{question}", bench.instruction)),
        },
        "sampling": {
            "n": settings.n_samples,
            "ks": list(settings.ks),
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "top_k": settings.top_k,
            "max_new_tokens": settings.max_new_tokens,
            "batch_prompts": settings.batch_prompts,
            "seed": settings.seed,
            "batch_seed": "derived_seed(seed, 'eval', benchmark, index of the batch's first prompt)",
            "stop": "the tokenizer's and generation config's EOS tokens",
        },
        "engine": {key: value for key, value in rollout.items() if key not in TRAINING_SAMPLING},
        "verifiers": verifiers,
        "reward_timeout_s": float(cfg.reward_timeout_s),
        "versions": package_versions(),
        "tokenrl_commit": source_commit(),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]] if overrides is None else overrides,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def summary_table(results: list[dict[str, Any]], ks: list[int]) -> str:
    head = "| benchmark | problems | n | " + " | ".join(f"pass@{k}" for k in ks) + " | seconds |"
    rule = "|---|---|---|" + "---|" * len(ks) + "---|"
    rows = [
        f"| {r['benchmark']} | {r['problems']} | {r['n_samples']} | "
        + " | ".join(f"{100 * r[f'pass@{k}']:.2f}" for k in ks)
        + f" | {r['seconds']:.0f} |"
        for r in results
    ]
    return "\n".join([head, rule, *rows])


def evaluate_benchmarks(
    cfg: DictConfig, names: list[str], engine: RolloutEngine, formatter: PromptFormatter, label: str
) -> list[dict[str, Any]]:
    """pass@k of `engine`'s model (`label`: what its weights are) on each benchmark of `names`, sampled by `cfg.eval`,
    written under `paths.output_dir` and printed as a table."""
    scorer = SafeScorer(cfg.reward_timeout_s)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for name in names:
            bench = benchmark(name)
            problems = bench.load(cfg.paths.data_dir)[: int(cfg.eval.limit) if cfg.eval.limit else None]
            settings = EvalSettings(
                n_samples=int(cfg.eval.n_samples or bench.n_samples),
                ks=tuple(cfg.eval.ks),
                temperature=float(cfg.eval.temperature),
                top_p=float(cfg.eval.top_p),
                top_k=int(cfg.eval.get("top_k") or 0),  # 1: greedy
                max_new_tokens=int(cfg.eval.max_new_tokens or bench.max_new_tokens),
                max_prompt_length=int(cfg.eval.max_prompt_length),
                batch_prompts=int(cfg.eval.batch_prompts),
                seed=int(cfg.seed),
            )
            problem_set = ProblemSet(name, problems, bench.instruction)
            result = problem_set.evaluate(engine, formatter, scorer, settings, out_dir / f"{name}.samples.jsonl")
            record = reproduction_record(cfg, bench, settings, formatter, sorted({p.verifier for p in problems}))
            result.update(model=cfg.model.name, weights=label, ckpt_path=cfg.ckpt_path, reproduce=record)
            (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2))
            results.append(result)
            log.info("%s: %s", name, {k: v for k, v in result.items() if k.startswith(("pass@", "avg@"))})
    finally:
        scorer.close()
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    table = summary_table(results, list(cfg.eval.ks))
    (out_dir / "summary.md").write_text(f"# {cfg.model.name}: {label}, {time.strftime('%Y-%m-%d')}\n\n{table}\n")
    print(table)
    return results
