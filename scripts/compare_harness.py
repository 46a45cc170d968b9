"""Check tokenrl's evaluation against lm-evaluation-harness on the same problems, prompts and greedy decoding.

    export TOKENRL_DATA_DIR=/path/to/data            # gsm8k/test.jsonl and math500/test.jsonl (docs/data-and-evaluation.md)
    pip install -r requirements-harness.txt          # lm-eval, pinned (bash scripts/setup.sh --harness does it)
    python scripts/compare_harness.py --limit 50 --out benchmarks/harness_agreement.json

For each task (GSM8K: strict and flexible extraction; MATH-500: \\boxed{}), both sides generate from the same local
model folder (default: the offline SmolLM2-135M-Instruct that scripts/setup.sh prepares), greedily, with the same
token budget (tokenrl's per-benchmark default unless --max-new-tokens), batch size 1 on both sides (no padding):

- tokenrl: its own evaluation path (benchmarks.load -> PromptFormatter -> the `hf` rollout engine ->
  evaluation.runner.evaluate -> SafeScorer with the benchmark's verifier), greedy as top_k=1, n=1;
- the harness: lm_eval.simple_evaluate on the task configs in scripts/harness_tasks/ (its `json` loader on the same
  files, the same user turn, --apply_chat_template, until = EOS, do_sample=false, its own filters and metrics).

Per sample it records whether the prompts (token ids) and responses are identical, each side's extracted answer,
tokenrl's verifier on both responses and the harness's scorer on its own, and lists every disagreement; the
results file also says machine, date, versions, model and N. docs/harness.md explains the disagreements.

A small model rarely answers correctly, so generation alone shows the two scorers agreeing mostly on wrong answers.
`references` therefore also scores every problem's own reference solution (which must score 1) and the same solution
with its final answer changed (which must score 0) with both scorers, over the whole file (seconds, no generation).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import os
import platform
import re
import socket
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASK_DIR = ROOT / "scripts" / "harness_tasks"
DEFAULT_MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
TASKS = {"gsm8k": "tokenrl_gsm8k.yaml", "math500": "tokenrl_math500.yaml", "arithmetic": "tokenrl_arithmetic.yaml"}
VIEWS = {"gsm8k": ["strict", "flexible"], "math500": ["math"], "arithmetic": ["last_number", "flexible"]}
ARITHMETIC_CONFIG = ROOT / "configs" / "task" / "arithmetic.yaml"     # tokenrl's offline default task
GSM8K_IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]       # lm-eval gsm8k exact_match's regexes_to_ignore


# ---------------------------------------------------------------- extracted answers (what each scorer reads)
def tokenrl_strict_answer(response: str) -> str | None:
    """The number tokenrl's gsm8k_strict compares (None where it scores 0 without comparing): its own regexes."""
    from tokenrl.rewards import verifiers as v

    response = response.replace("\u2212", "-")
    markers = list(v._STRICT_MARKER.finditer(response))
    if not markers:
        return None
    line = v._STRICT_LINE.match(response, markers[-1].end())
    if line is None:
        return None
    number, rest = line.groups()
    if re.search(r"\d", rest) or v._OPERATOR_NEXT.match(rest):
        return None
    return number


def tokenrl_flexible_answer(response: str) -> str | None:
    from tokenrl.rewards.verifiers import last_number

    return last_number(response)


def tokenrl_math_answer(response: str) -> str | None:
    """The boxes tokenrl's math verifier compares (all must equal the gold), joined with ' | '."""
    from tokenrl.rewards.verifiers import boxed_all

    boxes = boxed_all(response)
    return " | ".join(dict.fromkeys(boxes)) if boxes else None


def harness_gsm8k_normal(answer: str | None) -> str | None:
    """A harness-filtered GSM8K answer as its exact_match compares it (regexes_to_ignore, lower case)."""
    if answer is None or answer == "[invalid]":
        return None
    for pattern in GSM8K_IGNORE:
        answer = re.sub(pattern, "", answer)
    return answer.lower().strip()


def number_value(text: str | None) -> Fraction | None:
    if text is None:
        return None
    try:
        return Fraction(text.replace(",", "").replace("$", "").rstrip("."))
    except (ValueError, ZeroDivisionError):
        return None


