"""Benchmark loaders: local files (`data_dir`, default ../shared/data) → one `Problem` shape.

Origins, counts and quirks of each file are in ../shared/data/SOURCES.md. Instructions follow ALGORITHMS.md §6:
GSM8K with verl's "####" prompt, math with \\boxed{}, multiple choice with a boxed letter.
GPQA is read from its password zip in memory; its questions are never written out in plain text.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import random
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tokenrl.data.records import DataFormatError, Problem, read_jsonl

log = logging.getLogger(__name__)

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
BOXED_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
CHOICE_INSTRUCTION = "Think step by step, then give the letter of the correct option within \\boxed{}."
LETTERS = "ABCD"
GPQA_PASSWORD = b"deserted-untie-orchid"   # published by the GPQA authors for their own release


@dataclass(frozen=True)
class Benchmark:
    """A named evaluation (or training) set: how to load it and what each answer looks like."""

    name: str
    load: Callable[[Path], list[Problem]]
    instruction: str
    n_samples: int = 8            # ALGORITHMS.md §6: 8 per problem, 32 for the 30-problem AIME sets
    max_new_tokens: int = 1024


def _require(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"benchmark file {path} does not exist: set paths.data_dir (or TOKENRL_DATA_DIR) "
                                f"to the folder that holds the benchmark data (see ../shared/data/SOURCES.md)")
    return path


def _jsonl(path: Path, fields: tuple[str, ...]):
    return read_jsonl(_require(path), fields)


def _json_array(path: Path) -> list[dict]:
    try:
        rows = json.loads(_require(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataFormatError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(rows, list):
        raise DataFormatError(f"{path}: expected a JSON array of records")
    return rows


def _number_text(value: object) -> str:
    """27.0 -> '27', '012' -> '12', other strings unchanged."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    return str(int(text)) if text.isdigit() else text


def gsm8k_split(split: str) -> Callable[[Path], list[Problem]]:
    def load(data_dir: Path) -> list[Problem]:
        path = data_dir / "gsm8k" / f"{split}.jsonl"
        out = []
        for lineno, row in _jsonl(path, ("question", "answer")):
            if "####" not in row["answer"]:
                raise DataFormatError(f"{path}:{lineno}: field 'answer' has no '#### <number>' final answer")
            final = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
            out.append(Problem(f"gsm8k-{split}-{lineno}", row["question"], final, "gsm8k_strict"))
        return out
    return load


def load_math500(data_dir: Path) -> list[Problem]:
    return [Problem(row.get("unique_id", f"math500-{lineno}"), row["problem"], str(row["answer"]), "math")
            for lineno, row in _jsonl(data_dir / "math500" / "test.jsonl", ("problem", "answer"))]


def load_math_train(data_dir: Path) -> list[Problem]:
    """Hendrycks MATH train (7,500) from the tar archive, read in place; answer = last \\boxed{} of the solution.
    Problems whose solution boxes nothing (an upstream quirk, e.g. `\\boxed{}`) are skipped with a warning."""
    from tokenrl.rewards.verifiers import last_boxed

    path = _require(data_dir / "math_train" / "MATH_train.tar.gz")
    out, skipped = [], []
    with tarfile.open(path) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            if not (member.isfile() and member.name.endswith(".json") and "/train/" in member.name):
                continue
            row = json.loads(archive.extractfile(member).read())
            answer = last_boxed(row["solution"])
            if not answer or not answer.strip():
                skipped.append(member.name)
                continue
            out.append(Problem(member.name.split("train/", 1)[1], row["problem"], answer, "math"))
    if skipped:
        log.warning("%s: skipped %d problems without a boxed answer: %s", path, len(skipped), ", ".join(skipped))
    return out


def _choice_question(question: str, choices: list[str]) -> str:
    return question.strip() + "\n" + "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))


def load_mmlu_stem(data_dir: Path) -> list[Problem]:
    path = data_dir / "mmlu_stem" / "test.jsonl"
    out = []
    for lineno, row in _jsonl(path, ("question", "choices")):
        if len(row["choices"]) != 4 or row.get("answer") not in range(4):
            raise DataFormatError(f"{path}:{lineno}: expected 4 choices and an answer index 0-3")
        out.append(Problem(f"mmlu_stem-{lineno}", _choice_question(row["question"], row["choices"]),
                           LETTERS[row["answer"]], "choice"))
    return out


