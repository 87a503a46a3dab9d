"""Row iteration for manifest files: JSONL, CSV, TSV and Parquet.

``iter_rows(path)`` yields ``(row_number, dict)`` for good rows and ``(row_number, Problem)`` for
malformed ones, in file order. A UTF-8 byte-order mark (CSV header, first JSONL line) is dropped.
Parquet rows are read without their binary columns (those stay on
disk and are read by the writer through ``Media.parquet_cell``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

from converters.readers import InputError, decode_text, open_input, read_input
from converters.records import Problem

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}


def detect_format(path: Path, fmt: str | None) -> str:
    fmt = fmt or FORMATS.get(path.suffix.lower())
    if fmt not in set(FORMATS.values()):
        raise InputError(
            f"{path}: cannot tell the manifest format from {path.suffix!r}; pass --format jsonl|csv|tsv|parquet"
        )
    return fmt


def _parquet_schema(path: Path):
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path)
    except Exception as e:  # pyarrow raises several types for a file that is not Parquet
        raise InputError(f"{path}: cannot read as Parquet ({e})") from e


def binary_columns(path: Path) -> set[str]:
    """Columns of a Parquet file holding bytes (``binary``, or a struct with a ``bytes`` field)."""
    import pyarrow as pa

    schema = _parquet_schema(path)
    out = set()
    for f in schema:
        if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type):
            out.add(f.name)
        elif pa.types.is_struct(f.type) and any(c.name == "bytes" for c in f.type):
            out.add(f.name)
    return out


def _iter_jsonl(path: Path):
    with open_input(path, "manifest") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(decode_text(raw))
            except UnicodeDecodeError as e:
                yield n, Problem("invalid_utf8", f"line {n}", str(e))
                continue
            except ValueError as e:
                yield n, Problem("malformed_line", f"line {n}", str(e)[:200])
                continue
            yield (
                n,
                row
                if isinstance(row, dict)
                else Problem("malformed_line", f"line {n}", "not a JSON object"),
            )


def _delimited_text(path: Path) -> str:
    try:
        return decode_text(read_input(path, "manifest"))
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 ({e})") from e


def _iter_delimited(path: Path, delimiter: str):
    reader = csv.DictReader(io.StringIO(_delimited_text(path), newline=""), delimiter=delimiter)
    if not reader.fieldnames:
        raise InputError(f"{path}: no header row")
    for n, row in enumerate(reader, 2):
        if None in row or any(v is None for v in row.values()):
            yield (
                n,
                Problem("malformed_line", f"line {n}", f"expected {len(reader.fieldnames)} fields"),
            )
        else:
            yield n, row


def _iter_parquet(path: Path, keep_binary: tuple[str, ...] = ()):
    import pyarrow.parquet as pq

    # raises InputError for a file that is not Parquet
    skip = binary_columns(path) - set(keep_binary)
    pf = pq.ParquetFile(path)
    columns = [n for n in pf.schema_arrow.names if n not in skip]

    def rows():
        n = 0
        for batch in pf.iter_batches(columns=columns or None, batch_size=4096):
            for row in batch.to_pylist():
                yield n, row
                n += 1

    return rows()


def iter_rows(
    path: Path, fmt: str, keep_binary: tuple[str, ...] = ()
) -> Iterator[tuple[int, dict | Problem]]:
    """``keep_binary``: Parquet binary columns read into the rows anyway (as ``bytes``)."""
    if fmt == "jsonl":
        return _iter_jsonl(path)
    if fmt in ("csv", "tsv"):
        return _iter_delimited(path, "," if fmt == "csv" else "\t")
    return _iter_parquet(path, keep_binary)


def _jsonl_fields(path: Path, columns: list[str]) -> set[str] | None:
    """The fields of a JSONL manifest's objects, read until every one of ``columns`` was seen
    (usually the first line); None when no line is a JSON object (then per-line problems say why)."""
    names, seen = set(), False
    for _, row in _iter_jsonl(path):
        if isinstance(row, dict):
            seen = True
            names.update(row)
            if all(c in names for c in columns):
                break
    return names if seen else None


def require_columns(path: Path, fmt: str, columns: list[str]) -> None:
    """Fail early, naming the columns, when a manifest lacks a required column. In JSONL a field
    is missing when no line has it; a line without a field the others have is a per-row problem."""
    if fmt == "parquet":
        names = set(_parquet_schema(path).names)
    elif fmt in ("csv", "tsv"):
        with open_input(path, "manifest") as f:
            header = f.readline().decode("utf-8-sig", errors="replace")
        names = set(next(csv.reader([header], delimiter="," if fmt == "csv" else "\t"), []))
    else:
        names = _jsonl_fields(path, columns)
        if names is None:
            return
    missing = [c for c in columns if c not in names]
    if missing:
        raise InputError(
            f"{path}: no column {', '.join(map(repr, missing))} (columns: {', '.join(sorted(names))})"
        )
