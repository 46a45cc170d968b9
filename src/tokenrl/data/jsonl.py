"""GSM8K's final-answer rule and a JSONL reader whose errors name file, line and column."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def gsm8k_final_answer(text: str) -> str | None:
    """GSM8K's final answer: the text after the last "####", thousands separators dropped (None without "####")."""
    return text.rsplit("####", 1)[1].strip().replace(",", "") if "####" in text else None


class DataFormatError(ValueError):
    """A data file that cannot be read; the message names the file and line."""


def json_error(path: Path, err: json.JSONDecodeError, lineno: int | None = None) -> DataFormatError:
    """The error naming file, line and column of a JSON decoding error; `lineno` is the file's line of a JSONL row
    (the decoder saw that line alone)."""
    reason = err.msg.removesuffix(" at")  # "Invalid control character at" and the like
    return DataFormatError(f"{path}:{lineno or err.lineno}: not valid JSON ({reason} at column {err.colno})")


def require_data(path: Path) -> Path:
    """`path`, an existing file with more than whitespace in it."""
    if path.is_dir():
        raise FileNotFoundError(f"{path} is a folder, not a data file")
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    try:
        handle = path.open("rb")
    except PermissionError:
        raise PermissionError(f"data file {path} is not readable (permission denied): check its permissions") from None
    with handle:
        while chunk := handle.read(1 << 20):
            if chunk.strip():
                return path
    raise DataFormatError(f"{path} is empty")


def read_jsonl(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, row) of a JSONL file (a UTF-8 BOM and CRLF line ends accepted); an empty file, a malformed
    row or a missing field raises naming file:line (and the column of a JSON error)."""
    with require_data(path).open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig").rstrip("\r\n")  # a BOM (Windows tools write one) is dropped
            except UnicodeDecodeError:
                raise DataFormatError(f"{path}:{lineno}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)  # columns count on this line
            except json.JSONDecodeError as err:
                raise json_error(path, err, lineno) from None
            if not isinstance(row, dict):
                raise DataFormatError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            missing = [key for key in required if not row.get(key) and row.get(key) != 0]
            if missing:
                raise DataFormatError(f"{path}:{lineno}: missing or empty field(s) {missing}")
            yield lineno, row
