"""`task=dataset`: tiny runs that train on a jsonl and a parquet file, splits by name / file / held-out fraction, the
README example run as written, and every bad input named."""

from __future__ import annotations

import json
import logging
import re
import shlex

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra.utils import instantiate

from tests.conftest import ROOT, TINY, compose_config
from tokenrl.config.check import ConfigError, check_config
from tokenrl.data.dataset_task import DatasetTask, read_file
from tokenrl.data.jsonl import DataFormatError
from tokenrl.run.training import build_components, run

LEARNS = [
    "task.verifier=tests.helpers.rewards:length_reward",
    "total_steps=2",
    "validation.every_n_steps=2",
    "validation.n_samples=2",
    "validation.ks=[1,2]",
]


def sums(n: int) -> list[dict]:
    return [{"question": f"{a}+{a + 1}=?", "answer": f"{a} plus {a + 1} #### {2 * a + 1}"} for a in range(n)]


def write_jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path, rows: list[dict]):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_a_jsonl_file_trains_with_a_seeded_held_out_split(tiny_cfg, tmp_path, caplog):
    source = write_jsonl(tmp_path / "sums.jsonl", sums(12))
    cfg = tiny_cfg(
        "task=dataset", f"task.source={source}", "task.answer_extractor=gsm8k", "task.test_fraction=0.25", *LEARNS
    )
    task = instantiate(cfg.task)
    train, test = task.problems("train"), task.problems("test")
    assert (len(train), len(test)) == (9, 3) and not {p.id for p in train} & {p.id for p in test}
    assert {p.id: p.answer for p in train + test}["train-4"] == "7"  # row 4: 3+4, "#### 7" cut out
    assert [p.id for p in instantiate(cfg.task).problems("test")] == [p.id for p in test]  # seeded
    other_seed = instantiate(
        tiny_cfg(
            "task=dataset",
            f"task.source={source}",
            "task.answer_extractor=gsm8k",
            "task.test_fraction=0.25",
            "task.split_seed=1",
        ).task
    )
    assert [p.id for p in other_seed.problems("test")] != [p.id for p in test]
    caplog.set_level(logging.INFO, logger="tokenrl.run.training")
    summary = run(cfg)
    assert summary["rollout_steps"] == 2 and summary["optimizer_steps"] >= 2
    assert summary["train/loss"] == summary["train/loss"] and 0 <= summary["val/pass@1"] <= summary["val/pass@2"] <= 1
    assert (summary["data_train_rows"], summary["data_held_out_rows"]) == (9, 3)  # the rows it trained on, held out
    assert f"task.source={source}: training on 9 rows, 3 held out (task.test_fraction=0.25" in caplog.text


def test_a_parquet_file_trains_with_named_fields_a_pattern_and_a_test_file(tiny_cfg, tmp_path):
    rows = [{"prompt": r["question"], "solution": r["answer"].replace("####", "so the answer is")} for r in sums(10)]
    train_file = write_parquet(tmp_path / "train.parquet", rows[:8])
    test_file = write_parquet(tmp_path / "test.parquet", rows[8:])
    cfg = tiny_cfg(
        "task=dataset",
        f"task.source={train_file}",
        f"task.test_split={test_file}",
        "task.question_field=prompt",
        "task.answer_field=solution",
        "task.answer_pattern='answer is (\\d+)'",
        *LEARNS,
    )
    task = instantiate(cfg.task)
    assert [p.answer for p in task.problems("train")] == [str(2 * a + 1) for a in range(8)]
    assert [(p.id, p.question) for p in task.problems("test")] == [("test-1", "8+9=?"), ("test-2", "9+10=?")]
    summary = run(cfg)
    assert summary["rollout_steps"] == 2 and summary["optimizer_steps"] >= 2 and "val/pass@1" in summary


