"""What readers produce and what the writer reports: records, problems, keys.

A ``Record`` is one future sample before any media is decoded. Readers build records in a
deterministic order; the writer turns each into tar members or into a ``Problem``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Optional

#: Sample keys: Energon splits a member name at the first dot, so keys never contain one.
KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
_DISALLOWED = re.compile(r"[^A-Za-z0-9_-]+")

#: Reasons a record can be skipped. Reports count by these names.
REASONS = (
    "missing_file",
    "empty_file",
    "not_an_image",
    "undecodable_image",
    "decompression_bomb",
    "undecodable_audio",
    "empty_text",
    "invalid_utf8",
    "malformed_line",
    "duplicate_id",
)


def stable_hash(text: str, n_hex: int = 16) -> str:
    """Hex digest of ``text`` that is identical across processes, machines and Python versions."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()[:n_hex]


def make_key(source_id: str) -> str:
    """Map a source id to a sample key matching ``KEY_PATTERN``.

    Ids that already match are kept as they are. Others have every run of disallowed characters
    replaced by ``_`` and the hash of the *original* id appended, so two ids that differ only in
    disallowed characters (``a.b`` and ``a_b``) still get different keys. Pure function of the id.
    """
    if KEY_PATTERN.match(source_id):
        return source_id
    cleaned = _DISALLOWED.sub("_", source_id).strip("_")[:80] or "id"
    return f"{cleaned}-{stable_hash(source_id, 8)}"


@dataclass(frozen=True)
class Media:
    """Where a record's media comes from: a file path or inline bytes (e.g. a parquet column)."""

    path: Optional[str] = None
    data: Optional[bytes] = None
    name: str = ""  #: original file name (provenance), or a description for inline bytes
    #: bytes stored in a Parquet column: (column, row) of the file at ``path``, read by the writer
    parquet_cell: Optional[tuple[str, int]] = None


@dataclass(frozen=True)
class Record:
    """One sample to be written. ``texts`` are the captions (image) or the transcript (audio)."""

    key: str
    source_id: str
    media: Media
    texts: tuple[str, ...]
    extra: dict = field(default_factory=dict)  #: reader-specific provenance (e.g. speaker id)


@dataclass(frozen=True)
class Problem:
    """A record or input line that was skipped, and why."""

    reason: str
    source_id: str
    detail: str = ""

    def __post_init__(self):
        assert self.reason in REASONS, self.reason

    def to_json(self) -> dict:
        return {"reason": self.reason, "id": self.source_id, "detail": self.detail}


@dataclass
class ReadResult:
    """A reader's output: records in their final order and problems found while reading."""

    modality: str  #: "image" or "audio"
    records: list[Record]
    problems: list[Problem]


def drop_duplicates(records: list[Record]) -> tuple[list[Record], list[Problem]]:
    """Keep the first record of each key; every later one becomes a ``duplicate_id`` problem."""
    seen: dict[str, str] = {}
    kept, problems = [], []
    for rec in records:
        if rec.key in seen:
            problems.append(
                Problem("duplicate_id", rec.source_id, f"key {rec.key!r} already used by {seen[rec.key]!r}")
            )
        else:
            seen[rec.key] = rec.source_id
            kept.append(rec)
    return kept, problems


def clean_texts(texts) -> tuple[str, ...]:
    """Strip texts and drop empty ones; order preserved."""
    return tuple(t.strip() for t in texts if isinstance(t, str) and t.strip())
