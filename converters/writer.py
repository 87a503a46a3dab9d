"""The writer: one work unit in, one deterministic tar shard out (plus its stats file).

Bytes are a pure function of the unit and the options: members are written in record order, each
sample's parts in sorted order, with mtime 0, uid/gid 0, fixed user/group names and mode 0444. The
tar goes to ``NAME.tmp`` first and is renamed when complete and flushed; the stats file, written
the same way, is what marks the unit done. A killed writer leaves at most a ``.tmp`` file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import webdataset as wds

from converters.media import (
    AudioOptions,
    ImageOptions,
    MediaError,
    VideoOptions,
    encode_audio,
    encode_image,
    encode_video,
)
from converters.records import Media, Problem, Record
from converters.units import WorkUnit

STATS_DIR = ".convert/units"


@dataclass(frozen=True)
class WriteOptions:
    modality: str  #: "image", "audio", "video" or "text"
    source_kind: str  #: reader name, stored as provenance
    image: ImageOptions = field(default_factory=ImageOptions)
    audio: AudioOptions = field(default_factory=AudioOptions)
    video: VideoOptions = field(default_factory=VideoOptions)


class _ParquetCells:
    """Reads image bytes out of a Parquet column, one row group at a time (units are contiguous)."""

    def __init__(self):
        self._file, self._bounds, self._cached = None, [], (None, None, None)

    def get(self, path: str, column: str, row: int) -> bytes:
        import pyarrow.parquet as pq

        if self._file is None or self._file[0] != path:
            pf = pq.ParquetFile(path)
            starts, n = [], 0
            for g in range(pf.num_row_groups):
                starts.append(n)
                n += pf.metadata.row_group(g).num_rows
            self._file, self._bounds = (path, pf), starts
        group = max(i for i, s in enumerate(self._bounds) if s <= row)
        if self._cached[:2] != (path, group):
            self._cached = (
                path,
                group,
                self._file[1].read_row_group(group, columns=[column]).column(0).to_pylist(),
            )
        value = self._cached[2][row - self._bounds[group]]
        if isinstance(value, dict):
            value = value.get("bytes")
        return value or b""


def _read_media(media: Media, cells: _ParquetCells) -> bytes:
    if media.data is not None:
        return media.data
    if media.parquet_cell is not None:
        return cells.get(media.path, *media.parquet_cell)
    try:
        return Path(media.path).read_bytes()
    except FileNotFoundError as e:
        raise MediaError("missing_file", f"{media.name}: not found") from e
    except OSError as e:
        raise MediaError("missing_file", f"{media.name}: {e.strerror}") from e


def encode_record(rec: Record, opts: WriteOptions, cells: _ParquetCells) -> dict:
    """Record → the sample dict for ``TarWriter`` (``__key__`` plus bytes parts). A ``text``
    record has no media: its only part is ``text.json`` = ``{"text", "source"}``."""
    if opts.modality == "conversation":  # LLaVA-style: several images + conversation.json
        from converters.readers.llava import encode_record as encode_conversation

        return encode_conversation(rec, opts, lambda media: _read_media(media, cells))
    source = {"kind": opts.source_kind, "id": rec.source_id, "file": rec.media.name, **rec.extra}
    if opts.modality == "text":
        doc = {"text": rec.texts[0], "source": source}
        return {
            "__key__": rec.key,
            "text.json": json.dumps(doc, sort_keys=True, ensure_ascii=False).encode("utf-8"),
        }
    data = _read_media(rec.media, cells)
    if opts.modality == "image":
        ext, payload, info = encode_image(data, opts.image)
        text = {"caption": rec.texts[0], "captions": list(rec.texts), "source": {**source, **info}}
        part = "image"
    elif opts.modality == "video":
        ext, payload, info = encode_video(data, opts.video)
        text = {"text": rec.texts[0], "captions": list(rec.texts), "source": {**source, **info}}
        part = "video"
    elif opts.modality == "pointcloud":  # convert 3d: meshes and point clouds
        from converters.mesh3d import encode_3d

        ext, payload, info = encode_3d(
            data, rec.media.name, None if rec.media.parquet_cell else rec.media.path
        )
        text = {"text": rec.texts[0], "captions": list(rec.texts), "source": {**source, **info}}
        part = "pointcloud"
    else:
        ext, payload, info = encode_audio(data, opts.audio)
        text = {"text": rec.texts[0], "source": {**source, **info}}
        part = "audio"
    return {
        "__key__": rec.key,
        f"{part}.{ext}": payload,
        "text.json": json.dumps(text, sort_keys=True, ensure_ascii=False).encode("utf-8"),
    }


def atomic_write_bytes(path: Path, write) -> None:
    """Write through ``write(file)`` to ``PATH.tmp``, fsync, rename: readers see all or nothing."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_unit(unit: WorkUnit, out_dir: str, opts: WriteOptions) -> dict:
    """Write one shard and its stats file; return the stats.

    Stats: ``shard``, ``samples``, ``bytes``, ``sha256``, ``extensions`` (part names written, e.g.
    ``["image.png"]``), ``problems`` (one dict per skipped record) and ``cut`` (source ids of the
    videos cut to ``--max-seconds``). A unit whose records are all bad writes no tar (Energon
    rejects empty shards) and has ``samples == 0``.
    """
    out = Path(out_dir)
    cells = _ParquetCells()
    samples, problems, cut = [], [], []
    for rec in unit.records:
        try:
            samples.append(encode_record(rec, opts, cells))
        except MediaError as e:
            problems.append(Problem(e.reason, rec.source_id, str(e)[:300]).to_json())
            continue
        if (
            opts.modality == "video"
            and "cut_to_seconds" in json.loads(samples[-1]["text.json"])["source"]
        ):
            cut.append(rec.source_id)
    stats = {
        "shard": unit.name,
        "samples": len(samples),
        "bytes": 0,
        "sha256": None,
        "extensions": sorted({k for s in samples for k in s if k != "__key__"}),
        "problems": problems,
        "cut": cut,
    }
    if samples:
        shard = out / unit.name
        shard.parent.mkdir(parents=True, exist_ok=True)

        def write_tar(f):
            with wds.TarWriter(f, user="energon", group="energon", mtime=0, encoder=False) as tw:
                for s in samples:
                    tw.write(s)

        atomic_write_bytes(shard, write_tar)
        stats["bytes"] = shard.stat().st_size
        stats["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    stats_path = out / STATS_DIR / unit.stats_name
    stats_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(stats_path, lambda f: f.write(json.dumps(stats, sort_keys=True).encode()))
    return stats


def shard_problem(out_dir, shard: str, size: int) -> str | None:
    """Why a written shard is no longer what was written (missing, other size), or None.
    Cheap: existence and size only, never the content. ``out_dir``: a path or an Energon ``EPath``."""
    # or an EPath
    path = Path(out_dir) / shard if isinstance(out_dir, (str, Path)) else out_dir / shard
    try:
        actual = path.stat().st_size if isinstance(path, Path) else path.size()
    except OSError:
        return f"{shard}: missing"
    return None if actual == size else f"{shard}: {actual} bytes, {size} written"


def load_stats(out_dir: str, unit: WorkUnit) -> dict | None:
    """The stats of a finished unit, or None when the unit still has to run (no stats, or its
    shard is missing or changed size since it was written)."""
    path = Path(out_dir) / STATS_DIR / unit.stats_name
    try:
        stats = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if stats["samples"] and shard_problem(out_dir, unit.name, stats["bytes"]):
        return None
    return stats
