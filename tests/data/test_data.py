"""Tasks, the resumable prompt schedule, and bad data files named by file and line."""

from __future__ import annotations

import json
import logging
import re

import pytest

from tests.conftest import DATA_DIR, needs_data
from tokenrl.data.datamodule import PromptPool, PromptSchedule
from tokenrl.data.jsonl import DataFormatError
from tokenrl.data.prompts import PromptFormatter
from tokenrl.data.tasks import ArithmeticTask, BenchmarkTask
from tokenrl.records.problem import Problem
from tokenrl.records.prompt_batch import rank_shard


def test_arithmetic_is_seeded_and_splits_differ():
    task = ArithmeticTask(0, 9, ["+", "*"], 50, 50, seed=3, instruction="", verifier="gsm8k_flexible")
    train = task.problems("train")
    assert train == task.problems("train")
    assert train != task.problems("test")
    for p in train:
        a, op, b = p.question.removeprefix("What is ").rstrip("?").split()
        assert int(p.answer) == (int(a) + int(b) if op == "+" else int(a) * int(b))


def test_schedule_is_a_function_of_the_step():
    problems = [Problem(str(i), f"q{i}", "1", "gsm8k_strict") for i in range(10)]
    ids = [[i] for i in range(10)]
    full = list(PromptSchedule(PromptPool(problems, ids), batch_size=4, seed=0, steps=range(0, 6)))
    resumed = list(PromptSchedule(PromptPool(problems, ids), batch_size=4, seed=0, steps=range(3, 6)))
    assert [b.prompt_ids for b in full[3:]] == [b.prompt_ids for b in resumed]
    assert [b.step for b in resumed] == [3, 4, 5]
    # every epoch visits every problem exactly once
    first_epoch = [i for b in full for i in b.prompt_ids][:10]
    assert sorted(x[0] for x in first_epoch) == list(range(10))


def test_schedule_shards_prompts_over_ranks():
    problems = [Problem(str(i), f"q{i}", "1", "gsm8k_strict") for i in range(12)]
    ids = [[i] for i in range(12)]
    whole = list(PromptSchedule(PromptPool(problems, ids), batch_size=4, seed=0, steps=range(2)))
    shards = [
        list(PromptSchedule(PromptPool(problems, ids), 4, 0, range(2), rank_shard(4, r, 2, "prompts_per_step")))
        for r in range(2)
    ]
    for step in range(2):
        assert shards[0][step].prompt_ids + shards[1][step].prompt_ids == whole[step].prompt_ids


def test_missing_data_dir_names_the_path_and_the_setting(tmp_path):
    task = BenchmarkTask(str(tmp_path / "nowhere"), "gsm8k_train", "gsm8k")
    with pytest.raises(FileNotFoundError, match=r"nowhere/gsm8k/train.jsonl does not exist: set paths.data_dir"):
        task.problems("train")


def test_malformed_row_names_file_and_line(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    path = tmp_path / "gsm8k" / "train.jsonl"
    path.write_text('{"question": "q", "answer": "x #### 1"}\n{"question": "q2", "answer": \n')
    with pytest.raises(DataFormatError, match=r"train.jsonl:2: not valid JSON \(Expecting value at column 30\)$"):
        BenchmarkTask(str(tmp_path), "gsm8k_train", "gsm8k").problems("train")
    path.write_text('{"question": "q", "answer": "x #### 1"}\n\n{"question": "", "answer": "y #### 2"}\n')
    with pytest.raises(
        DataFormatError, match=r"train.jsonl:3: missing or empty field 'question' \(fields: \['answer', 'question'\]\)"
    ):
        BenchmarkTask(str(tmp_path), "gsm8k_train", "gsm8k").problems("train")
    path.write_text(" \n\n")
    with pytest.raises(DataFormatError, match=f"^{re.escape(str(path))} is empty$"):
        BenchmarkTask(str(tmp_path), "gsm8k_train", "gsm8k").problems("train")
    path.write_text('{"question": "q", "answer": "no final answer"}\n')
    with pytest.raises(DataFormatError, match=r"train.jsonl:1: field 'answer' has no '#### <number>'"):
        BenchmarkTask(str(tmp_path), "gsm8k_train", "gsm8k").problems("train")


def write_gsm8k(data_dir, finals: list[str]):
    (data_dir / "gsm8k").mkdir(exist_ok=True)
    path = data_dir / "gsm8k" / "train.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"q{i}", "answer": f"Work.\n#### {final}"}) + "\n" for i, final in enumerate(finals)
        )
    )
    return path


def test_gold_answers_the_verifier_cannot_read_are_counted_and_a_split_of_none_is_refused(tmp_path, caplog):
    path = write_gsm8k(tmp_path, ["72", "many", "1,234", "lots", "5"])
    with caplog.at_level(logging.WARNING, logger="tokenrl"):
        assert len(BenchmarkTask(str(tmp_path), "gsm8k_train", "gsm8k").problems("train")) == 5
    assert [r.getMessage() for r in caplog.records] == [
        f"2 of 5 rows of gsm8k_train ({path}) cannot be scored by verifier 'gsm8k_strict' (their gold answers are "
        f"not a plain number, so they always score 0): gsm8k-train-2: 'many', gsm8k-train-4: 'lots'"
    ]
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"none of the 5 rows of gsm8k_train ({path}) can be scored by verifier 'choice': no gold answer is an "
            f"option letter A-D (gsm8k-train-1: '72', gsm8k-train-2: 'many', gsm8k-train-3: '1234', gsm8k-train-4: "
            f"'lots', gsm8k-train-5: '5'). Set task.verifier to one that reads these answers (null: the benchmark's "
            f"own)."
        ),
    ):
        BenchmarkTask(str(tmp_path), "gsm8k_train", "gsm8k", verifier="choice").problems("train")
    write_gsm8k(tmp_path, ["many", "lots"])
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"none of the 2 rows of gsm8k_train ({path}) can be scored by verifier 'gsm8k_strict': no gold answer is "
            f"a plain number (gsm8k-train-1: 'many', gsm8k-train-2: 'lots'). Check that the data is this benchmark's."
        ),
    ):
        BenchmarkTask(str(tmp_path), "gsm8k_train", "gsm8k").problems("train")
    write_gsm8k(tmp_path, ["72", "-5", "3.5"])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tokenrl"):
        BenchmarkTask(str(tmp_path), "gsm8k_train", "gsm8k").problems("train")
    assert not caplog.records


@needs_data
def test_gsm8k_reads_the_official_files():
    task = BenchmarkTask(DATA_DIR, "gsm8k_train", "gsm8k")
    train, test = task.problems("train"), task.problems("test")
    assert (len(train), len(test)) == (7473, 1319)
    assert all(p.answer.lstrip("-").replace(".", "").isdigit() for p in test)


def test_a_system_prompt_leads_plain_prompts_and_is_the_chat_system_turn():
    from tests.helpers.tiny import tiny_policy

    _, tok = tiny_policy()
    assert PromptFormatter(tok, False, system_prompt="Be brief.").text("What is 2+2?") == "Be brief.\n\nWhat is 2+2?\n"
    assert PromptFormatter(tok, False).text("What is 2+2?") == "What is 2+2?\n"
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    assert PromptFormatter(tok, "auto", system_prompt="Be brief.").text("Hi") == "<system>Be brief.<user>Hi"
