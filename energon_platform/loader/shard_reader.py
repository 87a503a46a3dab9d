"""Random access to the raw samples of a split's shards: one read per sample, local or ``msc://``.

Energon's ``ShardInfosITarReader`` gives the same raw samples, but was built for its own loader's
mostly-sequential order: per random sample it re-reads the shard's ``.tar.idx`` (its offset cache
helps consecutive samples only) and keeps a FIFO of 5 open tars. On object storage, where MSC
fetches an object under 512 MiB whole on ``open``, a random order therefore fetches many bytes
per byte delivered and several requests per sample; on local disk it re-reads an index and
re-parses tar headers for every sample. ``python -m scripts.bench.scale --s3`` measures requests per
sample and bytes fetched per byte delivered for our loader and Energon's against a SeaweedFS
(the measurements page, section scale).

`ShardReader` reads exactly one byte range per sample:

* a shard's ``.tar.idx`` (8 bytes per sample, Energon's own index) is read **once** and kept in an
  LRU of `INDEX_CACHE` shards, so memory stays bounded at any corpus size;
* the sample's members are one contiguous range ``[offset[i], offset[i+1])`` of the tar: a local
  ``os.pread`` on a cached file descriptor, or one ranged ``GET`` through the path's MSC client;
* the range is parsed with `tarfile` exactly as Energon's reader parses it (same name
  splitting, meta-file skipping, ``part_filter`` and ``sample_filter``) and returned as the same
  ``FilteredSample`` dict, so ``factory.load_sample`` decodes identically.

Bytes fetched per byte delivered: the tar headers only (512 bytes per member).
"""

from __future__ import annotations

import io
import os
import tarfile
import threading
from bisect import bisect_right
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from typing import Any

import numpy as np
from megatron.energon.flavors.webdataset.config import skip_meta_re, split_name_re
from megatron.energon.flavors.webdataset.structs import FilteredSample
from megatron.energon.source_info import SourceInfo
from multistorageclient.types import Range

#: Shards whose ``.tar.idx`` one reader keeps in memory (8 bytes per sample each).
INDEX_CACHE = 256
#: Local file descriptors one reader keeps open.
FD_CACHE = 64
#: Concurrent range requests of one `ShardReader.fetch_many` on object storage.
FETCH_THREADS = 16


