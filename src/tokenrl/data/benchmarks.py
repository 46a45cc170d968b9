"""Benchmarks and train splits → one `Problem` shape, from the pinned Hugging Face Hub dataset (`HUB`) or, when
`data_dir` is set, the same benchmark's files under it (`LOCAL`); one converter per benchmark gives both routes the same
records (docs/data-and-evaluation.md "Where the data comes from"). GPQA is read in memory only: its questions are never
written out."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import random
import re
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenrl.data.hub import DataUnavailableError, HubSource, load_source
from tokenrl.data.jsonl import DataFormatError, Row, gsm8k_final_answer, json_error, read_file
from tokenrl.records.problem import Problem
from tokenrl.rewards.verifiers import check_golds

log = logging.getLogger(__name__)

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
BOXED_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
CHOICE_INSTRUCTION = "Think step by step, then give the letter of the correct option within \\boxed{}."
LETTERS = "ABCD"
AIME = {"n_samples": 32, "max_new_tokens": 4096}  # the 30-problem AIME sets (docs/algorithms.md §6)
GPQA_PASSWORD = b"deserted-untie-orchid"  # published by the GPQA authors for their own release
MMLU_STEM = (
    "college_biology",
    "astronomy",
    "electrical_engineering",
    "high_school_biology",
    "machine_learning",
    "abstract_algebra",
    "high_school_mathematics",
    "high_school_computer_science",
    "college_chemistry",
    "high_school_chemistry",
    "computer_security",
    "conceptual_physics",
    "high_school_physics",
    "college_physics",
    "high_school_statistics",
    "elementary_mathematics",
    "college_mathematics",
    "college_computer_science",
)  # the 18 subjects of Qwen2.5-Math's mmlu_stem, in its order

# The Hub route: the datasets the field's evaluation code loads, at commits seen pinned or cached in public code (None
# where none could be found: the branch head).
HUB: dict[str, HubSource] = {
    "gsm8k": HubSource("openai/gsm8k", "test", ("main",), "cc7b047b6e5bb11b4f1af84efc572db110a51b3c"),
    "gsm8k_train": HubSource("openai/gsm8k", "train", ("main",), "cc7b047b6e5bb11b4f1af84efc572db110a51b3c"),
    "math500": HubSource("HuggingFaceH4/MATH-500", "test", revision="6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be"),
    "math_train": HubSource(
        "DigitalLearningGmbH/MATH-lighteval", "train", ("default",), "0530c78699ea5e8eb5530600900e1f328b48acad"
    ),
    "mmlu_stem": HubSource(
        "cais/mmlu", "test", MMLU_STEM, "c30699e8356da336a370243923dbaf21066bb9fe", columns={"subject": "type"}
    ),
    "gpqa": HubSource(
        "Idavidrein/gpqa", "train", ("gpqa_diamond",), "633f5ee89ab8ad4522a9f850766b73f62147ffdd", gated=True
    ),
    "aime23": HubSource("AI-MO/aimo-validation-aime", "train", revision="13f9e12f613e720c2a2b2f345dd04b998a29494d"),
    "aime24": HubSource("HuggingFaceH4/aime_2024", "train", revision="2fe88a2f1091d5048c0f36abc874fb997b3dd99a"),
    "aime25": HubSource("math-ai/aime25", "test", revision="563bb8404243c5f09de6ec262f2db674fe5bce9b"),
    "amc23": HubSource("math-ai/amc23", "test"),
    "olympiadbench": HubSource("Hothan/OlympiadBench", "train", ("OE_TO_maths_en_COMP",)),
}
# The local route: the file of each benchmark under data_dir.
LOCAL: dict[str, str] = {
    "gsm8k": "gsm8k/test.jsonl",
    "gsm8k_train": "gsm8k/train.jsonl",
    "math500": "math500/test.jsonl",
    "math_train": "math_train/MATH_train.tar.gz",
    "mmlu_stem": "mmlu_stem/test.jsonl",
    "gpqa": "gpqa/gpqa_diamond.zip",
    "aime23": "aime23/aime.json",
    "aime24": "aime24/test.jsonl",
    "aime25": "aime25/test.jsonl",
    "amc23": "amc23/test.jsonl",
    "olympiadbench": "olympiadbench/test.jsonl",
}


def _require(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(
            f"benchmark file {path} does not exist: set paths.data_dir (or TOKENRL_DATA_DIR) to "
            f"the folder that holds the benchmark data, or leave it unset to use the Hub"
        )
    return path


def _read(path: Path) -> list[Row]:
    return read_file(_require(path))


def _archive_member(archive: tarfile.TarFile, path: Path, member: tarfile.TarInfo) -> dict[str, Any]:
    """The JSON object of one member of a tar archive; DataFormatError naming archive, member, line and column."""
    where = Path(f"{path}:{member.name}")
    file = archive.extractfile(member)
    assert file is not None  # a regular file: the caller's filter
    try:
        row = json.loads(file.read().decode("utf-8"))
    except UnicodeDecodeError:
        raise DataFormatError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise json_error(where, err) from None
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def _math_tar(path: Path) -> list[Row]:
    """Hendrycks MATH train from the tar archive, read in place (files under MATH/train/<subject>/)."""
    _require(path)
    try:
        with tarfile.open(path) as archive:
            return [
                (f"{path}:{member.name}", _archive_member(archive, path, member))
                for member in sorted(archive.getmembers(), key=lambda m: m.name)
                if member.isfile() and member.name.endswith(".json") and "/train/" in member.name
            ]
    except (tarfile.TarError, EOFError) as err:
        raise DataFormatError(f"{path}: not a readable tar archive ({err})") from None


def _gpqa_zip(path: Path) -> list[Row]:
    with zipfile.ZipFile(_require(path)) as archive:
        text = archive.read("gpqa_diamond.csv", pwd=GPQA_PASSWORD).decode("utf-8")
    return [
        (f"{path}:gpqa_diamond.csv:{lineno}", row)
        for lineno, row in enumerate(csv.DictReader(io.StringIO(text)), start=2)
    ]


def _field(where: str, row: dict[str, Any], key: str) -> Any:
    value = row.get(key)
    if value is None or value == "":
        raise DataFormatError(f"{where}: missing or empty field {key!r} (fields: {sorted(row)})")
    return value


def _number_text(value: object) -> str:
    """27.0 -> '27', '012' -> '12', other strings unchanged."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    return str(int(text)) if text.isdigit() else text