def same_answer(a: str | None, b: str | None, numeric: bool) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if numeric and number_value(a) is not None:
        return number_value(a) == number_value(b)
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


# ---------------------------------------------------------------- the two sides
def tokenrl_side(task: str, model_dir: Path, data_dir: Path | None, limit: int, max_new_tokens: int | None,
                 work: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    from tokenrl.data.benchmarks import benchmark
    from tokenrl.data.prompts import PromptFormatter, with_instruction
    from tokenrl.evaluation.runner import EvalSettings, evaluate
    from tokenrl.models import build_model, build_tokenizer
    from tokenrl.rewards.scorer import SafeScorer
    from tokenrl.rollout import build_engine

    model_cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "model" / "smollm2_135m.yaml"))
    model_cfg.update(source=str(model_dir), tokenizer=None, init="pretrained", dtype="fp32")
    tokenizer = build_tokenizer(model_cfg)
    model = build_model(model_cfg).eval()
    engine = build_engine({"engine": "hf"}, model, tokenizer)
    formatter = PromptFormatter(tokenizer, model_cfg.get("chat_template", "auto"))
    if task == "arithmetic":
        source = arithmetic_task()
        problems = source.problems("test")[:limit]
        instruction, budget = source.instruction, source.max_new_tokens
    else:
        bench = benchmark(task)
        problems = bench.load(data_dir)[:limit]
        instruction, budget = bench.instruction, bench.max_new_tokens
    settings = EvalSettings(n_samples=1, ks=(1,), temperature=1.0, top_p=1.0, top_k=1,   # top_k=1: greedy
                            max_new_tokens=int(max_new_tokens or budget), batch_prompts=1, seed=0)
    scorer = SafeScorer(5.0)
    samples = work / f"{task}.tokenrl.samples.jsonl"
    try:
        result = evaluate(task, problems, instruction, engine, formatter, scorer, settings,
                          samples_path=samples, progress=False)
        rows = [json.loads(line) for line in samples.read_text().splitlines()]
        flexible = (scorer.score([("gsm8k_flexible", r["response"], r["answer"]) for r in rows])
                    if task == "gsm8k" else None)
    finally:
        scorer.close()
    prompts = [formatter.text(with_instruction(p.question, instruction)) for p in problems]
    prompt_ids = [formatter.token_ids(with_instruction(p.question, instruction)) for p in problems]
    return {"result": result, "rows": rows, "flexible": flexible, "prompts": prompts, "prompt_ids": prompt_ids,
            "problems": problems, "tokenizer": tokenizer, "max_new_tokens": settings.max_new_tokens,
            "instruction": instruction}