def _members(data: bytes):
    """``(name, read)`` of each regular file in a tar byte range, in order (``read()`` gives its bytes).

    Fast path for what tar writers produce for samples (ustar/v7 headers, regular files: a header
    is parsed by slicing its fixed fields, without building `tarfile`'s objects for each member);
    a range with any other header (GNU long names, pax) is handed to `tarfile` whole. The
    loader's samples/s in ``scripts/bench/loader.py`` include this parsing."""
    out, pos, end = [], 0, len(data)
    while pos + 512 <= end:
        header = data[pos : pos + 512]
        if header.count(0) == 512:  # end-of-archive blocks
            break
        kind = header[156:157]
        if kind not in (b"0", b"\0"):
            if kind == b"5":  # a directory: no data
                pos += 512
                continue
            return _members_tarfile(data)
        try:
            size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:  # base-256 sizes and other exotica
            return _members_tarfile(data)
        member = header[0:100].split(b"\0", 1)[0].decode()
        if header[257:262] == b"ustar" and header[345:500].strip(b"\0"):
            member = header[345:500].split(b"\0", 1)[0].decode() + "/" + member
        start = pos + 512
        out.append((member, lambda a=start, b=start + size: data[a:b]))
        pos = start + -(-size // 512) * 512
    return out


def _members_tarfile(data: bytes):
    tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    return [
        (info.name, lambda info=info: _member_bytes(tar, info)) for info in tar if info.isfile()
    ]


def _member_bytes(tar: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    """A regular member's bytes (``extractfile`` gives None only for other kinds of member)."""
    member = tar.extractfile(info)
    if member is None:
        raise ValueError(f"{info.name}: not a regular file")
    return member.read()


class CorruptShardError(ValueError):
    """A shard's bytes disagree with its index (truncated or changed after conversion): the
    sample is bad data, handled like an undecodable sample, not a failure of the store.
    ``shard``: the shard's name in the dataset (``train/shard-000000.tar``); ``detail``: what is
    wrong, without the path."""

    def __init__(self, message: str, shard: str | None = None, detail: str | None = None):
        super().__init__(message)  # one argument: pickles and re-raises like a plain ValueError
        self.shard, self.detail = shard, detail or message

    @classmethod
    def of(cls, reader: ShardReader, shard: int, detail: str) -> CorruptShardError:
        return cls(
            f"{reader.shards[shard].path}: {detail} (check the dataset with `energon-platform verify`)",
            shard=reader.shards[shard].name,
            detail=detail,
        )


class ShardReader:
    """``reader[i]``: the raw ``FilteredSample`` of dataset index ``i`` (None if filtered out).

    ``base_path`` is the dataset root (``EPath``), ``shards`` Energon's ``ShardInfo`` list of the
    split. Not shared across processes: each DataLoader worker opens its own descriptors/clients.
    """

    def __init__(self, base_path: Any, shards: list, part_filter=None, sample_filter=None):
        self.base_path, self.shards = base_path, shards
        self.part_filter, self.sample_filter = part_filter, sample_filter
        self._starts = [0, *accumulate(s.count for s in shards)]
        self._index: OrderedDict[int, np.ndarray] = OrderedDict()
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._lock = threading.Lock()  # the caches are shared by fetch_many's threads
        self._pool = None

    def __len__(self) -> int:
        return self._starts[-1]

    def _offsets(self, shard: int) -> np.ndarray:
        """The shard's sample offsets (``count + 1`` entries, the last one the end of the data)."""
        with self._lock:
            if shard in self._index:
                self._index.move_to_end(shard)
                return self._index[shard]
        idx = self.shards[shard].path.with_suffix(".tar.idx")
        offsets = np.frombuffer(self._read_all(idx), dtype="<u8")
        with self._lock:
            self._index[shard] = offsets
            if len(self._index) > INDEX_CACHE:
                self._index.popitem(last=False)
        return offsets

    @staticmethod
    def _read_all(path: Any) -> bytes:
        if path.is_local():
            with open(path.local_path(), "rb") as f:
                return f.read()
        return path.fs.read(path._internal_str_path)

    def _read_range(self, shard: int, offset: int, size: int) -> bytes:
        """The bytes ``[offset, offset + size)`` of the shard; fewer of them (the shard was cut
        short): `CorruptShardError`."""
        data = self._read_range_unchecked(shard, offset, size)
        if len(data) != size:
            raise CorruptShardError.of(
                self,
                shard,
                f"short read at byte {offset} ({len(data)} of {size} bytes): "
                f"truncated after conversion",
            )
        return data

    def _read_range_unchecked(self, shard: int, offset: int, size: int) -> bytes:
        path = self.shards[shard].path
        if not path.is_local():
            return path.fs.read(path._internal_str_path, byte_range=Range(offset=offset, size=size))
        with self._lock:
            fd = self._fds.get(shard)
            if fd is None:
                fd = self._fds[shard] = os.open(path.local_path(), os.O_RDONLY)
                if len(self._fds) > FD_CACHE:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(shard)
            return os.pread(fd, size, offset)

    def locate(self, index: int) -> tuple[int, int, int]:
        """``(shard, byte offset, byte size)`` of dataset index ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample index {index} out of [0, {len(self)})")
        shard = bisect_right(self._starts, index) - 1
        offsets = self._offsets(shard)
        i = index - self._starts[shard]
        if i + 1 >= len(offsets):
            raise CorruptShardError.of(
                self,
                shard,
                f"its .tar.idx has {len(offsets)} entries, the dataset "
                f"index promises {self.shards[shard].count} samples",
            )
        return shard, int(offsets[i]), int(offsets[i + 1] - offsets[i])

    def __getitem__(self, index: int) -> Any:
        shard, offset, size = self.locate(index)
        return self._parse(shard, index, self._read_range(shard, offset, size))

    def fetch_many(self, indices) -> dict[int, Any]:
        """Raw samples of ``indices`` read concurrently (object storage: latency-bound requests
        overlap, `FETCH_THREADS` at a time); samples contiguous in one shard are one range.
        A failed read is returned as its exception under its index, raised when that sample is used."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="shard-read")
        pool = self._pool
        wanted = sorted(set(int(i) for i in indices))
        shards = sorted({bisect_right(self._starts, i) - 1 for i in wanted if 0 <= i < len(self)})
        out: dict[int, Any] = {}
        for shard, result in zip(shards, pool.map(self._try, [(self._offsets, s) for s in shards])):
            # the shard's index is unreadable: every sample of it fails
            if isinstance(result, Exception):
                out.update(
                    {i: result for i in wanted if bisect_right(self._starts, i) - 1 == shard}
                )
        runs = self._runs([i for i in wanted if i not in out])
        for run, data in zip(runs, pool.map(self._try, [(self._read_range, *r[:3]) for r in runs])):
            shard, offset, _, first, bounds = run
            for k, (start, end) in enumerate(bounds):
                index = first + k
                out[index] = (
                    data
                    if isinstance(data, Exception)
                    else self._try((self._parse, shard, index, data[start - offset : end - offset]))
                )
        return out

    def _runs(self, wanted: list[int]) -> list[tuple]:
        """Maximal runs of consecutive indices in one shard: ``(shard, offset, size, first index, bounds)``."""
        runs, cur = [], None
        for i in wanted:
            shard, offset, size = self.locate(i)
            if cur and cur[0] == shard and cur[3] + len(cur[4]) == i:
                cur[4].append((offset, offset + size))
                cur[2] = offset + size - cur[1]
            else:
                cur = [shard, offset, size, i, [(offset, offset + size)]]
                runs.append(cur)
        return [tuple(r) for r in runs]

    @staticmethod
    def _try(call: tuple) -> Any:
        fn, *args = call
        try:
            return fn(*args)
        except Exception as e:  # handed back to the caller, raised where the sample is used
            return e

    def _parse(self, shard: int, index: int, data: bytes) -> Any:

        name = self.shards[shard].name
        base, parts, files = None, {}, []
        for member, content in _members(data):
            if skip_meta_re.match(member):
                continue
            m = split_name_re.match(member)
            if not m:
                continue
            cur_base, ext = m.groups()
            if base is None:
                base = cur_base
                if self.sample_filter is not None and not self.sample_filter(f"{name}/{cur_base}"):
                    return None
            elif cur_base != base:
                raise ValueError(f"{name}: inconsistent sample base name: {base} vs {cur_base}")
            if self.part_filter is None or self.part_filter(ext):
                parts[ext] = content()
                files.append(member)
        if base is None:
            raise ValueError(f"{name}: no valid files in sample {index}")
        return FilteredSample(
            __key__=base,
            __shard__=name,
            __restore_key__=("Webdataset", index),
            __sources__=(
                SourceInfo(
                    dataset_path=self.base_path,
                    index=index,
                    shard_name=name,
                    file_names=tuple(files),
                ),
            ),
            **parts,
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._index.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