def gsm8k_problems(split: str) -> Callable[[list[Row]], list[Problem]]:
    def convert(rows: list[Row]) -> list[Problem]:
        out = []
        for index, (where, row) in enumerate(rows, start=1):
            question, answer = _field(where, row, "question"), _field(where, row, "answer")
            final = gsm8k_final_answer(answer)
            if final is None:
                raise DataFormatError(f"{where}: field 'answer' has no '#### <number>' final answer")
            out.append(Problem(f"gsm8k-{split}-{index}", question, final, "gsm8k_strict"))
        return out

    return convert


def math500_problems(rows: list[Row]) -> list[Problem]:
    return [
        Problem(
            row.get("unique_id") or f"math500-{index}",
            _field(where, row, "problem"),
            str(_field(where, row, "answer")),
            "math",
        )
        for index, (where, row) in enumerate(rows, start=1)
    ]


def math_train_problems(rows: list[Row]) -> list[Problem]:
    """Answer = last \\boxed{} of the solution; id = subject/sha256(problem)[:10] (neither route keeps MATH's file
    names), sorted by id. Problems whose solution boxes nothing (an upstream quirk, e.g. `\\boxed{}`) are skipped
    with a warning."""
    from tokenrl.rewards.verifiers import last_boxed

    out, skipped = [], []
    for where, row in rows:
        problem = _field(where, row, "problem")
        subject = re.sub(r"\W+", "_", _field(where, row, "type").lower().replace("&", "and"))
        uid = f"{subject}/{hashlib.sha256(problem.encode()).hexdigest()[:10]}"
        answer = last_boxed(_field(where, row, "solution"))
        if not answer or not answer.strip():
            skipped.append(uid)
            continue
        out.append(Problem(uid, problem, answer, "math"))
    if skipped:
        log.warning("math_train: skipped %d problems without a boxed answer: %s", len(skipped), ", ".join(skipped))
    return sorted(out, key=lambda p: p.id)