def arithmetic_task() -> Any:
    """tokenrl's offline default task, built from configs/task/arithmetic.yaml as `python train.py` builds it."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.load(ARITHMETIC_CONFIG), _convert_="all")


def write_arithmetic_docs(problems: list[Any], folder: Path) -> Path:
    """The task's problems as a JSONL for the harness's `json` loader: `folder`/arithmetic/test.jsonl, one
    {"id", "question", "answer"} per line (generated problems, not benchmark data). Returns `folder`."""
    (folder / "arithmetic").mkdir(parents=True, exist_ok=True)
    (folder / "arithmetic" / "test.jsonl").write_text(
        "".join(json.dumps({"id": p.id, "question": p.question, "answer": p.answer}) + "\n" for p in problems))
    return folder


def harness_side(task: str, model_dir: Path, data_dir: Path, limit: int, max_new_tokens: int) -> dict[str, Any]:
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    config = copy.deepcopy(harness_config(task))
    config["dataset_kwargs"] = {"data_files": {split: str(data_dir / rel) for split, rel in
                                               config["dataset_kwargs"]["data_files"].items()}}
    config["generation_kwargs"]["max_gen_toks"] = max_new_tokens
    lm = HFLM(pretrained=str(model_dir), dtype="float32", device="cpu", batch_size=1)
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=[config], limit=limit, apply_chat_template=True, log_samples=True,
                                  num_fewshot=0, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                  fewshot_random_seed=0, bootstrap_iters=0)
    seconds = time.perf_counter() - start
    name = config["task"]
    return {"results": out["results"][name], "samples": out["samples"][name], "seconds": seconds,
            "config": {k: v for k, v in config.items() if k not in ("process_results",)}}


# ---------------------------------------------------------------- comparison
def compare(task: str, mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    from tokenrl.rewards.verifiers import gsm8k_flexible, gsm8k_strict, math_boxed

    tokenizer = mine["tokenizer"]
    by_doc: dict[int, dict[str, dict]] = {}
    for sample in theirs["samples"]:
        by_doc.setdefault(int(sample["doc_id"]), {})[sample.get("filter", "none")] = sample
    views = VIEWS[task]
    per_sample, counts = [], {"prompt_identical": 0, "response_identical": 0}
    for view in views:
        counts.update({f"{view}/answer_agree": 0, f"{view}/score_agree": 0,
                       f"{view}/tokenrl_verifier_same_on_both": 0, f"{view}/scorer_agree_on_harness_response": 0,
                       f"{view}/tokenrl_correct": 0, f"{view}/harness_correct": 0})
    if task == "math500":
        counts.update({"math/harness_math_verify_correct": 0, "math/tokenrl_verifier_on_harness_response_correct": 0})
    n = len(mine["rows"])
    for index, row in enumerate(mine["rows"]):
        docs = by_doc[index]
        first = next(iter(docs.values()))
        context = first["arguments"]["gen_args_0"]["arg_0"] if isinstance(first["arguments"], dict) \
            else first["arguments"][0][0]
        theirs_response = first["resps"][0][0]
        harness_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
        prompt_same = context == mine["prompts"][index] and harness_ids == mine["prompt_ids"][index]
        response_same = theirs_response == row["response"]
        counts["prompt_identical"] += prompt_same
        counts["response_identical"] += response_same
        entry: dict[str, Any] = {"id": row["id"], "doc_id": index, "gold": row["answer"], "prompt_identical": prompt_same,
                                 "response_identical": response_same, "finish_reason": row["finish_reason"],
                                 "tokenrl_response_tokens": len(tokenizer(row["response"], add_special_tokens=False)
                                                                ["input_ids"]),
                                 "harness_response_tokens": len(tokenizer(theirs_response, add_special_tokens=False)
                                                                ["input_ids"])}
        for view in views:
            if view == "strict":
                extract, verify, numeric = tokenrl_strict_answer, gsm8k_strict, True
                h = docs["strict-match"]
                h_answer, h_score = harness_gsm8k_normal(h["filtered_resps"][0]), float(h["exact_match"])
                t_score = float(row["score"])
            elif view == "flexible" and task == "gsm8k":
                extract, verify, numeric = tokenrl_flexible_answer, gsm8k_flexible, True
                h = docs["flexible-extract"]
                h_answer, h_score = harness_gsm8k_normal(h["filtered_resps"][0]), float(h["exact_match"])
                t_score = float(mine["flexible"][index])
            elif task == "arithmetic":        # tokenrl's reward is gsm8k_flexible; two harness scorers of the text
                from scripts.harness_tasks import arithmetic_utils

                extract, verify, numeric = tokenrl_flexible_answer, gsm8k_flexible, True
                h = docs["none"]
                if view == "last_number":     # tokenrl's check, reimplemented in the harness task
                    h_answer, h_score = arithmetic_utils.last_number(theirs_response), float(h["exact_match"])
                else:                         # the harness's stock gsm8k flexible-extract + exact_match
                    h_answer = harness_gsm8k_normal(arithmetic_utils.flexible_pick(theirs_response))
                    h_score = float(h["flexible_extract"])
                t_score = float(row["score"])
            else:
                from scripts.harness_tasks.utils import boxed_answer

                extract, verify, numeric = tokenrl_math_answer, math_boxed, False
                h = docs["none"]
                h_answer, h_score = boxed_answer(theirs_response), float(h["exact_match"])
                t_score = float(row["score"])
                entry["harness_math_verify"] = float(h["math_verify"])
                counts["math/harness_math_verify_correct"] += float(h["math_verify"])
            t_answer = extract(row["response"])
            t_on_theirs_answer = extract(theirs_response)
            t_on_theirs = float(verify(theirs_response, row["answer"]))
            answer_agree = same_answer(t_answer, h_answer, numeric)
            score_agree = t_score == h_score
            counts[f"{view}/answer_agree"] += answer_agree
            counts[f"{view}/score_agree"] += score_agree
            counts[f"{view}/tokenrl_verifier_same_on_both"] += t_score == t_on_theirs
            counts[f"{view}/scorer_agree_on_harness_response"] += t_on_theirs == h_score
            counts[f"{view}/tokenrl_correct"] += t_score
            counts[f"{view}/harness_correct"] += h_score
            if view == "math":
                counts["math/tokenrl_verifier_on_harness_response_correct"] += t_on_theirs
            entry[view] = {"tokenrl_answer": t_answer, "harness_answer": h_answer,
                           "tokenrl_verifier_on_harness_response_answer": t_on_theirs_answer,
                           "tokenrl_score": t_score, "harness_score": h_score,
                           "tokenrl_verifier_on_harness_response": t_on_theirs,
                           "answer_agree": answer_agree, "score_agree": score_agree}
        if task == "arithmetic":      # generated problems (not benchmark data) and short responses: kept whole
            entry.update(question=mine["problems"][index].question, tokenrl_response=row["response"],
                         harness_response=theirs_response)
        per_sample.append(entry)
    agreement = {key: value / max(n, 1) for key, value in counts.items()}
    disagreements = [e for e in per_sample if not e["response_identical"] or not e["prompt_identical"]
                     or any(not e[v]["answer_agree"] or not e[v]["score_agree"] for v in views)]
    harness_metrics = {k: v for k, v in theirs["results"].items() if isinstance(v, (int, float)) and "stderr" not in k}
    return {"n": n, "counts": counts, "agreement": agreement, "harness_metrics": harness_metrics,
            "tokenrl_result": mine["result"], "harness_seconds": theirs["seconds"],
            "disagreements": [shorten(e) for e in disagreements], "samples": [shorten(e) for e in per_sample]}


def shorten(entry: dict[str, Any]) -> dict[str, Any]:
    return entry


# ---------------------------------------------------------------- reference solutions through both scorers
def wrong_final_answer(solution: str, task: str) -> str:
    """The reference solution with its final answer changed: GSM8K's `#### N` -> `#### N+1`, arithmetic's
    `a + b = N` -> `a + b = N+1`, MATH's last box \\boxed{X} -> \\boxed{X+1} (both scorers must say 0)."""
    if task == "arithmetic":
        head, _, tail = solution.rpartition("= ")
        return f"{head}= {int(tail) + 1}"
    if task == "gsm8k":
        head, _, tail = solution.rpartition("#### ")
        value = number_value(tail.strip())
        return f"{head}#### {(value + 1) if value is not None else tail.strip() + '1'}"
    from scripts.harness_tasks.utils import boxed_answer

    answer = boxed_answer(solution)
    start = solution.rfind("\\boxed{")
    return solution if answer is None else solution[:start] + f"\\boxed{{{answer}+1}}" + solution[
        start + len("\\boxed{") + len(answer) + 1:]


