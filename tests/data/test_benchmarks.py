"""Benchmark loaders yield the documented counts with non-empty answers; the Hub route gives the same records as
the local files (through a folder laid out as each Hub repository); bad input is named precisely."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import DATA_DIR, ROOT, needs_data
from tokenrl.data.benchmarks import BENCHMARKS, GPQA_PASSWORD, LOCAL, MMLU_STEM, PAPER, benchmark, expand
from tokenrl.data.jsonl import DataFormatError
from tokenrl.evaluation.runner import EvalSettings, ProblemSet

COUNTS = {
    "gsm8k": 1319,
    "gsm8k_train": 7473,
    "math500": 500,
    "math_train": 7498,
    "mmlu_stem": 3018,
    "gpqa": 198,
    "aime23": 30,
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "olympiadbench": 675,
}


@needs_data
@pytest.mark.parametrize("name", sorted(COUNTS))
def test_documented_counts_and_answers(name):
    problems = BENCHMARKS[name].load(DATA_DIR)
    assert len(problems) == COUNTS[name]
    assert all(p.answer.strip() and p.question.strip() for p in problems)
    assert len({p.id for p in problems}) == len(problems)
    if name.startswith("aime"):
        assert all(
            p.answer.isdigit() and 0 <= int(p.answer) <= 999 and p.answer == str(int(p.answer)) for p in problems
        )


@needs_data
def test_aime25_control_characters_are_repaired():
    problems = BENCHMARKS["aime25"].load(DATA_DIR)
    assert not any(re.search(r"[\x00-\x08\x0b-\x1f]", p.question) or "\t" in p.question for p in problems)
    assert "\\frac" in problems[18].question and "\\triangle" in problems[19].question


@needs_data
def test_gpqa_choices_are_shuffled_with_a_fixed_seed():
    first, again = BENCHMARKS["gpqa"].load(DATA_DIR), BENCHMARKS["gpqa"].load(DATA_DIR)
    assert [p.answer for p in first] == [p.answer for p in again]
    letters = Counter(p.answer for p in first)
    assert set(letters) == set("ABCD") and min(letters.values()) > 30


@needs_data
def test_multiple_choice_questions_list_four_lettered_options():
    for name in ("mmlu_stem", "gpqa"):
        problem = BENCHMARKS[name].load(DATA_DIR)[0]
        assert all(f"\n{letter}. " in problem.question for letter in "ABCD") and problem.verifier == "choice"


def test_paper_expands_to_the_seven():
    assert expand("paper") == list(PAPER) and len(PAPER) == 7
    assert expand(["gsm8k", "paper"]) == list(PAPER)
    assert expand("gsm8k,math500") == ["gsm8k", "math500"]


def test_unknown_benchmark_lists_the_valid_ones():
    with pytest.raises(KeyError, match="valid: .*'aime24'.*'paper'"):
        benchmark("aime2099")


def test_missing_data_dir_names_path_and_setting(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere/math500/test.jsonl does not exist: set paths.data_dir .*Hub"):
        BENCHMARKS["math500"].load(tmp_path / "nowhere")


def test_malformed_record_names_file_and_line(tmp_path):
    (tmp_path / "amc23").mkdir()
    (tmp_path / "amc23" / "test.jsonl").write_text(json.dumps({"problem": "p", "answer": 3.0}) + "\n{broken\n")
    with pytest.raises(
        DataFormatError,
        match=r"amc23/test.jsonl:2: not valid JSON \(Expecting property name enclosed "
        r"in double quotes at column 2\)$",
    ):
        BENCHMARKS["amc23"].load(tmp_path)
    (tmp_path / "mmlu_stem").mkdir()
    (tmp_path / "mmlu_stem" / "test.jsonl").write_text(
        json.dumps({"question": "q", "choices": ["a"], "answer": 0}) + "\n"
    )
    with pytest.raises(DataFormatError, match=r"mmlu_stem/test.jsonl:1: expected 4 choices"):
        BENCHMARKS["mmlu_stem"].load(tmp_path)


def _math_archive(path: Path, members: dict[str, bytes]) -> None:
    """A MATH_train.tar.gz at `path` holding `members` (name -> content)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))