def test_a_glob_of_two_files_trains_on_the_rows_of_both(tiny_cfg, tmp_path):
    write_jsonl(tmp_path / "b.jsonl", sums(10)[6:])
    write_jsonl(tmp_path / "a.jsonl", sums(6))
    write_jsonl(tmp_path / "a.jsonl.bak", sums(20)[12:])  # the glob's suffix leaves it out
    cfg = tiny_cfg(
        "task=dataset",
        f"task.source='{tmp_path}/*.jsonl'",
        "task.answer_extractor=gsm8k",
        "task.test_fraction=0.2",
        *LEARNS,
    )
    module, datamodule, trainer = build_components(cfg)
    datamodule.setup("fit")
    task = datamodule.task
    held_out = {p.question for p in task.problems("test")}
    assert len(held_out) == 2 and {p.question for p in datamodule.train.problems} | held_out == {
        r["question"] for r in sums(10)
    }  # a.jsonl's rows 0-5 and b.jsonl's 6-9, once each
    by_id = {p.id: p.question for p in task.problems("train") + task.problems("test")}
    assert by_id["train-6"] == "5+6=?" and by_id["train-7"] == "6+7=?"  # sorted: a.jsonl's rows, then b.jsonl's


def test_splits_by_name_from_a_folder_laid_out_as_a_hub_repository(tmp_path):
    """A Hub id and a local folder in the Hub's layout go through the same `datasets` route."""
    repo = tmp_path / "user" / "sums"
    (repo / "data").mkdir(parents=True)
    write_parquet(repo / "data" / "train-00000-of-00001.parquet", sums(6))
    write_parquet(repo / "data" / "validation-00000-of-00001.parquet", sums(9)[6:])
    task = DatasetTask(str(repo), test_split="validation", answer_extractor="gsm8k", verifier="gsm8k_strict")
    assert [p.answer for p in task.problems("train")] == ["1", "3", "5", "7", "9", "11"]
    assert [(p.id, p.answer) for p in task.problems("test")] == [("test-1", "13"), ("test-2", "15"), ("test-3", "17")]


@pytest.mark.parametrize("folder", ["/", "empty"])
def test_a_folder_that_holds_no_dataset_is_refused_at_start_up(tmp_path, folder):
    """Issue #50 §11: `task.source=/` stopped only once the data loaded, after the model; the start-up check, which
    builds the task, refuses a folder `datasets` cannot read, in one line naming task.source and the fix."""
    source = str(tmp_path) if folder == "empty" else folder
    with pytest.raises(ConfigError) as refused:
        check_config(compose_config(["task=dataset", f"task.source={source}"]))
    [problem] = refused.value.problems
    assert problem.startswith(f"task.source={source} is a folder that `datasets` cannot read as split 'train'")
    assert "name a file in it" in problem and "\n" not in problem


def test_the_system_prompt_reaches_training_and_validation_prompts(tiny_cfg, tmp_path):
    source = write_jsonl(tmp_path / "sums.jsonl", sums(6))
    module, datamodule, _ = build_components(
        tiny_cfg(
            "task=dataset",
            f"task.source={source}",
            "task.instruction=",
            "task.system_prompt=Be brief.",
            "validation.every_n_steps=1",
        )
    )
    datamodule.setup()
    first = datamodule.formatter.tokenizer.decode(datamodule.train.prompt_ids[0])
    assert first.startswith("Be brief.\n\n") and first.endswith("=?\n")
    assert module.validator.formatter.system_prompt == "Be brief."


def readme_example() -> tuple[str, str, list[str]]:
    """The jsonl block and the command of README "Train on your own data"."""
    section = (ROOT / "README.md").read_text().split("## Train on your own data", 1)[1].split("\n## ", 1)[0]
    jsonl = re.search(r"```jsonl\n(.*?)```", section, re.S)[1]
    command = re.search(r"```bash\n(python train\.py .*?)\n```", section, re.S)[1].replace("\\\n", " ")
    name = re.search(r"task\.source=(\S+)", command)[1]
    return name, jsonl, shlex.split(command)[2:]


