"""Data files (.jsonl, .json, .parquet, .csv) read into rows whose errors name file, line and column, and GSM8K's
final-answer rule."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
Row = tuple[str, dict[str, Any]]  # (where: "file:line" or "source split row n", the row)


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


def read_jsonl(path: Path) -> Iterator[Row]:
    """The rows of a JSONL file (a UTF-8 BOM and CRLF line ends accepted); errors name file:line (and JSON's column)."""
    with path.open("rb") as handle:
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
            yield f"{path}:{lineno}", row


def read_file(path: Path) -> list[Row]:
    """Rows of a local .jsonl / .json (an array of objects) / .parquet / .csv file; errors name the file and line."""
    require_data(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return list(read_jsonl(path))
    if suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8-sig"))  # a BOM is dropped
        except json.JSONDecodeError as err:
            raise json_error(path, err) from None
        except UnicodeDecodeError:
            raise DataFormatError(f"{path}: not UTF-8 text") from None
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise DataFormatError(f"{path}: expected a JSON array of objects (one per problem)")
        return [(f"{path}[{i}]", row) for i, row in enumerate(rows)]
    if suffix == ".csv":
        out = []
        try:
            with path.open(encoding="utf-8-sig", newline="") as handle:
                reader = csv.DictReader(handle, strict=True)
                for row in reader:
                    out.append((f"{path}:{reader.line_num}", row))
        except csv.Error as err:
            raise DataFormatError(f"{path}:{reader.line_num + 1}: not valid CSV ({err})") from None
        except UnicodeDecodeError:
            raise DataFormatError(f"{path}:{reader.line_num + 1}: not UTF-8 text") from None
        return out
    if suffix == ".parquet":
        import pyarrow
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pyarrow.ArrowInvalid, OSError) as err:
            raise DataFormatError(f"{path}: not a readable parquet file ({err})") from None
        return [(f"{path} row {i}", row) for i, row in enumerate(table.to_pylist(), start=1)]
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use one of {', '.join(FILE_SUFFIXES)}")