def harness_scores(task: str, solution: str, doc: dict[str, Any]) -> dict[str, float]:
    """The harness's own scorers on one response: the filters and exact_match of scripts/harness_tasks/
    tokenrl_gsm8k.yaml (read from it, so they cannot drift), or the MATH task's process_results."""
    if task == "gsm8k":
        from lm_eval.api.metrics import exact_match_hf_evaluate
        from lm_eval.filters.extraction import RegexFilter

        config = harness_config("gsm8k")
        metric = {k: v for k, v in config["metric_list"][0].items() if k not in ("metric", "aggregation",
                                                                                "higher_is_better")}
        out = {}
        for entry in config["filter_list"]:
            regex = entry["filter"][0]
            picked = list(RegexFilter(regex_pattern=regex["regex_pattern"], group_select=regex.get("group_select", 0))
                          .apply([[solution]], [doc]))[0][0]
            view = entry["name"].split("-")[0]            # strict-match -> strict, flexible-extract -> flexible
            out[view] = float(exact_match_hf_evaluate(predictions=[picked], references=[doc["answer"]],
                                                      **metric)["exact_match"])
        return out
    if task == "arithmetic":
        from scripts.harness_tasks.arithmetic_utils import process_results as arithmetic_results

        scores = arithmetic_results(doc, [solution])
        return {"last_number": float(scores["exact_match"]), "flexible": float(scores["flexible_extract"])}
    from scripts.harness_tasks.utils import process_results

    return {"math": float(process_results(doc, [solution])["exact_match"])}


