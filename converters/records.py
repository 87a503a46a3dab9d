"""What readers produce and what the writer reports: records, problems, keys.

A ``Record`` is one future sample before any media is decoded. Readers build records in a
deterministic order; the writer turns each into tar members or into a ``Problem``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

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
    "unknown_image_id",  #: a COCO annotation whose image_id names no image (or has another type)
    "invalid_file_name",  #: a media file whose name is not UTF-8 (rename it; keys and reports are UTF-8)
    "not_a_video",  #: video input that is no media file, or an image
    "no_video_stream",  #: a media file without a video stream (e.g. audio only)
    "truncated_video",  #: a video container cut short: unreadable, or fewer frames/seconds than declared
    "undecodable_video",  #: no decoder for the video codec, or its frames (or audio track) fail to decode
    "not_a_3d_file",  #: 3D input in no known mesh / point-cloud format (converters.mesh3d)
    "truncated_3d",  #: a 3D file with fewer elements or bytes than its header (or its faces) declare
    "corrupt_3d",  #: a complete 3D file whose structure contradicts itself (GLB chunk lengths, unparsable content)
    "no_geometry",  #: a 3D file without a vertex, or a mesh format without a face
    "degenerate_3d",  #: non-finite coordinates, every point equal, or zero surface area
)

#: Longest key kept verbatim; longer ids are cut and get the hash suffix (``tar x`` needs short names).
MAX_KEY_LENGTH = 100


def stable_hash(text: str, n_hex: int = 16) -> str:
    """Hex digest of ``text`` that is identical across processes, machines and Python versions."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()[:n_hex]


def make_key(source_id: str) -> str:
    """Map a source id to a sample key matching ``KEY_PATTERN``.

    Ids that already match and are at most ``MAX_KEY_LENGTH`` characters are kept as they are.
    Others have every run of disallowed characters replaced by ``_``, are cut to 80 characters and
    get the hash of the *original* id appended, so two ids that differ only in disallowed characters
    (``a.b`` and ``a_b``) or after the cut still get different keys (at most 89 characters). Pure
    function of the id.
    """
    if KEY_PATTERN.match(source_id) and len(source_id) <= MAX_KEY_LENGTH:
        return source_id
    cleaned = _DISALLOWED.sub("_", source_id).strip("_")[:80] or "id"
    return f"{cleaned}-{stable_hash(source_id, 8)}"


@dataclass(frozen=True)
class Media:
    """Where a record's media comes from: a file path or inline bytes (e.g. a parquet column)."""

    path: str | None = None
    data: bytes | None = None
    name: str = ""  #: original file name (provenance), or a description for inline bytes
    #: bytes stored in a Parquet column: (column, row) of the file at ``path``, read by the writer
    parquet_cell: tuple[str, int] | None = None


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

    modality: str  #: "image", "audio" or "text" (no media: ``Media.name`` only, for provenance)
    records: list[Record]
    problems: list[Problem]


def id_text(value) -> str | None:
    """A source id read from a manifest or annotation field: ``None`` when there is none (missing,
    ``null``, empty or not a string/number), so that it never becomes the key ``None``."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    text = str(value)
    return text if text.strip() else None


def drop_duplicates(records: list[Record]) -> tuple[list[Record], list[Problem]]:
    """Keep the first record of each key; every later one becomes a ``duplicate_id`` problem whose
    detail names both ids and both files."""
    seen: dict[str, Record] = {}
    kept, problems = [], []
    for rec in records:
        first = seen.get(rec.key)
        if first is not None:
            problems.append(
                Problem(
                    "duplicate_id",
                    rec.source_id,
                    f"{rec.media.name}: key {rec.key!r} already used by {first.source_id!r} "
                    f"({first.media.name})",
                )
            )
        else:
            seen[rec.key] = rec
            kept.append(rec)
    return kept, problems


def clean_texts(texts) -> tuple[str, ...]:
    """Strip texts and drop empty ones; order preserved."""
    return tuple(t.strip() for t in texts if isinstance(t, str) and t.strip())
