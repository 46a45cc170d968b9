"""`task=dataset`: train on any dataset — a Hub id, a folder laid out as a Hub repository, or local .jsonl / .json /
.parquet / .csv files — with the fields named in the config and the answer cut out by `answer_pattern` or
`answer_extractor` (docs/data-and-evaluation.md "Train on your own data")."""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenrl.data.hub import DataUnavailableError, load_rows
from tokenrl.data.jsonl import FILE_SUFFIXES, DataFormatError, Row, gsm8k_final_answer, read_file
from tokenrl.data.tasks import Task
from tokenrl.records.problem import Problem
from tokenrl.records.rules import FREE_TEXT, TEXT, Rule, integer, number, one_of, optional
from tokenrl.rewards.verifiers import check_golds, last_boxed

log = logging.getLogger(__name__)

EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "gsm8k": gsm8k_final_answer,  # the number after the last "####", thousands separators dropped
    "boxed": last_boxed,  # the content of the last \boxed{...}
}
LOOKS_FOR = {"gsm8k": "a '####' followed by the answer", "boxed": "a \\boxed{...}"}  # what each extractor needs
GLOB_CHARACTERS = ("*", "?", "[")


def is_local(source: str) -> bool:
    """A local file or a glob of them, rather than a Hub dataset id or a folder (both read by `datasets`)."""
    return source.lower().endswith(FILE_SUFFIXES) or any(c in source for c in GLOB_CHARACTERS)


def local_files(source: str) -> list[Path]:
    """The file `source` names, or every file its glob matches (sorted: one order on every machine)."""
    if not any(c in source for c in GLOB_CHARACTERS):
        return [Path(source)]
    root, pattern = (Path("/"), source.lstrip("/")) if Path(source).is_absolute() else (Path("."), source)
    files = sorted(path for path in root.glob(pattern) if path.is_file())
    if not files:
        raise FileNotFoundError(f"task.source={source}: the glob matches no file")
    return files


SOURCE = Rule(
    lambda v: (
        isinstance(v, str)
        and (is_local(v) or Path(v).expanduser().is_dir() or re.fullmatch(r"[\w.-]+/[\w.-]+", v) is not None)
    ),
    f"a local file ({', '.join(FILE_SUFFIXES)}), a glob of them (data/*.jsonl), a folder laid out as a Hub "
    "dataset, or a Hub dataset id (org/name)",
)


@lru_cache(maxsize=8)
def folder_problem(folder: str, config: str | None, split: str) -> str | None:
    """Why `datasets` cannot read split `split` of the local `folder` as a dataset, found from its file names alone
    (nothing loads; once per process: the start-up check and the run ask alike), or None."""
    import datasets

    try:
        files = datasets.load_dataset_builder(folder, config).config.data_files
    except Exception as err:  # noqa: BLE001 — `datasets` raises many kinds on a folder it cannot read
        message = str(err).strip().splitlines()
        return message[0] if isinstance(err, (ValueError, FileNotFoundError)) and message else "not a dataset's folder"
    splits = [str(name) for name in files or ()]
    return None if not splits or split in splits else f"its splits: {', '.join(splits)}"


def unreadable_folder(source: str, split: str, reason: str) -> DataFormatError:
    """The one-line error of a `task.source` folder that `datasets` cannot read as split `split`, with the fix."""
    folder = Path(source).expanduser()
    return DataFormatError(
        f"task.source={source} is a folder that `datasets` cannot read as split {split!r} ({reason}); name a file in "
        f"it ({', '.join(FILE_SUFFIXES)}) or a glob of its files, e.g. task.source='{folder / '*.jsonl'}'"
    )