def test_the_readme_example_runs_as_written(tmp_path, monkeypatch):
    name, jsonl, overrides = readme_example()
    (tmp_path / name).write_text(jsonl)
    monkeypatch.chdir(tmp_path)  # the command names the file relative to where it runs
    task = instantiate(compose_config(overrides).task)
    assert len(task.problems("train")) + len(task.problems("test")) == len(jsonl.strip().splitlines())
    summary = run(compose_config(overrides + TINY + ["total_steps=1"], output_dir=tmp_path / "run"))
    assert summary["rollout_steps"] == 1 and summary["optimizer_steps"] >= 1


# --- bad input ---------------------------------------------------------------------------------------------------


def test_a_missing_field_names_it_and_the_fields_that_exist(tmp_path):
    source = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=?", "answer": "2"}])
    with pytest.raises(
        DataFormatError,
        match=r"p.jsonl:1: no field 'question' \(task.question_field\); "
        r"the fields are \['answer', 'prompt'\]",
    ):
        DatasetTask(str(source)).problems("train")


def test_rows_without_an_answer_are_skipped_and_counted_in_one_warning(tmp_path, caplog):
    rows = sums(6)
    rows[1]["answer"], rows[4]["answer"] = "", None
    rows[2]["answer"] = "no final marker"
    task = DatasetTask(str(write_jsonl(tmp_path / "p.jsonl", rows)), answer_extractor="gsm8k", test_fraction=0.34)
    with caplog.at_level(logging.WARNING, logger="tokenrl.data.dataset_task"):
        kept = task.problems("train") + task.problems("test") + task.problems("train")
    assert len({p.id for p in kept}) == 3
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}/p.jsonl (train): skipped 3 of 6 rows without an answer (field 'answer' empty or nothing to "
        f"extract)"
    ]


def test_gold_answers_the_verifier_cannot_read_are_counted_with_their_lines(tmp_path, caplog):
    rows = sums(6)
    rows[1]["answer"], rows[4]["answer"] = "1 plus 2 #### many", "#### lots"
    source = write_jsonl(tmp_path / "p.jsonl", rows)
    task = DatasetTask(str(source), answer_extractor="gsm8k", verifier="gsm8k_strict", test_fraction=0.34)
    with caplog.at_level(logging.WARNING, logger="tokenrl"):
        assert len(task.problems("train") + task.problems("test")) == 6
    assert [r.getMessage() for r in caplog.records] == [
        f"2 of 6 rows of {source} (train) cannot be scored by verifier 'gsm8k_strict' (their gold answers are not a "
        f"plain number, so they always score 0): {source}:2: 'many', {source}:5: 'lots'"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tokenrl"):
        DatasetTask(
            str(write_jsonl(tmp_path / "good.jsonl", sums(6))), answer_extractor="gsm8k", verifier="gsm8k_strict"
        ).problems("train")
    assert not caplog.records


def test_a_file_whose_golds_the_verifier_cannot_read_is_refused_naming_the_field(tmp_path):
    source = write_jsonl(tmp_path / "p.jsonl", sums(6))  # whole solutions: the extractor is missing
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"none of the 6 rows of {source} (train) can be scored by verifier 'gsm8k_strict': no gold answer is a "
            f"plain number ({source}:1: '0 plus 1 #### 1', {source}:2: '1 plus 2 #### 3', {source}:3: '2 plus 3 #### "
            f"5', {source}:4: '3 plus 4 #### 7', {source}:5: '4 plus 5 #### 9', ...). The gold answers are field "
            f"'answer' (task.answer_field): cut the final answer out of it with task.answer_extractor (boxed or gsm8k) "
            f"or task.answer_pattern, or set task.verifier to one that reads them."
        ),
    ):
        DatasetTask(str(source), verifier="gsm8k_strict").problems("train")


