"""A node's copy of an index file on object storage, filled by ranged reads where it is read.

A length index published beside a dataset on object storage (`length_store`) is not downloaded
whole before the first step: opening it fetches its ``meta.json`` and each file's size, and creates
a sparse local file of that size in the node's cache. Reading bytes ``[lo, hi)`` first fetches the
blocks (`BLOCK` bytes) that hold them with one ranged GET each, writes them into the local file
and marks them filled in ``NAME.filled`` (one byte a block, memory-mapped shared: every process of
the node sees what any of them fetched, and a block is fetched once per node while the cache
lives). The local copy never holds more than the published file, and holds only what the node
touched; a block fetched by two processes at once is written twice with the same bytes.

The local file is what the reader memory-maps; `RangedCopy.ensure` must run before a read.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path

import multistorageclient as msc
from multistorageclient.types import Range

#: bytes fetched by one ranged read
BLOCK = 1 << 20
#: the file in a ranged copy's folder that names where its bytes come from
SOURCE_FILE = "remote.json"


class RangedCopy:
    """The local sparse copy ``path`` of the object storage file ``url`` (``size`` bytes)."""

    def __init__(self, url: str, path: Path, size: int, block: int = BLOCK):
        self.url, self.path, self.size, self.block = url, Path(path), int(size), int(block)
        blocks = -(-self.size // self.block)
        filled = self.path.with_name(self.path.name + ".filled")
        for file, length in ((self.path, self.size), (filled, blocks)):
            with open(file, "ab") as f:  # created at its size (sparse) by the first process
                if f.tell() < length:
                    f.truncate(length)
        with open(filled, "r+b") as f:  # the map keeps the file open
            self._filled = mmap.mmap(f.fileno(), blocks) if blocks else bytearray()
        self._client: msc.StorageClient | None = None
        self._pid: int | None = None
        #: bytes this process fetched
        self.fetched = 0

    def ensure(self, lo: int, hi: int) -> None:
        """Bytes ``[lo, hi)`` are in the local file (fetched now when their blocks were not)."""
        for b in range(lo // self.block, -(-hi // self.block)):
            if not self._filled[b]:
                self._fetch(b)

    def _fetch(self, b: int) -> None:

        offset = b * self.block
        data = self._storage().read(
            self._key, byte_range=Range(offset, min(self.block, self.size - offset))
        )
        with open(self.path, "r+b") as f:
            os.pwrite(f.fileno(), data, offset)
        self._filled[b] = 1  # after the bytes: a reader that sees the mark sees them
        self.fetched += len(data)

    def _storage(self) -> msc.StorageClient:
        """This process's client (a forked worker makes its own: connections are not shared)."""
        if self._client is None or self._pid != os.getpid():
            self._client, self._key = msc.resolve_storage_client(self.url)
            self._pid = os.getpid()
        return self._client

    def close(self) -> None:
        if isinstance(self._filled, mmap.mmap):
            self._filled.close()

    def __getstate__(self):
        return {"url": self.url, "path": self.path, "size": self.size, "block": self.block}

    def __setstate__(self, state):
        self.__init__(state["url"], state["path"], state["size"], state["block"])


def write_source(folder: Path, url: str, sizes: dict[str, int]) -> None:
    """Record in ``folder`` that its files are ranged copies of ``url/NAME`` of ``sizes[NAME]`` bytes."""
    (folder / SOURCE_FILE).write_text(json.dumps({"url": url, "sizes": sizes}))


def copies(folder: Path) -> dict[str, RangedCopy] | None:
    """The ranged copies of a folder made by `write_source`, by file name; None for a folder whose
    files are whole local files."""
    try:
        source = json.loads((Path(folder) / SOURCE_FILE).read_text())
    except FileNotFoundError:
        return None
    return {
        name: RangedCopy(f"{source['url']}/{name}", Path(folder) / name, size)
        for name, size in source["sizes"].items()
    }