def _choice_question(question: str, choices: list[str]) -> str:
    return question.strip() + "\n" + "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))


def mmlu_stem_problems(rows: list[Row]) -> list[Problem]:
    out = []
    for index, (where, row) in enumerate(rows, start=1):
        choices = list(_field(where, row, "choices"))
        if len(choices) != 4 or row.get("answer") not in range(4):
            raise DataFormatError(f"{where}: expected 4 choices and an answer index 0-3")
        question = _choice_question(_field(where, row, "question"), choices)
        out.append(Problem(f"mmlu_stem-{index}", question, LETTERS[row["answer"]], "choice"))
    return out


def gpqa_problems(rows: list[Row], seed: int = 0) -> list[Problem]:
    """GPQA-Diamond; the four options are shuffled with a per-record seed."""
    out = []
    for where, row in rows:
        options = [row.get("Correct Answer")] + [row.get(f"Incorrect Answer {i}") for i in (1, 2, 3)]
        if not row.get("Question") or not all(isinstance(o, str) and o.strip() for o in options):
            raise DataFormatError(f"{where}: empty question or option")
        order = list(range(4))
        random.Random(f"{seed}-{row['Record ID']}").shuffle(order)
        choices = [str(options[i]).strip() for i in order]  # each a non-empty string (checked above)
        question = _choice_question(row["Question"], choices)
        out.append(Problem(row["Record ID"], question, LETTERS[order.index(0)], "choice"))
    return out


_AIME_URL = re.compile(r"(\d{4})_AIME_(I{1,2})_Problems/Problem_(\d+)")


def _aime_key(where: str, row: dict[str, Any]) -> tuple[int, int, int]:
    """(year, part 1/2, problem 1-15) from the AoPS url (Hub) or DeepScaleR's fields, whose problem_number is the
    problem number modulo 15 (0 stands for 15)."""
    if "url" in row:
        match = _AIME_URL.search(str(row["url"]))
        if not match:
            raise DataFormatError(f"{where}: url {row['url']!r} names no AIME problem")
        return int(match[1]), len(match[2]), int(match[3])
    return int(_field(where, row, "year")), int(_field(where, row, "aime_number")), int(row["problem_number"]) or 15


def aime23_problems(rows: list[Row]) -> list[Problem]:
    keyed = sorted((_aime_key(where, row), where, row) for where, row in rows)
    return [
        Problem(
            f"aime23-{part}-{number}", _field(where, row, "problem"), _number_text(_field(where, row, "answer")), "math"
        )
        for (year, part, number), where, row in keyed
        if year == 2023
    ]


def numeric_problems(
    name: str, question: str = "problem", ids: bool = True, repair: bool = False
) -> Callable[[list[Row]], list[Problem]]:
    """`math` problems whose answer is a number, with ids `<name>-<the row's id, or its number>` (`ids` False: always
    its number); the question is field `problem`, else `question`, with `repair` the upstream JSON-escaping bug of
    aime25 (also on the Hub) undone: U+000C was '\\f', TAB was '\\t'."""

    def convert(rows: list[Row]) -> list[Problem]:
        out = []
        for index, (where, row) in enumerate(rows, 1):
            text = row.get("problem") or _field(where, row, question)
            answer = _number_text(_field(where, row, "answer"))
            uid = row.get("id", index) if ids else index
            if repair:
                text = text.replace("\x0c", "\\f").replace("\t", "\\t")
            out.append(Problem(f"{name}-{uid}", text, answer, "math"))
        return out

    return convert


def olympiadbench_problems(rows: list[Row]) -> list[Problem]:
    out = []
    for index, (where, row) in enumerate(rows, start=1):
        answers = ", ".join(a.strip().strip("$") for a in _field(where, row, "final_answer"))
        out.append(Problem(f"olympiadbench-{row.get('id', index)}", _field(where, row, "question"), answers, "math"))
    return out


