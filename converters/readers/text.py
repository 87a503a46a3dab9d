"""Text-only corpora (``convert text``): one document per JSONL line or CSV/TSV/Parquet row.

Each good row becomes a record with no media and one text, written as ``KEY.text.json`` =
``{"text": ..., "source": {"kind": "text", "id", "file", "manifest_row"}}`` and read back by
Energon as a ``TextSample`` (``.nv-meta/dataset.yaml``: ``field_map: {text: text.json[text]}``).

Contracts:

* ``--text-column`` (default ``text``) holds the document: a string (or, in Parquet, UTF-8
  bytes). Leading/trailing whitespace is stripped, inner whitespace and newlines are kept.
* Key = ``--id-column`` if given, else ``row-<n>`` (JSONL/CSV/TSV: the line number; Parquet: the
  row index). A row whose id is missing, ``null`` or empty is a ``malformed_line`` (never the key
  ``None``); a later row with an id already seen is a ``duplicate_id`` (the first one is kept).
* Bad rows are problems, never fatal: ``empty_text`` (missing, ``null`` or blank text),
  ``invalid_utf8`` (a JSONL line or a Parquet bytes cell that is not UTF-8, or text or id holding
  lone surrogates such as ``"\\ud800"``), ``malformed_line`` (not JSON, not an object, wrong field
  count, a text that is not a string, no id). A CSV/TSV file that is not UTF-8, a missing file or
  a missing column is an `InputError`.
"""

from __future__ import annotations

from converters.readers import existing_file, is_utf8
from converters.readers.tables import binary_columns, detect_format, iter_rows, require_columns
from converters.records import Media, Problem, ReadResult, Record, id_text, make_key


def document_text(value, column: str, n: int, source_id: str) -> str | Problem:
    """The stripped document text of one cell, or the problem with it."""
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            return Problem("invalid_utf8", source_id, f"row {n}: {column!r}: {e}")
    if value is None:
        return Problem("empty_text", source_id, f"row {n}: no {column!r}")
    if not isinstance(value, str):
        return Problem(
            "malformed_line",
            source_id,
            f"row {n}: {column!r} is {type(value).__name__}, not a string",
        )
    if not is_utf8(value):
        return Problem("invalid_utf8", source_id, f"row {n}: {column!r} holds a lone surrogate")
    text = value.strip()
    return text if text else Problem("empty_text", source_id, f"row {n}: empty {column!r}")


def read(
    manifest: str, text_column: str = "text", id_column: str | None = None, fmt: str | None = None
) -> ReadResult:
    """The documents of ``manifest`` in file order (module doc: columns, keys, problems)."""
    path = existing_file(manifest, "manifest")
    fmt = detect_format(path, fmt)
    require_columns(path, fmt, [c for c in (text_column, id_column) if c])
    keep = tuple(
        c for c in (text_column, id_column) if c and fmt == "parquet" and c in binary_columns(path)
    )
    records, problems = [], []
    for n, row in iter_rows(path, fmt, keep_binary=keep):
        if isinstance(row, Problem):
            problems.append(row)
            continue
        if id_column:
            raw_id = row.get(id_column)
            if isinstance(raw_id, (bytes, bytearray)):
                raw_id = bytes(raw_id).decode("utf-8", errors="surrogateescape")
            source_id = id_text(raw_id)
            if source_id is None:
                problems.append(
                    Problem(
                        "malformed_line",
                        f"row {n}",
                        f"row {n}: no {id_column!r} (missing, null or empty)",
                    )
                )
                continue
            if not is_utf8(source_id):
                problems.append(
                    Problem(
                        "invalid_utf8", f"row {n}", f"row {n}: {id_column!r} is not valid UTF-8"
                    )
                )
                continue
        else:
            source_id = f"row-{n:09d}"
        text = document_text(row.get(text_column), text_column, n, source_id)
        if isinstance(text, Problem):
            problems.append(text)
            continue
        records.append(
            Record(
                key=make_key(source_id),
                source_id=source_id,
                media=Media(name=f"{path.name}[{n}]"),
                texts=(text,),
                extra={"manifest_row": n},
            )
        )
    return ReadResult("text", records, problems)
