"""Readers of static sources: JSONL, CSV, Parquet and a `datasets.save_to_disk` folder.

Each reader yields `(row number, record)` pairs: a dict of the source's columns, or a `BadRow` when
that one row cannot be read (invalid JSON, undecodable text, a wrong number of CSV fields), which
`on_bad_rows: skip` may drop. A problem with the whole file (missing, unreadable, a mapped column
absent from the header or schema, a column of the wrong type) raises `RawDataError` at once.
Line numbers are 1-based (JSONL, CSV); row numbers are 0-based indices (Parquet, datasets).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # pyarrow loads when a Parquet file is read: the code location imports this module
    import pyarrow as pa


class RawDataError(ValueError):
    """A source that cannot be read; the message names the file and, where known, the line or row."""


class BadRow(RawDataError):
    """One row that cannot be used; `on_bad_rows: skip` drops it and reports it."""


Records = Iterator[tuple[int, "dict | BadRow"]]


def where(label: str, kind: str, number: int) -> str:
    """`file:line` for line-based files, `file: row N` for tables and generators."""
    return f"{label}:{number}" if kind in ("jsonl", "csv") else f"{label}: row {number}"


def read_jsonl(path: Path, label: str) -> Records:
    with open(path, "rb") as handle:
        for line_number, raw_line in enumerate(handle, start=1):
            try:
                line = raw_line.decode("utf-8-sig" if line_number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                yield line_number, BadRow(f"{label}:{line_number}: not UTF-8 text ({error.reason} at column {error.start + 1})")
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line.rstrip("\r\n"))  # so the column of an error is on this line
            except json.JSONDecodeError as error:
                yield line_number, BadRow(f"{label}:{line_number}: invalid JSON ({error.msg} at column {error.colno})")
                continue
            if not isinstance(record, dict):
                yield line_number, BadRow(f"{label}:{line_number}: expected a JSON object, got {type(record).__name__}")
                continue
            yield line_number, record


def read_csv(path: Path, label: str, needed: dict[str, str]) -> Records:
    """A CSV file with a header line; every value is text. Undecodable bytes stop the whole file
    (a quoted field may span lines, so no single record can be dropped safely)."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise RawDataError(f"{label}:{line}: not UTF-8 text ({error.reason})") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if not header:
            raise RawDataError(f"{label}: empty file (no header line)")
        _check_columns(label, needed, header, "the header")
        while True:
            start = reader.line_num + 1
            fields = next(reader, None)
            if fields is None:
                return
            if not fields:
                continue  # blank line
            if len(fields) != len(header):
                yield start, BadRow(f"{label}:{start}: expected {len(header)} fields as in the header, got {len(fields)}")
                continue
            yield start, dict(zip(header, fields))
    except csv.Error as error:
        raise RawDataError(f"{label}:{reader.line_num}: not valid CSV ({error})") from None


def read_parquet(path: Path, label: str, needed: dict[str, str], typed: list[str]) -> Records:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        _check_columns(label, needed, schema.names, "the file")
        _check_types(label, schema, typed)
        table = pq.read_table(path, columns=list(needed))
    except (pa.ArrowInvalid, OSError) as error:
        raise RawDataError(f"{label}: not a Parquet file ({error})") from None
    yield from enumerate(table.to_pylist())


def read_hf_dataset(path: Path, label: str, needed: dict[str, str], typed: list[str], split: str | None) -> Records:
    """A folder written by `Dataset.save_to_disk` (or `DatasetDict.save_to_disk`, with `split`)."""
    import datasets  # heavy; only for this kind

    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as error:
        raise RawDataError(f"{label}: not a datasets folder written by save_to_disk ({error})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise RawDataError(f"{label}: holds splits {sorted(loaded)}; choose one with split" if split is None
                               else f"{label}: no split {split!r}; the folder holds {sorted(loaded)}")
        loaded = loaded[split]
    elif split is not None:
        raise RawDataError(f"{label}: holds a single Dataset, not a DatasetDict; remove split: {split}")
    _check_columns(label, needed, loaded.column_names, "the dataset")
    _check_types(label, loaded.data.schema, typed)
    yield from enumerate(loaded.select_columns(list(needed)).to_list())


def _check_columns(label: str, needed: dict[str, str], present: list[str], what: str) -> None:
    for column, field in needed.items():
        if column not in present:
            raise RawDataError(f"{label}: no column {column!r} (mapped to {field}) in {what}; it has: {', '.join(present)}")


def _check_types(label: str, schema: pa.Schema, columns: list[str]) -> None:
    """Prompt and answer columns must hold text or numbers, whole columns checked at once."""
    import pyarrow as pa

    for column in columns:
        kind = schema.field(column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)
                or pa.types.is_floating(kind) or pa.types.is_null(kind)):
            raise RawDataError(f"{label}: column {column!r} has type {kind}; prompt and answer columns must be text or numbers")
