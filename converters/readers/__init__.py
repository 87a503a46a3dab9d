"""One reader per source kind. A reader turns a raw corpus into an ordered list of records.

Contract: ``read(...) -> ReadResult``. Readers look at file names, manifests and caption files,
never at media bytes (the writer decodes). Order is deterministic (source order or sorted paths).
A missing or unreadable input path raises `InputError` (the CLI turns it into exit status
2); a bad *entry* becomes a `Problem` and the run goes on. Text is UTF-8,
a leading byte-order mark is dropped (`decode_text`).
"""

from __future__ import annotations

import os
from pathlib import Path

from converters.records import clean_texts


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
    """A top-level input file opened for binary reading; an unreadable one is an `InputError`."""
    try:
        return open(path, "rb")
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror or e}") from e


def read_input(path, what: str) -> bytes:
    """The bytes of a top-level input file (see `open_input`)."""
    with open_input(path, what) as f:
        try:
            return f.read()
        except OSError as e:
            raise InputError(f"cannot read {what} {path}: {e.strerror or e}") from e


def is_utf8(text: str) -> bool:
    """False for a ``str`` that cannot be written as UTF-8: one with lone surrogates, as Python
    hands over a file name that is not UTF-8 or a JSON escape such as ``"\\ud800"``."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def printable(text: str) -> str:
    """``text`` as valid UTF-8 for reports and terminals: a file name's undecodable bytes written
    ``\\xNN`` (``caf\\xe9``), any other lone surrogate ``\\udNNN``; valid text unchanged."""
    try:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def undecodable_name(path) -> str | None:
    """None when ``path`` (a ``str`` or ``Path`` from the file system) is valid UTF-8; otherwise its
    `printable` form. No key, JSON document or terminal takes the name itself."""
    return None if is_utf8(str(path)) else printable(str(path))


def caption_texts(value, field: str) -> tuple[tuple[str, ...], tuple[str, str] | None]:
    """The captions in one manifest cell or sidecar field: a string or a list of strings, each
    stripped, blank ones dropped. ``((), None)`` when there is none (missing, ``null``, blank: the
    caller's ``empty_text``); ``((), (reason, detail))`` for a value of another type
    (``malformed_line``: a number, an object, a list holding one) or one with lone surrogates
    (``invalid_utf8``)."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if item is not None and not isinstance(item, str):
            return (), (
                "malformed_line",
                f"{field!r} holds {type(item).__name__} {item!r:.40}, not a string",
            )
        if item is not None and not is_utf8(item):
            return (), (
                "invalid_utf8",
                f"{field!r} holds a lone surrogate: {printable(item)[:60]!r}",
            )
    return clean_texts(items), None


def decode_text(data: bytes) -> str:
    """UTF-8 text without a leading byte-order mark (``UnicodeDecodeError`` when not UTF-8)."""
    return data.decode("utf-8-sig")


IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
AUDIO_EXTENSIONS = {".flac", ".wav", ".mp3", ".ogg", ".opus", ".m4a"}
