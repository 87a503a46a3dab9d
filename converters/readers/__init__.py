"""One reader per source kind. A reader turns a raw corpus into an ordered list of records.

Contract: ``read(...) -> ReadResult``. Readers look at file names, manifests and caption files,
never at media bytes (the writer decodes). Order is deterministic (source order or sorted paths).
A missing or unreadable input path raises :class:`InputError` (the CLI turns it into exit status
2); a bad *entry* becomes a :class:`~converters.records.Problem` and the run goes on. Text is UTF-8,
a leading byte-order mark is dropped (:func:`decode_text`).
"""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """The input as a whole cannot be read (missing path, unreadable top-level file)."""


def existing_file(path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} not found: {p}")
    return p


def existing_dir(path, what: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{what} is not a directory: {p}")
    return p


def open_input(path, what: str):
    """A top-level input file opened for binary reading; an unreadable one is an :class:`InputError`."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror or e}") from e


def read_input(path, what: str) -> bytes:
    """The bytes of a top-level input file (see :func:`open_input`)."""
    with open_input(path, what) as f:
        try:
            return f.read()
        except OSError as e:
            raise InputError(f"cannot read {what} {path}: {e.strerror or e}") from e


def decode_text(data: bytes) -> str:
    """UTF-8 text without a leading byte-order mark (``UnicodeDecodeError`` when not UTF-8)."""
    return data.decode("utf-8-sig")


IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
AUDIO_EXTENSIONS = {".flac", ".wav", ".mp3", ".ogg", ".opus", ".m4a"}