@functools.lru_cache(maxsize=None)
def harness_config(task: str) -> dict[str, Any]:
    """The harness task config of `task` (scripts/harness_tasks/), as lm-eval reads it."""
    from lm_eval.tasks._yaml_loader import load_yaml   # lm-eval 0.4.13: reads `!function` tags

    return load_yaml(TASK_DIR / TASKS[task])


def reference_check(task: str, data_dir: Path | None, limit: int | None = None) -> dict[str, Any]:
    """Every problem's (or the first `limit` problems') reference solution, and the same with a wrong final answer,
    through tokenrl's verifiers (in the time-limited SafeScorer, as evaluation runs them) and the harness's scorers."""
    from tokenrl.data.benchmarks import benchmark
    from tokenrl.rewards.scorer import SafeScorer

    if task == "arithmetic":      # the reference "solution" is the worked sum `a + b = N`
        problems = arithmetic_task().problems("test")
        docs = [{"id": p.id, "question": p.question, "answer": p.answer,
                 "solution": f"{p.question.removeprefix('What is ').removesuffix('?')} = {p.answer}"} for p in problems]
    else:
        bench = benchmark(task)
        problems = bench.load(data_dir)
        docs = [json.loads(line) for line in (data_dir / task / "test.jsonl").read_text().splitlines() if line.strip()]
    assert len(docs) == len(problems), f"{task}: {len(docs)} rows vs {len(problems)} problems"
    problems, docs = problems[:limit], docs[:limit]
    solution_key = "answer" if task == "gsm8k" else "solution"
    views = ({"strict": "gsm8k_strict", "flexible": "gsm8k_flexible"} if task == "gsm8k" else
             {"last_number": None, "flexible": None} if task == "arithmetic" else {"math": None})
    counts: dict[str, int] = {}
    disagreements = []
    scorer = SafeScorer(5.0)
    try:
        for kind in ("reference", "wrong_answer"):
            responses = [doc[solution_key] if kind == "reference" else wrong_final_answer(doc[solution_key], task)
                         for doc in docs]
            harness = [harness_scores(task, r, doc) for r, doc in zip(responses, docs)]   # every view at once
            for view, verifier in views.items():
                mine = scorer.score([(verifier or p.verifier, r, p.answer) for p, r in zip(problems, responses)])
                theirs = [scores[view] for scores in harness]
                counts[f"{kind}/{view}/tokenrl_correct"] = int(sum(mine))
                counts[f"{kind}/{view}/harness_correct"] = int(sum(theirs))
                counts[f"{kind}/{view}/agree"] = sum(a == b for a, b in zip(mine, theirs))
                disagreements += [{"id": p.id, "kind": kind, "view": view, "gold": p.answer, "tokenrl": a,
                                   "harness": b, "response_tail": r[-160:]}
                                  for p, r, a, b in zip(problems, responses, mine, theirs) if a != b]
    finally:
        scorer.close()
    return {"n": len(docs), "counts": counts, "disagreements": disagreements}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for package in ("tokenrl", "lm_eval", "transformers", "torch", "datasets", "math-verify", "tokenizers"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


def git_commit() -> str | None:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


def table(report: dict[str, Any]) -> str:
    lines = ["| task | view | N | prompts same | responses same | answers agree | scores agree | "
             "tokenrl verifier = harness scorer (same text) | tokenrl acc | harness acc |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for task, r in report["tasks"].items():
        a, c, n = r["agreement"], r["counts"], r["n"]
        for view in VIEWS[task]:
            lines.append(f"| {task} | {view} | {n} | {c['prompt_identical']}/{n} | {c['response_identical']}/{n} | "
                         f"{c[f'{view}/answer_agree']}/{n} | {c[f'{view}/score_agree']}/{n} | "
                         f"{c[f'{view}/scorer_agree_on_harness_response']}/{n} | "
                         f"{a[f'{view}/tokenrl_correct']:.3f} | {a[f'{view}/harness_correct']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=50, help="first N problems of each task")
    parser.add_argument("--limit-math", type=int, default=None, help="MATH-500 problems (default: --limit)")
    parser.add_argument("--tasks", "--task", default="gsm8k,math500",
                        help="comma-separated: gsm8k, math500, arithmetic (tokenrl's offline default task: its "
                             "held-out test problems, generated; no data files; give it a trained policy with --model)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="a local HF model folder (e.g. a run's "
                        "logs/train/runs/<time>/model/)")
    parser.add_argument("--data-dir", default=os.environ.get("TOKENRL_DATA_DIR"))
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: tokenrl's per benchmark (1024)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", default=None, help="write the JSON report here")
    parser.add_argument("--references-only", action="store_true",
                        help="only the reference-solution check (no generation; seconds)")
    parser.add_argument("--references-limit", type=int, default=None,
                        help="reference solutions of the first N problems (default: the whole file)")
    args = parser.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        parser.error(f"--tasks: unknown {unknown}; known: {sorted(TASKS)}")
    if not args.data_dir and set(tasks) - {"arithmetic"}:
        parser.error("set TOKENRL_DATA_DIR or --data-dir (the folder with gsm8k/test.jsonl and math500/test.jsonl)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(args.threads)
    data_dir = Path(args.data_dir).resolve() if args.data_dir else None
    model_dir = Path(args.model).resolve()
    report: dict[str, Any] = {
        "what": "tokenrl evaluation vs lm-evaluation-harness, same problems/prompts/model, greedy (docs/harness.md)",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"host": socket.gethostname(), "platform": platform.platform(), "processor": platform.processor()
                    or platform.machine(), "cpus": os.cpu_count(), "torch_threads": args.threads, "device": "cpu"},
        "versions": versions(), "git_commit": git_commit(),
        "model": {"folder": str(model_dir.relative_to(ROOT)) if model_dir.is_relative_to(ROOT) else str(model_dir),
                  "dtype": "float32"},
        "decoding": {"greedy": True, "tokenrl": "hf engine, top_k=1, n=1, one prompt per generate call",
                     "harness": "HFLM batch_size=1, do_sample=false, until=[EOS]"},
        "command": "python scripts/compare_harness.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "tasks": {}}
    report["references"] = {}
    for task in tasks:
        report["references"][task] = reference_check(task, data_dir, args.references_limit)
        print(f"{task} reference solutions: {report['references'][task]['counts']}", flush=True)
        if args.references_only:
            continue
        limit = args.limit_math if task == "math500" and args.limit_math is not None else args.limit
        with tempfile.TemporaryDirectory() as work:
            start = time.perf_counter()
            mine = tokenrl_side(task, model_dir, data_dir, limit, args.max_new_tokens, Path(work))
            tokenrl_seconds = time.perf_counter() - start
            docs_dir = write_arithmetic_docs(mine["problems"], Path(work)) if task == "arithmetic" else data_dir
            theirs = harness_side(task, model_dir, docs_dir, limit, mine["max_new_tokens"])
        result = compare(task, mine, theirs)
        data_file = ({"generated": f"tokenrl.data.tasks.ArithmeticTask, {ARITHMETIC_CONFIG.relative_to(ROOT)}, "
                                   f"split 'test', first {limit}", "written_to": "a temporary arithmetic/test.jsonl"}
                     if task == "arithmetic" else str(Path(task) / "test.jsonl"))
        result.update({"data_file": data_file, "max_new_tokens": mine["max_new_tokens"],
                       "instruction": mine["instruction"], "harness_task": f"scripts/harness_tasks/{TASKS[task]}",
                       "tokenrl_seconds": tokenrl_seconds})
        report["tasks"][task] = result
        print(f"{task}: {result['n']} problems, tokenrl {tokenrl_seconds:.0f} s, harness {theirs['seconds']:.0f} s",
              flush=True)
    print(table(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


if __name__ == "__main__":
    main()
