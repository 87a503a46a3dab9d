"""Image-text manifests (JSONL, CSV, TSV, Parquet), LAION/HF style.

``--image-column`` holds a path (resolved relative to the manifest's folder) or, in Parquet, the
image bytes (``binary`` or an HF ``{"bytes", "path"}`` struct). ``--text-column`` holds a caption or
a list of captions. Key = ``--id-column`` if given (a row whose id is missing, ``null`` or empty
is a ``malformed_line``, never the key ``None``), else the image path without extension, else
``row-<n>``.
"""

from __future__ import annotations

from pathlib import Path

from converters.readers import existing_file
from converters.readers.tables import binary_columns, detect_format, iter_rows, require_columns
from converters.records import Media, Problem, ReadResult, Record, clean_texts, id_text, make_key


def read(manifest: str, image_column: str = "image", text_column: str = "caption",
         id_column: str | None = None, fmt: str | None = None) -> ReadResult:
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
        declared = id_text(row.get(id_column)) if id_column else None
        if id_column:
            source_id = declared or f"row {n}"
        elif isinstance(image, str) and image:
            source_id = str(Path(image).with_suffix(""))
        else:
            source_id = f"row-{n:09d}"
        if not inline and not (isinstance(image, str) and image):
            problems.append(Problem("malformed_line", source_id, f"row {n}: no {image_column!r} path"))
            continue
        caption = row.get(text_column)
        texts = clean_texts(caption if isinstance(caption, list) else [caption])
        if not texts:
            problems.append(Problem("empty_text", source_id, f"row {n}: empty {text_column!r}"))
            continue
        if id_column and declared is None:
            problems.append(Problem("malformed_line", source_id, f"row {n}: no {id_column!r} (missing, null or empty)"))
            continue
        media = (
            Media(path=str(path), name=f"{path.name}[{n}].{image_column}", parquet_cell=(image_column, n))
            if inline
            else Media(path=str((path.parent / image).resolve()), name=image)
        )
        records.append(Record(key=make_key(source_id), source_id=source_id, media=media, texts=texts,
                              extra={"manifest_row": n}))
    return ReadResult("image", records, problems)