def test_a_malformed_member_of_a_benchmark_archive_names_archive_member_and_line(tmp_path):
    archive = tmp_path / LOCAL["math_train"]
    good = json.dumps({"problem": "1+1?", "type": "Algebra", "solution": "\\boxed{2}"}).encode()
    member = f"{archive}:MATH/train/algebra/2.json"
    _math_archive(
        archive, {"MATH/train/algebra/1.json": good, "MATH/train/algebra/2.json": b'{"problem": "x",\n  oops}'}
    )
    with pytest.raises(
        DataFormatError,
        match=re.escape(f"{member}:2: not valid JSON (Expecting property name enclosed in double quotes at column 3)"),
    ):
        BENCHMARKS["math_train"].load(tmp_path)
    _math_archive(archive, {"MATH/train/algebra/1.json": good, "MATH/train/algebra/2.json": b"[1]"})
    with pytest.raises(DataFormatError, match=re.escape(f"{member}: expected a JSON object")):
        BENCHMARKS["math_train"].load(tmp_path)
    _math_archive(archive, {"MATH/train/algebra/1.json": good, "MATH/train/algebra/2.json": b'{"problem": "\xff"}'})
    with pytest.raises(DataFormatError, match=re.escape(f"{member}: not UTF-8 text")):
        BENCHMARKS["math_train"].load(tmp_path)
    _math_archive(archive, {"MATH/train/algebra/1.json": good})
    assert [p.answer for p in BENCHMARKS["math_train"].load(tmp_path)] == ["2"]
    archive.write_bytes(archive.read_bytes()[:60])  # cut short: a copy that did not finish
    with pytest.raises(DataFormatError, match=re.escape(f"{archive}: not a readable tar archive")):
        BENCHMARKS["math_train"].load(tmp_path)


def test_evaluate_counts_and_files(tmp_path):
    """A real (tiny) engine; the verifier sees what was generated, so pass@k matches the written samples."""
    from tests.helpers.tiny import tiny_policy
    from tokenrl.data.prompts import PromptFormatter
    from tokenrl.records.problem import Problem
    from tokenrl.rewards.scorer import SafeScorer
    from tokenrl.rollout.hf import HFEngine

    model, tok = tiny_policy()
    problems = [Problem(str(i), f"q{i}", "x", "tests.helpers.rewards:length_reward") for i in range(5)]
    scorer = SafeScorer(20.0)
    try:
        result = ProblemSet("toy", problems, "").evaluate(
            HFEngine(model, tok),
            PromptFormatter(tok, False),
            scorer,
            EvalSettings(n_samples=4, ks=(1, 4), max_new_tokens=14, batch_prompts=2),
            samples_path=tmp_path / "toy.samples.jsonl",
        )
    finally:
        scorer.close()
    lines = [json.loads(line) for line in (tmp_path / "toy.samples.jsonl").read_text().splitlines()]
    assert len(lines) == 20 and result["problems"] == 5
    solved = Counter(line["id"] for line in lines if line["score"] >= 1.0)
    from tokenrl.evaluation.passk import pass_at_k

    assert result["pass@4"] == pytest.approx(sum(pass_at_k(4, solved.get(str(i), 0), 4) for i in range(5)) / 5)
    assert result["pass@1"] == pytest.approx(sum(solved.values()) / 20)


@needs_data
def test_aime23_ids_follow_the_official_numbering():
    answers = {p.id: p.answer for p in BENCHMARKS["aime23"].load(DATA_DIR)}
    # DeepScaleR stores problem 15 as problem_number 0; the official keys: I-1 = 191, I-15 = 349, II-15 = 363
    assert (answers["aime23-1-1"], answers["aime23-1-15"], answers["aime23-2-15"]) == ("191", "349", "363")


# --- The Hub route without a network: each benchmark's local files, written in the file names, format and columns of
# its Hub repository (data/benchmarks.py HUB), loaded by `datasets` through Benchmark.load_hub with the repository id
# replaced by that folder. Layouts: openai/gsm8k main/<split>-00000-of-00001.parquet; cais/mmlu
# <subject>/test-00000-of-00001.parquet; Idavidrein/gpqa gpqa_diamond.csv; HuggingFaceH4/MATH-500 and math-ai/aime25
# test.jsonl; math-ai/amc23 test-00000-of-00001.parquet; the others data/<split>-00000-of-00001.parquet.


def _local_rows(name: str) -> list[dict]:
    return [row for _, row in BENCHMARKS[name].read_local(Path(DATA_DIR) / LOCAL[name])]


