"""Image-text manifests (JSONL, CSV, TSV, Parquet), LAION/HF style.

``--image-column`` holds a path (resolved relative to the manifest's folder) or, in Parquet, the
image bytes (``binary`` or an HF ``{"bytes", "path"}`` struct). ``--text-column`` holds a caption or
a list of captions. Key = ``--id-column`` if given (a row whose id is missing, ``null`` or empty
is a ``malformed_line``, never the key ``None``), else the image path without extension, else
``row-<n>``. A caption that is no string (or list of strings) is a ``malformed_line`` naming its
type, one with lone surrogates (a JSON ``"\\ud800"``), like such an id or path, an ``invalid_utf8``.
"""

from __future__ import annotations

from pathlib import Path

from converters.readers import caption_texts, existing_file, is_utf8, printable
from converters.readers.tables import binary_columns, detect_format, iter_rows, require_columns
from converters.records import Media, Problem, ReadResult, Record, id_text, make_key


def _source_id(
    row: dict, n: int, image, id_column: str | None, inline: bool
) -> tuple[str, str | None]:
    """``(source id, declared id)``: the declared id when ``id_column`` is given (``row <n>`` in
    its place when missing), else the image path without extension, else ``row-<n>``; printable."""
    declared = id_text(row.get(id_column)) if id_column else None
    if id_column:
        return printable(declared or f"row {n}"), declared
    if not inline and isinstance(image, str) and image:
        return printable(str(Path(image).with_suffix(""))), None
    return f"row-{n:09d}", None


def _row_texts(row: dict, n: int, source_id: str, declared, image, columns: tuple, inline: bool):
    """The row's captions, or the `Problem` that skips it (module doc)."""
    image_column, text_column, id_column = columns
    if not inline and not (isinstance(image, str) and image):
        return Problem("malformed_line", source_id, f"row {n}: no {image_column!r} path")
    texts, bad = caption_texts(row.get(text_column), text_column)
    if bad:
        return Problem(bad[0], source_id, f"row {n}: {bad[1]}")
    if not texts:
        return Problem("empty_text", source_id, f"row {n}: empty {text_column!r}")
    if id_column and declared is None:
        return Problem(
            "malformed_line", source_id, f"row {n}: no {id_column!r} (missing, null or empty)"
        )
    for column, value in ((id_column, declared), (image_column, None if inline else image)):
        if value is not None and not is_utf8(value):
            return Problem("invalid_utf8", source_id, f"row {n}: {column!r} holds a lone surrogate")
    return texts


def read(
    manifest: str,
    image_column: str = "image",
    text_column: str = "caption",
    id_column: str | None = None,
    fmt: str | None = None,
) -> ReadResult:
    path = existing_file(manifest, "manifest")
    fmt = detect_format(path, fmt)
    require_columns(path, fmt, [c for c in (image_column, text_column, id_column) if c])
    inline = fmt == "parquet" and image_column in binary_columns(path)
    records, problems = [], []
    for n, row in iter_rows(path, fmt):
        if isinstance(row, Problem):
            problems.append(row)
            continue
        image = None if inline else row.get(image_column)
        source_id, declared = _source_id(row, n, image, id_column, inline)
        texts = _row_texts(
            row, n, source_id, declared, image, (image_column, text_column, id_column), inline
        )
        if isinstance(texts, Problem):
            problems.append(texts)
            continue
        media = (
            Media(
                path=str(path),
                name=f"{path.name}[{n}].{image_column}",
                parquet_cell=(image_column, n),
            )
            if inline
            else Media(path=str((path.parent / image).resolve()), name=image)
        )
        records.append(
            Record(
                key=make_key(source_id),
                source_id=source_id,
                media=media,
                texts=texts,
                extra={"manifest_row": n},
            )
        )
    return ReadResult("image", records, problems)