class DatasetTask(Task):
    """Problems from `source` (see the module docstring); ids are `<split>-<row number>`."""

    verifier: str  # set: only a benchmark's may be null (its own)
    config_rules = {
        **Task.config_rules,
        "source": SOURCE,
        "question_field": FREE_TEXT,
        "answer_field": FREE_TEXT,
        "answer_pattern": FREE_TEXT,
        "answer_extractor": optional(one_of(*EXTRACTORS), "none"),
        "config": FREE_TEXT,
        "revision": FREE_TEXT,
        "train_split": TEXT,
        "test_split": FREE_TEXT,
        "test_fraction": number(0, 1, low_open=True, high_open=True),
        "split_seed": integer(0),
        "limit": optional(integer(1), "all"),
    }

    def __init__(
        self,
        source: str,
        question_field: str = "question",
        answer_field: str = "answer",
        answer_pattern: str | None = None,
        answer_extractor: str | None = None,
        instruction: str = "",
        verifier: str = "math",
        system_prompt: str | None = None,
        config: str | None = None,
        revision: str | None = None,
        train_split: str = "train",
        test_split: str | None = None,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        max_new_tokens: int = 1024,
        limit: int | None = None,
    ) -> None:
        super().__init__(instruction or "", verifier, max_new_tokens, system_prompt or None)
        if answer_pattern and answer_extractor:
            raise ValueError("set one of task.answer_pattern and task.answer_extractor, not both")
        try:
            self.pattern = re.compile(answer_pattern) if answer_pattern else None
        except re.error as err:
            raise ValueError(f"task.answer_pattern={answer_pattern!r} is not a valid regex ({err})") from None
        self.local = is_local(source)
        if self.local and train_split != "train":
            raise ValueError(
                f"task.train_split={train_split!r} names a split of a Hub dataset; a local file is one "
                f"split (give the test rows as task.test_split=<file> or hold out task.test_fraction)"
            )
        if self.local and test_split and not test_split.lower().endswith(FILE_SUFFIXES):
            raise ValueError(
                f"task.test_split={test_split!r}: with a local task.source the test split is a second "
                f"file ({', '.join(FILE_SUFFIXES)}), or null to hold out task.test_fraction"
            )
        self.source = str(Path(source).expanduser().resolve()) if self.local else source
        folder = Path(source).expanduser()
        if not self.local and folder.is_dir():  # refused at start-up (config/check.py builds the task), not at its load
            for split in filter(None, (train_split, test_split)):
                reason = folder_problem(str(folder), config, split)
                if reason is not None:
                    raise unreadable_folder(source, split, reason)
        self.fields = {"question": question_field, "answer": answer_field}
        self.extractor = answer_extractor
        self.config, self.revision = config, revision
        self.train_split, self.test_split = train_split, test_split
        self.test_fraction, self.split_seed, self.limit = test_fraction, split_seed, limit
        self._splits: dict[str, list[Problem]] = {}

    def problems(self, split: str) -> list[Problem]:
        if not self._splits:
            self._splits = self._load()
        return self._splits[split][: self.limit or None]

    def _load(self) -> dict[str, list[Problem]]:
        train = self._problems(self._rows(self.source, self.train_split), "train", self.source)
        if self.test_split:
            test_source = str(Path(self.test_split).expanduser().resolve()) if self.local else self.source
            return {
                "train": train,
                "test": self._problems(self._rows(test_source, self.test_split), "test", test_source),
            }
        if len(train) < 2:
            raise ValueError(f"task.source={self.source}: {len(train)} usable row(s), too few to hold out a test split")
        order = list(range(len(train)))
        random.Random(f"{self.split_seed}-held-out").shuffle(order)
        held = set(order[: min(max(1, round(self.test_fraction * len(train))), len(train) - 1)])
        return {
            "train": [p for i, p in enumerate(train) if i not in held],
            "test": [p for i, p in enumerate(train) if i in held],
        }

    def _rows(self, source: str, split: str) -> list[Row]:
        if self.local:
            return [row for path in local_files(source) for row in read_file(path)]
        folder = Path(source).expanduser()
        try:
            rows = load_rows(str(folder) if folder.is_dir() else source, self.config, split, self.revision)
        except Exception as err:  # noqa: BLE001 — `datasets` raises many kinds on a folder it cannot read
            if folder.is_dir():
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise unreadable_folder(source, split, reason) from None
            if isinstance(err, DataUnavailableError):
                raise DataUnavailableError(
                    f"task.source={source!r} (split {split}) is not available from the Hub: "
                    f"{err} A local .jsonl/.json/.parquet/.csv file also works as task.source."
                ) from None
            raise
        return [(f"{source} {split} row {i}", row) for i, row in enumerate(rows, start=1)]

    def _answer(self, value: Any) -> str:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        text = "" if value is None else str(value).strip()
        if text and self.pattern:
            matches = list(self.pattern.finditer(text))
            text = (matches[-1].group(1) if self.pattern.groups else matches[-1].group(0)).strip() if matches else ""
        elif text and self.extractor:
            text = (EXTRACTORS[self.extractor](text) or "").strip()
        return text

    def _problems(self, rows: list[Row], label: str, source: str) -> list[Problem]:
        """The problems of one source's rows; its gold answers are checked against the verifier (check_golds)."""
        if not rows:
            raise DataFormatError(f"{source} ({label}) has no rows")
        out, where, skipped = [], [], 0
        for index, (place, row) in enumerate(rows, start=1):
            for role, key in self.fields.items():
                if key not in row:
                    raise DataFormatError(
                        f"{place}: no field {key!r} (task.{role}_field); the fields are {sorted(row)}"
                    )
            question = row[self.fields["question"]]
            if not isinstance(question, str) or not question.strip():
                raise DataFormatError(f"{place}: field {self.fields['question']!r} is empty or not text")
            answer = self._answer(row[self.fields["answer"]])
            if not answer:
                skipped += 1
                continue
            out.append(Problem(f"{label}-{index}", question, answer, self.verifier))
            where.append(place)
        if skipped:
            how = (
                " or no match of task.answer_pattern"
                if self.pattern
                else (" or nothing to extract" if self.extractor else "")
            )
            log.warning(
                "%s (%s): skipped %d of %d rows without an answer (field %r empty%s)",
                source,
                label,
                skipped,
                len(rows),
                self.fields["answer"],
                how,
            )
        if not out:
            how = (
                f"task.answer_pattern={self.pattern.pattern!r} matched nothing"
                if self.pattern
                else f"task.answer_extractor={self.extractor} found nothing (it looks for {LOOKS_FOR[self.extractor]})"
                if self.extractor
                else "it is empty everywhere"
            )
            raise ValueError(
                f"{source} ({label}): no row has an answer in field {self.fields['answer']!r}: {how}; "
                "check task.answer_field and how the answer is cut out of it"
            )
        fix = (
            f"The gold answers are field {self.fields['answer']!r} (task.answer_field): cut the final answer out of it "
            f"with task.answer_extractor ({' or '.join(sorted(EXTRACTORS))}) or task.answer_pattern, or set "
            "task.verifier to one that reads them."
        )
        check_golds(out, f"{source} ({label})", where, fix=fix)
        return out
