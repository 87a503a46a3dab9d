"""An image folder with caption sidecars: ``a/b/img.jpg`` + ``a/b/img.txt`` or ``a/b/img.json``.

``.txt``: one caption per non-empty line. ``.json``: ``caption`` (str), ``captions`` (list) or
``text``. Key = the relative path without extension (made key-safe). Images are visited in sorted
path order.
"""

from __future__ import annotations

import json
from pathlib import Path

from converters.readers import IMAGE_EXTENSIONS, existing_dir
from converters.records import Media, Problem, ReadResult, Record, clean_texts, make_key


def _sidecar_texts(image: Path) -> tuple[tuple[str, ...], Problem | None]:
    rel = image.stem
    for ext in (".txt", ".json"):
        side = image.with_suffix(ext)
        if not side.is_file():
            continue
        try:
            text = side.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            return (), Problem("invalid_utf8", rel, f"{side.name}: {e}")
        if ext == ".txt":
            return clean_texts(text.splitlines()), None
        try:
            doc = json.loads(text)
        except ValueError as e:
            return (), Problem("malformed_line", rel, f"{side.name}: {e}")
        if isinstance(doc, str):
            return clean_texts([doc]), None
        if not isinstance(doc, dict):
            return (), Problem("malformed_line", rel, f"{side.name}: expected an object")
        captions = doc.get("captions") or [doc.get("caption") or doc.get("text")]
        return clean_texts(captions if isinstance(captions, list) else [captions]), None
    return (), None


def read(root: str) -> ReadResult:
    base = existing_dir(root, "image folder")
    records, problems = [], []
    for image in sorted(p for p in base.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()):
        source_id = image.relative_to(base).with_suffix("").as_posix()
        texts, problem = _sidecar_texts(image)
        if problem is not None:
            problems.append(Problem(problem.reason, source_id, problem.detail))
            continue
        if not texts:
            problems.append(Problem("empty_text", source_id, "no caption sidecar (.txt/.json) or it is empty"))
            continue
        records.append(
            Record(
                key=make_key(source_id),
                source_id=source_id,
                media=Media(path=str(image), name=image.relative_to(base).as_posix()),
                texts=texts,
            )
        )
    return ReadResult("image", records, problems)