@pytest.mark.parametrize(
    "name,content,message",
    [
        (
            "bad.jsonl",
            b'{"question": "q", "answer": "1"}\n{"question": \n',
            r"bad.jsonl:2: not valid JSON \(Expecting value at column 14\)$",
        ),
        (
            "bad.jsonl",
            b'{"question": "q", "answer": "1"}\n\n{"question": "a\tb", "answer": "2"}\n',
            r"bad.jsonl:3: not valid JSON \(Invalid control character at column 16\)$",
        ),
        ("bad.jsonl", b'{"question": "q", "answer": "1"}\n{"question": "\xff"}\n', r"bad.jsonl:2: not UTF-8 text"),
        (
            "bad.json",
            b'[\n{"question": "q", "answer": "1"},\n{"question" "q"}\n]',
            r"bad.json:3: not valid JSON \(Expecting ':' delimiter at column 13\)$",
        ),
        ("bad.json", b'{"question": "q"}', r"bad.json: expected a JSON array of objects"),
        ("bad.csv", b'question,answer\n"q","1"\n"q"x,2\n', r"bad.csv:3: not valid CSV"),
        ("bad.parquet", b"not parquet at all", r"bad.parquet: not a readable parquet file"),
    ],
)
def test_an_unreadable_file_is_named_with_its_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataFormatError, match=message):
        DatasetTask(str(tmp_path / name)).problems("train")


ROWS = [{"question": "Combien font 2+2 ? été", "answer": "4"}, {"question": "1+1=?", "answer": "2"}]
LAYOUTS = {
    ".jsonl": "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ROWS),
    ".json": json.dumps(ROWS, ensure_ascii=False, indent=1) + "\n",
    ".csv": "question,answer\n" + "".join(f"{row['question']},{row['answer']}\n" for row in ROWS),
}


@pytest.mark.parametrize("suffix", list(LAYOUTS))
@pytest.mark.parametrize(
    "bom,crlf,blank_end",
    [(True, False, False), (False, True, False), (True, True, False), (False, False, True), (True, True, True)],
    ids=["bom", "crlf", "bom+crlf", "blank-end", "all"],
)
def test_files_from_windows_tools_read_as_the_same_rows(tmp_path, suffix, bom, crlf, blank_end):
    text = LAYOUTS[suffix] + ("\n" if blank_end else "")
    data = ("\ufeff" if bom else "") + (text.replace("\n", "\r\n") if crlf else text)
    path = tmp_path / f"p{suffix}"
    path.write_bytes(data.encode("utf-8"))
    assert [row for _, row in read_file(path)] == ROWS


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("empty.jsonl", b"", "is empty"),
        ("blank.jsonl", b"\n  \n", "is empty"),
        ("empty.json", b"", "is empty"),
        ("blank.json", b" \n", "is empty"),
        ("empty.csv", b"", "is empty"),
        ("empty.parquet", b"", "is empty"),
        ("empty.json", b"[]", "(train) has no rows"),
        ("header.csv", b"question,answer\n", "(train) has no rows"),
    ],
)
def test_an_empty_file_is_called_empty(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataFormatError, match=f"^{re.escape(str(tmp_path / name))} {re.escape(message)}$"):
        DatasetTask(str(tmp_path / name)).problems("train")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope.jsonl does not exist"):
        DatasetTask(str(tmp_path / "nope.jsonl")).problems("train")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"verifier": "nope"}, r"task.verifier='nope': must be a verifier: one of choice, gsm8k_flexible, "),
        ({"answer_pattern": "("}, r"task.answer_pattern='\(' is not a valid regex"),
        ({"answer_extractor": "hash"}, r"task.answer_extractor='hash': must be one of gsm8k, boxed or null \(none\)"),
        (
            {"answer_pattern": "#### (.*)", "answer_extractor": "gsm8k"},
            r"one of task.answer_pattern and task.answer_extr",
        ),
        ({"test_fraction": 1.5}, r"task.test_fraction=1.5: must be a number in \(0, 1\)"),
        ({"train_split": "validation"}, r"task.train_split='validation' names a split of a Hub dataset"),
        ({"test_split": "test"}, r"task.test_split='test': with a local task.source the test split is a second file"),
    ],
)
def test_bad_options_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        DatasetTask(str(write_jsonl(tmp_path / "p.jsonl", sums(4))), **kwargs)


def test_a_missing_source_is_named():
    with pytest.raises(Exception, match=r"Missing mandatory value: task.source"):
        instantiate(compose_config(["task=dataset"]).task)