def _parquet(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _configs_card(repo: Path, configs: dict[str, dict[str, str] | str]) -> None:
    """A dataset card whose YAML `configs:` block maps config names to data files, as multi-config Hub repos have."""
    lines = ["---", "configs:"]
    for name, files in configs.items():
        lines.append(f"- config_name: {name}")
        if isinstance(files, str):
            lines.append(f"  data_files: {files}")
        else:
            lines.append("  data_files:")
            lines += [f"  - split: {split}\n    path: {pattern}" for split, pattern in files.items()]
    (repo / "README.md").write_text("\n".join(lines + ["---", ""]))


def _aime_url(year: int, part: int, number: int) -> str:
    return f"https://artofproblemsolving.com/wiki/index.php/{year}_AIME_{'I' * part}_Problems/Problem_{number}"


def _gsm8k(repo: Path) -> None:
    for split in ("train", "test"):
        _parquet(
            repo / "main" / f"{split}-00000-of-00001.parquet", _local_rows(f"gsm8k{'_train' * (split == 'train')}")
        )
    _configs_card(repo, {"main": {"train": "main/train-*", "test": "main/test-*"}})


def _math_lighteval(repo: Path) -> None:
    rows = _local_rows("math_train")
    _parquet(
        repo / "data" / "train-00000-of-00001.parquet",
        [{k: row[k] for k in ("problem", "level", "solution", "type")} for row in rows],
    )


def _mmlu(repo: Path) -> None:
    rows = _local_rows("mmlu_stem")
    for subject in MMLU_STEM:
        _parquet(
            repo / subject / "test-00000-of-00001.parquet",
            [
                {"question": r["question"], "subject": subject, "choices": r["choices"], "answer": r["answer"]}
                for r in rows
                if r["type"] == subject
            ],
        )
    _configs_card(repo, {subject: {"test": f"{subject}/test-*"} for subject in MMLU_STEM})


def _gpqa(repo: Path) -> None:
    """The CSV as the gated repository holds it, in tmp_path only (never printed)."""
    with zipfile.ZipFile(Path(DATA_DIR) / LOCAL["gpqa"]) as archive:
        (repo / "gpqa_diamond.csv").write_bytes(archive.read("gpqa_diamond.csv", pwd=GPQA_PASSWORD))
    _configs_card(repo, {"gpqa_diamond": "gpqa_diamond.csv"})


def _aimo_aime(repo: Path) -> None:
    """AI-MO/aimo-validation-aime: AIME 2022-2024 with AoPS urls; here the 2022 and 2023 problems of the local file."""
    rows = [r for r in _local_rows("aime23") if r["year"] in (2022, 2023)]
    _parquet(
        repo / "data" / "train-00000-of-00001.parquet",
        [
            {
                "id": i,
                "problem": r["problem"],
                "solution": r["solution"],
                "answer": r["answer"],
                "url": _aime_url(r["year"], r["aime_number"], r["problem_number"] or 15),
            }
            for i, r in enumerate(rows)
        ],
    )


def _aime24(repo: Path) -> None:
    _parquet(
        repo / "data" / "train-00000-of-00001.parquet",
        [
            {k: r[k] for k in ("id", "problem", "solution", "answer", "url")} | {"year": "2024"}
            for r in _local_rows("aime24")
        ],
    )


def _copy_jsonl(name: str) -> Callable[[Path], None]:
    def write(repo: Path) -> None:
        (repo / "test.jsonl").write_bytes((Path(DATA_DIR) / LOCAL[name]).read_bytes())

    return write


def _amc23(repo: Path) -> None:
    _parquet(
        repo / "test-00000-of-00001.parquet",
        [{k: r[k] for k in ("id", "question", "answer", "url")} for r in _local_rows("amc23")],
    )


def _olympiadbench(repo: Path) -> None:
    _parquet(repo / "OE_TO_maths_en_COMP" / "train-00000-of-00001.parquet", _local_rows("olympiadbench"))
    _configs_card(repo, {"OE_TO_maths_en_COMP": {"train": "OE_TO_maths_en_COMP/train-*"}})


HUB_LAYOUT = {
    "gsm8k": _gsm8k,
    "gsm8k_train": _gsm8k,
    "math500": _copy_jsonl("math500"),
    "math_train": _math_lighteval,
    "mmlu_stem": _mmlu,
    "gpqa": _gpqa,
    "aime23": _aimo_aime,
    "aime24": _aime24,
    "aime25": _copy_jsonl("aime25"),
    "amc23": _amc23,
    "olympiadbench": _olympiadbench,
}


def test_every_benchmark_has_a_hub_source_and_a_mirror_layout_here():
    assert sorted(HUB_LAYOUT) == sorted(BENCHMARKS) == sorted(LOCAL)
    assert all(BENCHMARKS[name].hub.repo.count("/") == 1 for name in BENCHMARKS)


@needs_data
@pytest.mark.parametrize("name", sorted(HUB_LAYOUT))
def test_the_hub_route_gives_the_records_of_the_local_files(name, tmp_path):
    repo = tmp_path / BENCHMARKS[name].hub.repo
    repo.mkdir(parents=True)
    HUB_LAYOUT[name](repo)
    from_hub = BENCHMARKS[name].load_hub(str(repo), cache_dir=str(tmp_path / "datasets_cache"))
    assert len(from_hub) == COUNTS[name]
    assert from_hub == BENCHMARKS[name].load(DATA_DIR)


@pytest.mark.slow
def test_without_hub_or_local_files_train_fails_at_start_up_naming_both_routes(tmp_path):
    """No network and no TOKENRL_DATA_DIR: one error line with the Hub id and the local route (status 2, no traceback),
    no minute of retries (the Hub endpoint here refuses connections, as an offline machine's does not answer)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("TOKENRL_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run(
        [sys.executable, "train.py", "task=gsm8k", "model=tiny", "logger=none", f"hydra.run.dir={tmp_path}/run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-3000:]  # a user's error (docs/errors.md): one line, status 2
    message = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(message) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "openai/gsm8k" in message[0] and "TOKENRL_DATA_DIR" in message[0] and "paths.data_dir" in message[0]
    assert "The above exception" not in done.stderr and "Retrying" not in done.stderr
