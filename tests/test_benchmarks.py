"""Benchmark loaders yield the documented counts with non-empty answers; bad input is named precisely."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from tokenrl.data.benchmarks import BENCHMARKS, PAPER, benchmark, expand, load_aime25
from tokenrl.data.records import DataFormatError
from tokenrl.evaluation.runner import EvalSettings, evaluate

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not on this machine")

COUNTS = {"gsm8k": 1319, "gsm8k_train": 7473, "math500": 500, "math_train": 7498, "mmlu_stem": 3018,
          "gpqa": 198, "aime23": 30, "aime24": 30, "aime25": 30, "amc23": 40, "olympiadbench": 675}


@needs_data
@pytest.mark.parametrize("name", sorted(COUNTS))
def test_documented_counts_and_answers(name):
    problems = BENCHMARKS[name].load(SHARED)
    assert len(problems) == COUNTS[name]
    assert all(p.answer.strip() and p.question.strip() for p in problems)
    assert len({p.id for p in problems}) == len(problems)
    if name.startswith("aime"):
        assert all(p.answer.isdigit() and 0 <= int(p.answer) <= 999 and p.answer == str(int(p.answer))
                   for p in problems)


@needs_data
def test_aime25_control_characters_are_repaired():
    problems = load_aime25(SHARED)
    assert not any(re.search(r"[\x00-\x08\x0b-\x1f]", p.question) or "\t" in p.question for p in problems)
    assert "\\frac" in problems[18].question and "\\triangle" in problems[19].question


@needs_data
def test_gpqa_choices_are_shuffled_with_a_fixed_seed():
    first, again = BENCHMARKS["gpqa"].load(SHARED), BENCHMARKS["gpqa"].load(SHARED)
    assert [p.answer for p in first] == [p.answer for p in again]
    letters = Counter(p.answer for p in first)
    assert set(letters) == set("ABCD") and min(letters.values()) > 30


@needs_data
def test_multiple_choice_questions_list_four_lettered_options():
    for name in ("mmlu_stem", "gpqa"):
        problem = BENCHMARKS[name].load(SHARED)[0]
        assert all(f"\n{letter}. " in problem.question for letter in "ABCD") and problem.verifier == "choice"


def test_paper_expands_to_the_seven():
    assert expand("paper") == list(PAPER) and len(PAPER) == 7
    assert expand(["gsm8k", "paper"]) == list(PAPER)
    assert expand("gsm8k,math500") == ["gsm8k", "math500"]


def test_unknown_benchmark_lists_the_valid_ones():
    with pytest.raises(KeyError, match="valid: .*'aime24'.*'paper'"):
        benchmark("aime2099")


def test_missing_data_dir_names_path_and_setting(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere/math500/test.jsonl.*paths.data_dir"):
        BENCHMARKS["math500"].load(tmp_path / "nowhere")


def test_malformed_record_names_file_and_line(tmp_path):
    (tmp_path / "amc23").mkdir()
    (tmp_path / "amc23" / "test.jsonl").write_text(json.dumps({"problem": "p", "answer": 3.0}) + "\n{broken\n")
    with pytest.raises(DataFormatError, match=r"amc23/test.jsonl:2: not valid JSON"):
        BENCHMARKS["amc23"].load(tmp_path)
    (tmp_path / "mmlu_stem").mkdir()
    (tmp_path / "mmlu_stem" / "test.jsonl").write_text(json.dumps({"question": "q", "choices": ["a"], "answer": 0}) + "\n")
    with pytest.raises(DataFormatError, match=r"mmlu_stem/test.jsonl:1: expected 4 choices"):
        BENCHMARKS["mmlu_stem"].load(tmp_path)


def test_evaluate_counts_and_files(tmp_path):
    """A real (tiny) engine; the verifier sees what was generated, so pass@k matches the written samples."""
    from tests.helpers.tiny import tiny_policy
    from tokenrl.data.prompts import PromptFormatter
    from tokenrl.data.records import Problem
    from tokenrl.rewards.scorer import SafeScorer
    from tokenrl.rollout.hf import HFEngine

    model, tok = tiny_policy()
    problems = [Problem(str(i), f"q{i}", "x", "tests.helpers.rewards:length_reward") for i in range(5)]
    scorer = SafeScorer(20.0)
    try:
        result = evaluate("toy", problems, "", HFEngine(model, tok), PromptFormatter(tok, False), scorer,
                          EvalSettings(n_samples=4, ks=(1, 4), max_new_tokens=14, batch_prompts=2),
                          samples_path=tmp_path / "toy.samples.jsonl", progress=False)
    finally:
        scorer.close()
    lines = [json.loads(line) for line in (tmp_path / "toy.samples.jsonl").read_text().splitlines()]
    assert len(lines) == 20 and result["problems"] == 5
    solved = Counter(line["id"] for line in lines if line["score"] >= 1.0)
    from tokenrl.evaluation.passk import pass_at_k
    assert result["pass@4"] == pytest.approx(sum(pass_at_k(4, solved.get(str(i), 0), 4) for i in range(5)) / 5)
    assert result["pass@1"] == pytest.approx(sum(solved.values()) / 20)