def load_gpqa(data_dir: Path, seed: int = 0) -> list[Problem]:
    """GPQA-Diamond from the password zip; the four options are shuffled with a per-record seed."""
    path = _require(data_dir / "gpqa" / "gpqa_diamond.zip")
    with zipfile.ZipFile(path) as archive:
        text = archive.read("gpqa_diamond.csv", pwd=GPQA_PASSWORD).decode("utf-8")
    out = []
    for lineno, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        options = [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"], row["Incorrect Answer 3"]]
        if not row.get("Question") or not all(o and o.strip() for o in options):
            raise DataFormatError(f"{path}:gpqa_diamond.csv:{lineno}: empty question or option")
        order = list(range(4))
        random.Random(f"{seed}-{row['Record ID']}").shuffle(order)
        choices = [options[i].strip() for i in order]
        out.append(Problem(row["Record ID"], _choice_question(row["Question"], choices),
                           LETTERS[order.index(0)], "choice"))
    return out


def load_aime23(data_dir: Path) -> list[Problem]:
    rows = [r for r in _json_array(data_dir / "aime23" / "aime.json") if r.get("year") == 2023]
    return [Problem(f"aime23-{r['aime_number']}-{r['problem_number'] + 1}", r["problem"], _number_text(r["answer"]),
                    "math") for r in rows]


def load_aime24(data_dir: Path) -> list[Problem]:
    return [Problem(f"aime24-{row.get('id', lineno)}", row["problem"], _number_text(row["answer"]), "math")
            for lineno, row in _jsonl(data_dir / "aime24" / "test.jsonl", ("problem", "answer"))]


def repair_control_characters(text: str) -> str:
    """Undo the upstream JSON-escaping bug of aime25 (SOURCES.md): U+000C was '\\f', TAB was '\\t'."""
    return text.replace("\x0c", "\\f").replace("\t", "\\t")


def load_aime25(data_dir: Path) -> list[Problem]:
    return [Problem(f"aime25-{lineno}", repair_control_characters(row["problem"]), _number_text(row["answer"]), "math")
            for lineno, row in _jsonl(data_dir / "aime25" / "test.jsonl", ("problem", "answer"))]


def load_amc23(data_dir: Path) -> list[Problem]:
    return [Problem(f"amc23-{row.get('id', lineno)}", row.get("problem") or row["question"],
                    _number_text(row["answer"]), "math")
            for lineno, row in _jsonl(data_dir / "amc23" / "test.jsonl", ("answer",))]


def load_olympiadbench(data_dir: Path) -> list[Problem]:
    out = []
    for lineno, row in _jsonl(data_dir / "olympiadbench" / "test.jsonl", ("question", "final_answer")):
        answers = [a.strip().strip("$") for a in row["final_answer"]]
        out.append(Problem(f"olympiadbench-{row.get('id', lineno)}", row["question"], ", ".join(answers), "math"))
    return out


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in [
    Benchmark("gsm8k", gsm8k_split("test"), GSM8K_INSTRUCTION),
    Benchmark("gsm8k_train", gsm8k_split("train"), GSM8K_INSTRUCTION),
    Benchmark("math500", load_math500, BOXED_INSTRUCTION),
    Benchmark("math_train", load_math_train, BOXED_INSTRUCTION),
    Benchmark("mmlu_stem", load_mmlu_stem, CHOICE_INSTRUCTION),
    Benchmark("gpqa", load_gpqa, CHOICE_INSTRUCTION),
    Benchmark("aime23", load_aime23, BOXED_INSTRUCTION, n_samples=32, max_new_tokens=4096),
    Benchmark("aime24", load_aime24, BOXED_INSTRUCTION, n_samples=32, max_new_tokens=4096),
    Benchmark("aime25", load_aime25, BOXED_INSTRUCTION, n_samples=32, max_new_tokens=4096),
    Benchmark("amc23", load_amc23, BOXED_INSTRUCTION),
    Benchmark("olympiadbench", load_olympiadbench, BOXED_INSTRUCTION),
]}
PAPER = ("gsm8k", "math500", "mmlu_stem", "gpqa", "aime23", "aime24", "aime25")   # the ICT paper's seven


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; valid: {sorted(BENCHMARKS)} or 'paper' ({', '.join(PAPER)})")
    return BENCHMARKS[name]


def expand(names: str | list[str]) -> list[str]:
    """'paper' → the seven of the paper; 'a,b' or [a, b] → both; every name is checked."""
    items = names.split(",") if isinstance(names, str) else list(names)
    out: list[str] = []
    for item in (i.strip() for i in items):
        for name in (PAPER if item == "paper" else (item,)):
            benchmark(name)
            if name not in out:
                out.append(name)
    return out
