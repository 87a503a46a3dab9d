"""Energon's index of a shard, recorded once from its tar headers and replayed without the shard.

A shard's *record* (`tar_record`) is what Energon's ``prepare`` reads out of a tar: every
sample's key, byte offset and size, every part's name, data offset and size, and the offset where
the archive's members end. It is taken by walking the tar's headers only (`tarfile` seeks
over member data), so it works on a local file at shard time or on an object read with ranged
requests (`RangedObject`). From records alone:

- `tar_idx_bytes` gives the shard's ``.tar.idx``, byte-identical to Energon's ``TarIndexWriter``
  (the sample start offsets, then the end offset, each a native ``Q``);
- `RecordPreparator` is Energon's own ``WebdatasetPreparator`` whose per-tar step yields
  the rows from the record instead of reading the tar, so ``prepare_dataset`` writes the same
  ``index.sqlite`` rows in the same order, ``.info.json`` and ``split.yaml`` as for the shards
  themselves (the tests compare with a conversion that indexed the shards locally).

Records are JSON-able (lists and ints) and small: about 60 bytes per part.
"""

from __future__ import annotations

import io
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from megatron.energon.flavors.webdataset.config import skip_meta_re, split_name_re
from megatron.energon.flavors.webdataset.prepare import (
    IndexSample,
    IndexSamplePart,
    IndexShardInfo,
    WebdatasetPreparator,
)
from megatron.energon.flavors.webdataset.structs import ShardInfo

#: How many distinct part names a record keeps (Energon's ``max_parts``).
MAX_PARTS = 50


def tar_record(fileobj: BinaryIO) -> dict:
    """The record of the tar in ``fileobj`` (seekable; only headers are read):
    ``{"samples": [[key, offset, size], ...], "parts": [[sample, name, data_offset, size], ...],
    "end": offset, "part_names": [...]}``. Same member filter as Energon's prepare."""
    samples, parts, names = [], [], []
    with tarfile.open(fileobj=fileobj, mode="r:") as tar:
        last = None
        for member in tar:
            if not member.isreg() or member.name is None or skip_meta_re.match(member.name):
                continue
            m = split_name_re.match(member.name)
            if m is None:
                continue
            base, part = m.group(1), m.group(2)
            if len(names) < MAX_PARTS and part not in names:
                names.append(part)
            if base != last:
                if samples:
                    samples[-1][2] = member.offset - samples[-1][1]
                samples.append([base, member.offset, 0])
                last = base
            parts.append([len(samples) - 1, part, member.offset_data, member.size])
        end = tar.offset
    if samples:
        samples[-1][2] = end - samples[-1][1]
    return {"samples": samples, "parts": parts, "end": end, "part_names": names}


def file_record(path: str | Path) -> dict:
    with open(path, "rb") as f:
        return tar_record(f)


def tar_idx_bytes(record: dict) -> bytes:
    """The shard's ``.tar.idx`` as Energon writes it."""
    return b"".join(struct.pack("Q", s[1]) for s in record["samples"]) + struct.pack(
        "Q", record["end"]
    )


def index_items(shard: str, tar_file_id: int, record: dict, parent) -> Iterator:
    """Energon's index rows for one shard, in the order its ``_preprocess_tar`` yields them."""
    samples = record["samples"]
    parts_by_sample: dict[int, list] = {}
    for p in record["parts"]:
        parts_by_sample.setdefault(p[0], []).append(p)
    for i, (key, offset, size) in enumerate(samples):
        for _, name, data_offset, data_size in parts_by_sample.get(i, ()):
            yield IndexSamplePart(
                tar_file_id=tar_file_id,
                sample_index=i,
                part_name=name,
                content_byte_offset=data_offset,
                content_byte_size=data_size,
            )
        # Energon yields a sample's row when the next sample starts (after this sample's parts)
        yield IndexSample(
            tar_file_id=tar_file_id,
            sample_key=key,
            sample_index=i,
            byte_offset=offset,
            byte_size=size,
        )
    yield IndexShardInfo(
        shard_info=ShardInfo(name=shard, path=parent / shard, count=len(samples)),
        parts=set(record["part_names"]),
    )


class RecordPreparator(WebdatasetPreparator):
    """``prepare_dataset`` over records instead of tars. Set `records` (a callable
    ``shard name -> record``) before calling it: Energon's pool forks, so the callable is inherited."""

    records = None

    @staticmethod
    def _preprocess_tar(path, shard_to_idx, parent_path, max_parts, media_filter=None):
        yield from index_items(
            path, shard_to_idx[path], RecordPreparator.records(path), parent_path
        )


class RangedObject(io.RawIOBase):
    """A read-only, seekable file over one object, fetched with ranged GETs through MSC.

    Each read outside the buffer fetches ``max(wanted, readahead)`` bytes from there on (a tar
    header is 512 bytes; a small member after it comes in the same request). `requests` and
    `bytes_read` count what was fetched."""

    def __init__(self, client, key: str, size: int, readahead: int = 64 << 10):
        from multistorageclient.types import Range

        self._client, self._key, self._size, self._ahead, self._range = (
            client,
            key,
            size,
            readahead,
            Range,
        )
        self._pos, self._buf_start, self._buf = 0, 0, b""
        self.requests = self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: offset, 1: self._pos + offset, 2: self._size + offset}[whence]
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), max(0, self._size - self._pos))
        if n == 0:
            return 0
        lo = self._pos - self._buf_start
        if lo < 0 or lo + n > len(self._buf):
            # tarfile probes the byte before each header (truncation check): fetch the header with it
            want = min(max(n, self._ahead) + (512 if n < 512 else 0), self._size - self._pos)
            self._buf = self._client.read(
                self._key, byte_range=self._range(offset=self._pos, size=want)
            )
            self._buf_start, lo = self._pos, 0
            self.requests += 1
            self.bytes_read += len(self._buf)
        b[:n] = self._buf[lo : lo + n]
        self._pos += n
        return n