@dataclass(frozen=True)
class Benchmark:
    """A named evaluation (or training) set: its two sources, how rows become problems, the answer format."""

    name: str
    read_local: Callable[[Path], list[Row]]
    convert: Callable[[list[Row]], list[Problem]]
    instruction: str
    n_samples: int = 8  # docs/algorithms.md §6: 8 per problem, 32 for the 30-problem AIME sets
    max_new_tokens: int = 1024

    @property
    def hub(self) -> HubSource:
        return HUB[self.name]

    def load(self, data_dir: str | Path | None = None, verifier: str | None = None) -> list[Problem]:
        """From `data_dir` when given (the local route), else from the Hub; DataUnavailableError names both.
        `verifier` replaces the benchmark's own; gold answers it can never match are reported (check_golds)."""
        if data_dir:
            path = Path(data_dir).expanduser() / LOCAL[self.name]
            problems, source = self.convert(self.read_local(path)), str(path)
        else:
            try:
                problems, source = self.load_hub(), self.hub.describe()
            except DataUnavailableError as err:
                raise DataUnavailableError(
                    f"benchmark {self.name!r} is not available. Hub route: {self.hub.describe()}: {err} Local route: "
                    f"set TOKENRL_DATA_DIR (or paths.data_dir=...) to a folder holding {LOCAL[self.name]}."
                ) from None
        fix = "Check that the data is this benchmark's."
        if verifier:
            problems = [replace(p, verifier=verifier) for p in problems]
            fix = "Set task.verifier to one that reads these answers (null: the benchmark's own)."
        check_golds(problems, f"{self.name} ({source})", fix=fix)
        return problems

    def load_hub(self, path: str | None = None, cache_dir: str | None = None) -> list[Problem]:
        """The Hub route; `path` replaces the repository id (a local folder laid out as the Hub repository)."""
        rows = load_source(self.hub, path, cache_dir)
        return self.convert([(f"{path or self.hub.repo} row {i}", row) for i, row in enumerate(rows, start=1)])


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in [
        Benchmark("gsm8k", _read, gsm8k_problems("test"), GSM8K_INSTRUCTION),
        Benchmark("gsm8k_train", _read, gsm8k_problems("train"), GSM8K_INSTRUCTION),
        Benchmark("math500", _read, math500_problems, BOXED_INSTRUCTION),
        Benchmark("math_train", _math_tar, math_train_problems, BOXED_INSTRUCTION),
        Benchmark("mmlu_stem", _read, mmlu_stem_problems, CHOICE_INSTRUCTION),
        Benchmark("gpqa", _gpqa_zip, gpqa_problems, CHOICE_INSTRUCTION),
        Benchmark("aime23", _read, aime23_problems, BOXED_INSTRUCTION, **AIME),
        Benchmark("aime24", _read, numeric_problems("aime24"), BOXED_INSTRUCTION, **AIME),
        Benchmark("aime25", _read, numeric_problems("aime25", ids=False, repair=True), BOXED_INSTRUCTION, **AIME),
        Benchmark("amc23", _read, numeric_problems("amc23", "question"), BOXED_INSTRUCTION),
        Benchmark("olympiadbench", _read, olympiadbench_problems, BOXED_INSTRUCTION),
    ]
}
PAPER = ("gsm8k", "math500", "mmlu_stem", "gpqa", "aime23", "aime24", "aime25")  # the ICT paper's seven


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; valid: {sorted(BENCHMARKS)} or 'paper' ({', '.join(PAPER)})")
    return BENCHMARKS[name]


def expand(names: str | list[str]) -> list[str]:
    """'paper' → the seven of the paper; 'a,b' or [a, b] → both; every name is checked."""
    items = [item.strip() for item in (names.split(",") if isinstance(names, str) else names)]
    out = list(dict.fromkeys(name for item in items for name in (PAPER if item == "paper" else (item,))))
    for name in out:
        benchmark(name)  # an unknown name fails, listing the valid ones
    return out
