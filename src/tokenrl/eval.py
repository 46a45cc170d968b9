"""`python eval.py [overrides]`: pass@k of a model (optionally a training checkpoint) on benchmarks.

Writes, under the run folder: results.json (all benchmarks), <benchmark>.json, <benchmark>.samples.jsonl
(one line per sample: id, sample index, score, answer, finish reason, response — never the question text)
and summary.md (a table). Also the `tokenrl-eval` console script.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from tokenrl.allocator import reexec_with_tcmalloc
from tokenrl.checkpointing import policy_state_dict
from tokenrl.data.benchmarks import benchmark, expand
from tokenrl.data.prompts import PromptFormatter
from tokenrl.evaluation.runner import EvalSettings, evaluate
from tokenrl.models import build_model, build_tokenizer
from tokenrl.paths import CONFIG_DIR
from tokenrl.rewards.scorer import SafeScorer
from tokenrl.rollout import build_engine

log = logging.getLogger(__name__)


def load_policy_weights(model: torch.nn.Module, ckpt_path: str) -> None:
    """Load the policy of a tokenrl training checkpoint (a .ckpt file or a sharded checkpoint's folder) into `model`."""
    model.load_state_dict(policy_state_dict(ckpt_path))


def summary_table(results: list[dict[str, Any]], ks: list[int]) -> str:
    head = "| benchmark | problems | n | " + " | ".join(f"pass@{k}" for k in ks) + " | seconds |"
    rule = "|---|---|---|" + "---|" * len(ks) + "---|"
    rows = [f"| {r['benchmark']} | {r['problems']} | {r['n_samples']} | "
            + " | ".join(f"{100 * r[f'pass@{k}']:.2f}" for k in ks) + f" | {r['seconds']:.0f} |" for r in results]
    return "\n".join([head, rule, *rows])


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    names = expand(OmegaConf.to_container(cfg.benchmark) if OmegaConf.is_list(cfg.benchmark) else str(cfg.benchmark))
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    tokenizer = build_tokenizer(model_cfg)
    model = build_model(model_cfg, seed=cfg.seed)
    if cfg.ckpt_path:
        load_policy_weights(model, cfg.ckpt_path)
    model.eval()
    engine = build_engine(OmegaConf.to_container(cfg.rollout, resolve=True), model, tokenizer)
    formatter = PromptFormatter(tokenizer, cfg.model.chat_template)
    scorer = SafeScorer(cfg.reward_timeout_s)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for name in names:
            bench = benchmark(name)
            problems = bench.load(cfg.paths.data_dir)
            if cfg.eval.limit:
                problems = problems[: int(cfg.eval.limit)]
            settings = EvalSettings(n_samples=int(cfg.eval.n_samples or bench.n_samples), ks=tuple(cfg.eval.ks),
                                    temperature=float(cfg.eval.temperature), top_p=float(cfg.eval.top_p),
                                    max_new_tokens=int(cfg.eval.max_new_tokens or bench.max_new_tokens),
                                    max_prompt_length=int(cfg.eval.max_prompt_length),
                                    batch_prompts=int(cfg.eval.batch_prompts), seed=int(cfg.seed))
            result = evaluate(name, problems, bench.instruction, engine, formatter, scorer, settings,
                              samples_path=out_dir / f"{name}.samples.jsonl")
            result.update({"model": cfg.model.name, "ckpt_path": cfg.ckpt_path})
            (out_dir / f"{name}.json").write_text(json.dumps(result, indent=2))
            results.append(result)
            log.info("%s: %s", name, {k: v for k, v in result.items() if k.startswith(("pass@", "avg@"))})
    finally:
        scorer.close()
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    table = summary_table(results, list(cfg.eval.ks))
    (out_dir / "summary.md").write_text(f"# {cfg.model.name} ({cfg.ckpt_path or 'initial weights'}), "
                                        f"{time.strftime('%Y-%m-%d')}\n\n{table}\n")
    print(table)
    return results


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
def evaluate_main(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    reexec_with_tcmalloc()
    evaluate_main()


if __name__ == "__main__":
    main()
