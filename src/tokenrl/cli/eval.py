"""`python eval.py [overrides]`: pass@k of a model (optionally a training checkpoint) on benchmarks.

Writes, under the run folder: results.json (all benchmarks), <benchmark>.json, <benchmark>.samples.jsonl
(one line per sample: id, sample index, score, answer, finish reason, response — never the question text)
and summary.md (a table). Also the `tokenrl-eval` console script.
Each benchmark's result carries a `reproduce` record, as the harnesses' results files do: the model (folder or hub
id, checkpoint, dtype, tokenizer), the benchmark's data (Hub repository and revision, or the local file and its
sha256), the prompt (instruction, chat template on or off, the full template text with a `{question}` slot),
sampling (temperature, top-p, top-k, budgets, n, ks, seed and how each batch's seed derives from it), the engine,
the verifier, the command line and the versions of tokenrl, torch, transformers, vLLM and the verifier's parser.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import platform
import socket
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from tokenrl.cli.errors import report_user_error
from tokenrl.config.check import check_eval_config
from tokenrl.config.command_line import composition_problem
from tokenrl.data.benchmarks import LOCAL, Benchmark, benchmark, expand
from tokenrl.data.prompts import PromptFormatter, with_instruction
from tokenrl.evaluation.runner import EvalSettings, evaluate
from tokenrl.export.hf_folder import exported_from
from tokenrl.models import build_model, build_tokenizer
from tokenrl.paths import CONFIG_DIR
from tokenrl.records.settings import ModelSettings, RolloutSettings
from tokenrl.rewards.scorer import SafeScorer
from tokenrl.rollout import build_engine
from tokenrl.run.allocator import reexec_with_tcmalloc
from tokenrl.run.checkpointing import load_policy

log = logging.getLogger(__name__)


# errors of the user's settings or files: one line on the console, the traceback in the run's log (docs/errors.md)
USER_ERRORS = (ValueError, FileNotFoundError, PermissionError)
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _resolved(path: str | None) -> str | None:
    """An existing local path made absolute; anything else (a hub id, null) as given."""
    return str(Path(path).expanduser().resolve()) if path and Path(path).expanduser().exists() else path


def source_commit() -> str | None:
    """The git commit of this tokenrl checkout (`+dirty` with uncommitted changes); None outside a git checkout."""
    import subprocess

    root = Path(CONFIG_DIR).parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return (commit + ("+dirty" if dirty.stdout.strip() else "")) if head.returncode == 0 and commit else None


def data_record(bench: Benchmark, data_dir: str | None) -> dict[str, Any]:
    """Where the problems came from: the local file and its sha256, or the Hub repository, config, split, revision."""
    if data_dir:
        path = Path(data_dir).expanduser().resolve() / LOCAL[bench.name]
        return {"route": "local", "file": str(path), "sha256": _sha256(path) if path.is_file() else None}
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
    """Everything needed to reproduce one benchmark's numbers (results.json's `reproduce`)."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    rollout = {
        key: value
        for key, value in OmegaConf.to_container(cfg.rollout, resolve=True).items()
        if key not in TRAINING_SAMPLING
    }  # the evaluation samples by `eval.*` (recorded under "sampling")
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task)
    except ValueError:  # run() called without Hydra's runtime (tests, scripts)
        overrides = None
    return {
        "model": {
            "name": model["name"],
            "source": _resolved(model["source"]),
            "init": model["init"],
            "ckpt_path": _resolved(cfg.ckpt_path),
            "dtype": model["dtype"],
            "tokenizer": _resolved(model.get("tokenizer")) or "the source's",
            "lora": model.get("lora"),
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
        "engine": rollout,
        "verifiers": verifiers,
        "reward_timeout_s": float(cfg.reward_timeout_s),
        "versions": package_versions(),
        "tokenrl_commit": source_commit(),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]] if overrides is None else overrides,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def model_label(cfg: DictConfig) -> str:
    """What the evaluated weights are: a training checkpoint, random weights, a tokenrl export (with the run or
    checkpoint its model card names) or the base weights of `model.source`."""
    source = cfg.model.source
    if cfg.ckpt_path:
        return f"checkpoint `{_resolved(cfg.ckpt_path)}`"
    if cfg.model.init == "random":
        return f"random weights (seed {cfg.seed})"
    origin = exported_from(source)
    return f"`{_resolved(source)}`, exported by tokenrl from {origin}" if origin else f"base weights `{source}`"


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


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    check_eval_config(cfg)
    names = expand(OmegaConf.to_container(cfg.benchmark) if OmegaConf.is_list(cfg.benchmark) else str(cfg.benchmark))
    settings = ModelSettings.of(OmegaConf.to_container(cfg.model, resolve=True))
    tokenizer = build_tokenizer(settings)
    model = build_model(settings, seed=cfg.seed)
    if cfg.ckpt_path:
        load_policy(model, cfg.ckpt_path, settings, cfg.seed)
    model.eval()
    engine = build_engine(RolloutSettings.of(OmegaConf.to_container(cfg.rollout, resolve=True)), model, tokenizer)
    formatter = PromptFormatter(tokenizer, cfg.model.chat_template)
    scorer = SafeScorer(cfg.reward_timeout_s)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    label = model_label(cfg)
    results = []
    try:
        for name in names:
            bench = benchmark(name)
            problems = bench.load(cfg.paths.data_dir)
            if cfg.eval.limit:
                problems = problems[: int(cfg.eval.limit)]
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
            result = evaluate(
                name,
                problems,
                bench.instruction,
                engine,
                formatter,
                scorer,
                settings,
                samples_path=out_dir / f"{name}.samples.jsonl",
            )
            result.update(
                {
                    "model": cfg.model.name,
                    "weights": label,
                    "ckpt_path": cfg.ckpt_path,
                    "reproduce": reproduction_record(
                        cfg, bench, settings, formatter, sorted({p.verifier for p in problems})
                    ),
                }
            )
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


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
def evaluate_main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except USER_ERRORS as err:
        report_user_error(err)
        raise SystemExit(2) from None


def main() -> None:
    reexec_with_tcmalloc()
    problem = composition_problem(sys.argv[1:], "eval")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    evaluate_main()


if __name__ == "__main__":
    main()
