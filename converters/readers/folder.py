"""An image folder with caption sidecars: ``a/b/img.jpg`` + ``a/b/img.txt`` or ``a/b/img.json``.

``.txt``: one caption per non-empty line. ``.json``: ``caption`` (str), ``captions`` (list) or
``text``. Sidecar extensions match in any case (``.TXT``); the first sidecar that yields a caption
wins (``.txt`` before ``.json``), so an empty ``.txt`` does not hide a good ``.json``. Key = the
relative path without extension (made key-safe). Images are visited in sorted path order; an image
name that is a dangling symlink or a symlink loop is a ``missing_file``, and a name that is not
UTF-8 an ``invalid_file_name`` (its id printed with ``\\xNN`` escapes): never skipped silently.
Hidden files and folders (a name starting with ``.``) and the folders file managers write
(`SYSTEM_FOLDERS`) are not part of the corpus and are not read (`hidden`).
"""

from __future__ import annotations

import errno
import json
import os
from collections import defaultdict
from pathlib import Path

from converters.readers import (
    IMAGE_EXTENSIONS,
    caption_texts,
    decode_text,
    existing_dir,
    undecodable_name,
)
from converters.records import Media, Problem, ReadResult, Record, clean_texts, make_key

SIDECAR_EXTENSIONS = (".txt", ".json")


def _parse_sidecar(side: Path, source_id: str) -> tuple[tuple[str, ...], Problem | None]:
    try:
        text = decode_text(side.read_bytes())
    except UnicodeDecodeError as e:
        return (), Problem("invalid_utf8", source_id, f"{side.name}: {e}")
    except OSError as e:
        return (), Problem("missing_file", source_id, f"{side.name}: {e.strerror or e}")
    if side.suffix.lower() == ".txt":
        return clean_texts(text.splitlines()), None
    try:
        doc = json.loads(text)
    except ValueError as e:
        return (), Problem("malformed_line", source_id, f"{side.name}: {e}")
    if isinstance(doc, str):
        return clean_texts([doc]), None
    if not isinstance(doc, dict):
        return (), Problem("malformed_line", source_id, f"{side.name}: expected an object")
    field = next((f for f in ("captions", "caption", "text") if doc.get(f)), "caption")
    texts, bad = caption_texts(doc.get(field), field)
    return texts, Problem(bad[0], source_id, f"{side.name}: {bad[1]}") if bad else None


def _sidecar_texts(sidecars: list[Path], source_id: str) -> tuple[tuple[str, ...], Problem | None]:
    """Captions from the first sidecar that has any; else the first problem met, if any."""
    first_problem = None
    for side in sidecars:
        texts, problem = _parse_sidecar(side, source_id)
        if texts:
            return texts, None
        first_problem = first_problem or problem
    return (), first_problem


def _broken_link(path: Path) -> str | None:
    """Why a directory entry that is a symlink cannot be read (None when it can, or is no link)."""
    if not path.is_symlink():
        return None
    try:
        os.stat(path)
    except OSError as e:
        return "symlink loop" if e.errno == errno.ELOOP else f"dangling symlink ({e.strerror})"
    return None


#: Folders that file managers and operating systems write beside a user's files.
SYSTEM_FOLDERS = {"@eaDir", "__MACOSX", "$RECYCLE.BIN", "System Volume Information"}


def hidden(rel: Path) -> bool:
    """Whether ``rel`` (relative to the input folder) is no file of the corpus: a hidden name at
    any depth (``.thumbnails/``, ``.x.jpg``, macOS's ``._x.jpg``) or inside a system folder
    (Synology's ``@eaDir/``, ``__MACOSX/``)."""
    return any(part.startswith(".") or part in SYSTEM_FOLDERS for part in rel.parts)


def read(
    root: str, extensions=IMAGE_EXTENSIONS, modality: str = "image", what: str = "image folder"
) -> ReadResult:
    """Records of the media files under ``root`` (``extensions``, lower case with the dot; images by
    default, as ``convert folder`` reads them) with their sidecars; ``modality`` names the result."""
    base = existing_dir(root, what)
    entries = sorted(p for p in base.rglob("*") if not hidden(p.relative_to(base)))
    sidecars = defaultdict(list)  # (folder, stem) -> sidecar files, .txt first
    for p in entries:
        if p.suffix.lower() in SIDECAR_EXTENSIONS and p.is_file():
            sidecars[p.parent, p.stem].append(p)
    for files in sidecars.values():
        files.sort(key=lambda p: (SIDECAR_EXTENSIONS.index(p.suffix.lower()), p.name))
    records, problems = [], []
    for image in (p for p in entries if p.suffix.lower() in extensions):
        rel = image.relative_to(base)
        if undecodable_name(rel):
            problems.append(
                Problem(
                    "invalid_file_name",
                    undecodable_name(rel.with_suffix("")),
                    f"{undecodable_name(rel)}: the file name is not UTF-8; rename it",
                )
            )
            continue
        source_id = rel.with_suffix("").as_posix()
        broken = _broken_link(image)
        if broken:
            problems.append(Problem("missing_file", source_id, f"{image.name}: {broken}"))
            continue
        if not image.is_file():
            continue  # a folder named like an image
        texts, problem = _sidecar_texts(sidecars.get((image.parent, image.stem), []), source_id)
        if problem is not None:
            problems.append(problem)
            continue
        if not texts:
            problems.append(
                Problem("empty_text", source_id, "no caption sidecar (.txt/.json) or it is empty")
            )
            continue
        records.append(
            Record(
                key=make_key(source_id),
                source_id=source_id,
                media=Media(path=str(image), name=image.relative_to(base).as_posix()),
                texts=texts,
            )
        )
    return ReadResult(modality, records, problems)
