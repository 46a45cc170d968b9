"""scripts/compare_harness.py: tokenrl's evaluation and lm-evaluation-harness on the same 3 GSM8K and 2 MATH-500
problems (offline SmolLM2-135M-Instruct, greedy, a short budget) see the same prompts, generate the same text and
their scorers agree (docs/harness.md); the extraction helpers read what the verifiers read."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, needs_data, once_per_run

sys.path.insert(0, str(ROOT))
from scripts.compare_harness import (
    DEFAULT_MODEL,
    arithmetic_task,
    harness_config,  # noqa: E402
    harness_gsm8k_normal,
    harness_scores,
    main,
    reference_check,
    tokenrl_flexible_answer,
    tokenrl_math_answer,
    tokenrl_strict_answer,
    write_arithmetic_docs,
    wrong_final_answer,
)

needs_harness = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None,
    reason="lm-eval is not installed: pip install -r requirements-harness.txt "
    "(scripts/setup.sh installs it where the package index has it)",
)
needs_model = pytest.mark.skipif(
    not (DEFAULT_MODEL / "config.json").exists(),
    reason=f"the offline default model is not prepared: bash scripts/setup.sh ({DEFAULT_MODEL})",
)


@pytest.fixture
def stock_index_once(monkeypatch, tmp_path_factory, worker_id):
    """lm-eval's TaskManager, built anew by each `simple_evaluate` (once per task of a comparison), indexes every YAML
    of its own stock tasks (~13,000 files, ~10-30 s here) before it loads the dict config the script passes: that scan
    of the installed package is read once per test run (tests/conftest.py's once_per_run) and handed to each build as
    a fresh copy, the index the scan gives. Any other path (none here) is scanned as before."""
    from lm_eval.tasks import _index

    build, stock = _index.TaskIndex.build, Path(_index.__file__).parent

    def build_once(paths, **kwargs):
        paths = list(paths)
        if paths != [stock] or kwargs:
            return build(paths, **kwargs)
        return once_per_run(tmp_path_factory, worker_id, "lm_eval_stock_index", lambda folder: build(paths))

    monkeypatch.setattr(_index.TaskIndex, "build", staticmethod(build_once))


@pytest.mark.parametrize(
    "response,strict,flexible",
    [
        ("so 3 + 4 = 7\n#### 7", "7", "7"),
        ("#### 1,234 dollars", "1,234", "1,234"),
        ("#### 5-3", None, None),  # an expression: neither verifier reads a number there
        ("The answer is **18**.", None, "18"),
        ("total: 2 + 3", None, None),  # a last operand is no answer for tokenrl (the harness takes `3`)
    ],
)
def test_gsm8k_extraction_mirrors_the_verifiers(response, strict, flexible):
    from tokenrl.rewards.verifiers import gsm8k_flexible, gsm8k_strict

    assert tokenrl_strict_answer(response) == strict and tokenrl_flexible_answer(response) == flexible
    for found, verify in ((strict, gsm8k_strict), (flexible, gsm8k_flexible)):
        if found is not None:
            assert verify(response, found.replace(",", "")) == 1.0
        else:
            assert all(verify(response, gold) == 0.0 for gold in ("7", "1234", "18", "2", "3", "5"))


def test_math_extraction_and_harness_normalisation():
    assert tokenrl_math_answer(r"so \boxed{\frac12} and \boxed{\frac12}") == r"\frac12"
    assert tokenrl_math_answer("no box") is None
    assert harness_gsm8k_normal("$1,234.") == "1234" and harness_gsm8k_normal("[invalid]") is None


@pytest.mark.slow
@needs_harness
@needs_model
@needs_data
def test_compare_harness_agrees_on_a_handful_of_problems(tmp_path, stock_index_once):
    out = tmp_path / "agreement.json"
    report = main(
        ["--limit", "3", "--limit-math", "2", "--max-new-tokens", "24", "--references-limit", "5", "--out", str(out)]
    )
    saved = json.loads(out.read_text())
    assert saved["versions"]["lm_eval"] == "0.4.13" and saved["versions"]["torch"] and saved["date"]
    assert saved["model"]["folder"].endswith("smollm2-135m-instruct")
    for task, n in (("gsm8k", 3), ("math500", 2)):
        result = report["tasks"][task]
        counts = result["counts"]
        assert result["n"] == n and saved["tasks"][task]["n"] == n and result["max_new_tokens"] == 24
        assert counts["prompt_identical"] == n, result["disagreements"]  # same chat prompt, same token ids
        assert counts["response_identical"] == n, result["disagreements"]  # greedy: the same text
        views = ["strict", "flexible"] if task == "gsm8k" else ["math"]
        for view in views:
            assert counts[f"{view}/tokenrl_verifier_same_on_both"] == n
        # every disagreement of answer or score is listed with both sides' extracted answers
        listed = {d["id"] for d in result["disagreements"]}
        for sample in result["samples"]:
            if any(not sample[v]["answer_agree"] or not sample[v]["score_agree"] for v in views):
                assert sample["id"] in listed
                assert all({"tokenrl_answer", "harness_answer"} <= set(sample[v]) for v in views)


@needs_harness
@needs_data
@pytest.mark.parametrize("task,views", [("gsm8k", ("strict", "flexible")), ("math500", ("math",))])
def test_both_scorers_accept_reference_solutions_and_refuse_a_changed_final_answer(task, views):
    from tests.conftest import DATA_DIR

    result = reference_check(task, Path(DATA_DIR), limit=25)
    counts = result["counts"]
    for view in views:
        assert counts[f"reference/{view}/tokenrl_correct"] == counts[f"reference/{view}/harness_correct"] == 25
        assert counts[f"wrong_answer/{view}/tokenrl_correct"] == 0
    assert result["n"] == 25


@needs_harness
def test_the_harness_math_check_drops_what_follows_a_unit_and_tokenrl_does_not():
    """docs/harness.md rule 6: the two MATH-500 wrong answers the harness scores 1 (test/prealgebra/1003, 1044)."""
    from tokenrl.rewards.verifiers import math_boxed

    gold = "\\frac{270}7\\text{ degrees}"
    changed = wrong_final_answer(f"so the angle is \\boxed{{{gold}}}.", "math500")
    assert changed == f"so the angle is \\boxed{{{gold}+1}}."
    assert harness_scores("math500", changed, {"answer": gold, "solution": f"\\boxed{{{gold}}}"})["math"] == 1.0
    assert math_boxed(changed, gold) == 0.0
    assert wrong_final_answer("2 + 2 = 4\n#### 4", "gsm8k") == "2 + 2 = 4\n#### 5"


# ---------------------------------------------------------------- task=arithmetic (the default run's task)
# (response, gold, tokenrl's reward = the harness task's exact_match, the harness's stock flexible-extract)
ARITHMETIC_ROWS = [
    ("7", "7", 1, 1),
    ("The answer is 7.", "7", 1, 1),
    ("3 + 4 = 7", "7", 1, 1),
    ("**7**", "7", 1, 1),
    ("7.0", "7", 1, 0),  # an exact number for tokenrl; the harness compares the string `7.0`
    ("\u22127", "-7", 1, 0),  # the Unicode minus: tokenrl reads -7, the harness's regex only `7`
    ("3 + 4 = 8", "7", 0, 0),
    ("The sum is 3 + 4", "4", 0, 1),  # a last operand is no answer for tokenrl; the harness takes `4`
    ("7 - 0", "0", 0, 1),
    ("H2O", "2", 0, 1),  # digits of a name are no number for tokenrl; the harness reads `2`
    ("12 apples, 1,2", "12", 0, 1),  # `1,2` is malformed for tokenrl; the harness deletes commas: `12`
    ("x^2", "2", 0, 1),  # an exponent
    ("\\frac{1}{2}", "2", 0, 1),  # a denominator
    ("no number", "7", 0, 0),
    ("", "7", 0, 0),
]


@needs_harness
@pytest.mark.parametrize("response,gold,tokenrl,stock", ARITHMETIC_ROWS)
def test_the_arithmetic_harness_task_scores_as_tokenrl_s_verifier(response, gold, tokenrl, stock):
    """scripts/harness_tasks/arithmetic_utils.py reimplements the task's verifier (gsm8k_flexible) without tokenrl:
    the same extracted number and score on every row; its second metric is lm-eval's own flexible-extract."""
    from scripts.harness_tasks import arithmetic_utils
    from tokenrl.rewards.verifiers import gsm8k_flexible, last_number

    assert arithmetic_utils.last_number(response) == last_number(response)
    assert gsm8k_flexible(response, gold) == tokenrl
    scores = arithmetic_utils.process_results({"answer": gold}, [response])
    assert scores["exact_match"] == tokenrl
    assert scores["flexible_extract"] == stock
    assert harness_scores("arithmetic", response, {"answer": gold}) == {
        "last_number": tokenrl,
        "flexible": scores["flexible_extract"],
    }


@needs_harness
def test_the_arithmetic_harness_task_holds_tokenrl_s_prompt_decoding_and_budget(tmp_path):
    """The harness task renders tokenrl's user turn from the JSONL the script writes, decodes greedily with EOS as
    the only stop and the task's token budget."""
    from lm_eval.utils import apply_template

    from tokenrl.data.prompts import with_instruction

    task = arithmetic_task()
    problems = task.problems("test")[:4]
    config = harness_config("arithmetic")
    rows = [
        json.loads(line)
        for line in (write_arithmetic_docs(problems, tmp_path) / "arithmetic" / "test.jsonl").read_text().splitlines()
    ]
    assert [r["id"] for r in rows] == [p.id for p in problems]
    for row, problem in zip(rows, problems):
        assert apply_template(config["doc_to_text"], row) == with_instruction(problem.question, task.instruction)
        assert apply_template(config["doc_to_target"], row) == problem.answer
    assert config["dataset_path"] == "json"
    assert config["dataset_kwargs"]["data_files"]["test"] == "arithmetic/test.jsonl"
    generation = config["generation_kwargs"]
    assert generation["until"] == [] and generation["do_sample"] is False
    assert generation["max_gen_toks"] == task.max_new_tokens == 32
    assert task.verifier == "gsm8k_flexible" and problems[0].verifier == "gsm8k_flexible"
    assert config["num_fewshot"] == 0 and config["repeats"] == 1


@needs_harness
def test_both_arithmetic_scorers_accept_the_worked_sum_and_refuse_a_changed_one():
    result = reference_check("arithmetic", None, limit=30)
    counts = result["counts"]
    for view in ("last_number", "flexible"):
        assert counts[f"reference/{view}/tokenrl_correct"] == counts[f"reference/{view}/harness_correct"] == 30
        assert counts[f"wrong_answer/{view}/tokenrl_correct"] == counts[f"wrong_answer/{view}/harness_correct"] == 0
    assert result["n"] == 30 and not result["disagreements"]
    assert wrong_final_answer("3 + 4 = 7", "arithmetic") == "3 + 4 = 8"


@pytest.mark.slow
@needs_harness
@needs_model
def test_compare_harness_on_arithmetic_needs_no_data_files(tmp_path, monkeypatch, stock_index_once):
    """`--tasks arithmetic` runs without TOKENRL_DATA_DIR: 3 held-out problems, the offline model, both sides."""
    monkeypatch.delenv("TOKENRL_DATA_DIR", raising=False)
    report = main(
        ["--tasks", "arithmetic", "--limit", "3", "--references-limit", "5", "--out", str(tmp_path / "arithmetic.json")]
    )
    result = report["tasks"]["arithmetic"]
    counts = result["counts"]
    assert result["n"] == 3 and result["max_new_tokens"] == 32
    assert counts["prompt_identical"] == counts["response_identical"] == 3, result["disagreements"]
    for view in ("last_number", "flexible"):
        assert counts[f"{view}/score_agree"] == 3
    assert counts["last_number/tokenrl_correct"] == counts["last_number/harness_correct"]
    assert result["samples"][0]["question"].startswith("What is ")
