"""The length index: every sample's length facts, read without decoding its media.

The global packer and balancer (`planner`) need each sample's
length before its media are decoded. An encoder states which integers determine a sample's
lengths (``sample_facts``: caption tokens, image size → tiles, audio duration → frames, ...;
read from the index, ``text.json`` and media headers) and turns them into exact lengths at a
given epoch (``sample_length``). An index is one folder:

``{digest}/``: ``meta.json`` (samples, width, shards and their stamps), ``facts.i32``
(``(N, K)`` int32), ``keys.bin`` + ``keys.off`` (the sample keys, int64 offsets): ``4·K`` bytes
of facts plus the key and 8 bytes of offset per sample. `LengthIndex` memory-maps the files, so a
reader's memory is the pages it touches; a copy of an index on object storage is filled by ranged
reads where it is read (`ranged_copy`). Building them shard by shard is `length_parts`'s job, and
where they live and when they are built `length_store`'s.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from energon_platform.loader.balance.ranged_copy import copies
from energon_platform.loader.node_cache import cache_root
from task_encoders.sequences import padded_length

if TYPE_CHECKING:
    from energon_platform.loader.schedule import Schedule
    from task_encoders.base import SeededTaskEncoder


FORMAT = "energon-platform-lengths-v2"


def default_cache_dir() -> Path:
    """``$ENERGON_PLATFORM_CACHE/lengths``, else ``~/.cache/energon-platform/lengths``."""
    return cache_root() / "lengths"


class LengthIndex:
    """Read side: ``facts(i)`` (a tuple of ``width`` ints) and ``key(i)`` of sample ``i``.

    The files are memory-mapped and read through plain read-only array views of the maps (a
    ``np.memmap`` wraps every row it hands out in another memmap, which cost a lookup more than the
    read itself)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        meta = json.loads((self.folder / "meta.json").read_text())
        self.num_samples, self.width = int(meta["samples"]), int(meta["width"])
        #: the files' ranged copies (an index on object storage), else None (local files)
        self.ranged = copies(self.folder)
        self._row = 4 * self.width
        self._facts = (
            np.memmap(
                self.folder / "facts.i32",
                dtype=np.int32,
                mode="r",
                shape=(self.num_samples, self.width),
            )
            if self.num_samples * self.width
            else np.zeros((self.num_samples, self.width), np.int32)
        ).view(np.ndarray)
        self._offsets = np.memmap(
            self.folder / "keys.off", dtype=np.int64, mode="r", shape=(self.num_samples + 1,)
        ).view(np.ndarray)
        key_bytes = self.ranged["keys.bin"].size if self.ranged else self._offsets[-1]
        self._keys = (
            np.memmap(self.folder / "keys.bin", dtype=np.uint8, mode="r")
            if key_bytes
            else np.zeros(0, np.uint8)
        ).view(np.ndarray)

    def _ensure(self, name: str, lo: int, hi: int) -> None:
        if self.ranged is not None:
            self.ranged[name].ensure(lo, hi)

    def __len__(self) -> int:
        return self.num_samples

    def facts(self, index: int) -> tuple[int, ...]:
        self._ensure("facts.i32", index * self._row, (index + 1) * self._row)
        return tuple(self._facts[index].tolist())

    def key(self, index: int) -> str:
        self._ensure("keys.off", 8 * index, 8 * index + 16)
        a, b = int(self._offsets[index]), int(self._offsets[index + 1])
        self._ensure("keys.bin", a, b)
        return self._keys[a:b].tobytes().decode()

    @property
    def nbytes(self) -> int:
        """Bytes on disk (facts, keys, offsets)."""
        return sum((self.folder / n).stat().st_size for n in ("facts.i32", "keys.bin", "keys.off"))


#: The samples' lengths a `SampleLengths` remembers (about 200 bytes each).
LENGTHS_REMEMBERED = 1 << 16


class SampleLengths:
    """``(row_length, work)`` of stream positions: the schedule says which sample a position is,
    the length index gives its facts, the encoder turns them into lengths at that epoch.
    ``prefixes``: per dataset, what the loader puts before a key (``"name:"`` in a metadataset).
    ``work(facts, key, epoch, lengths)``: what a sample's cost is computed from, given its
    ``(row, work)`` lengths from the encoder's ``sample_length`` (None: its work length);
    ``no_work``: the work of a sample whose facts could not be read or that the encoder rejects.
    With the encoder's ``segment_multiple`` (``loader.context_parallel``) a row length is the
    padded segment the document takes, and a work length counts that padding too."""

    def __init__(
        self,
        schedule: Schedule,
        indexes: list[LengthIndex],
        encoder: SeededTaskEncoder,
        prefixes: list[str],
        work: Any = None,
        no_work: Any = 0,
    ):
        self.schedule, self.indexes, self.encoder, self.prefixes = (
            schedule,
            indexes,
            encoder,
            prefixes,
        )
        self.work, self.no_work = work, no_work
        #: the encoder's segment multiple: rows are planned as the padded segments they take
        self.multiple = getattr(encoder, "segment_multiple", 1)
        # the planner rebuilds its pool from its state for every global batch, so it asks again
        # for the samples still in its window: a sample's length at an epoch is a pure function of
        # its facts, key and epoch, so it is remembered (least recently used forgotten first)
        self.length_of = functools.lru_cache(maxsize=LENGTHS_REMEMBERED)(self.length_of)

    def length_of(self, dataset: int, epoch: int, index: int) -> tuple[int, Any]:
        """``(row_length, work)`` of one sample; ``(0, no_work)`` for a sample whose facts could
        not be read (it fails when loaded too, and its stand-in must fit in no room: it becomes
        padding)."""
        facts = self.indexes[dataset].facts(index)
        if any(f < 0 for f in facts):
            return 0, self.no_work
        key = self.prefixes[dataset] + self.indexes[dataset].key(index)
        try:
            row, work = (int(x) for x in self.encoder.sample_length(facts, key, epoch))
            padded = padded_length(row, self.multiple)
            if self.work is not None:
                return padded, self.work(facts, key, epoch, (row, work))
            return padded, work + padded - row
        # the encoder rejects this sample at this epoch: it fails when loaded too
        except ValueError:
            return 0, self.no_work

    def copies(self, positions: list[int]) -> list[tuple[int, int, int]]:
        """``(dataset, epoch, sample index)`` of each stream position."""
        return self.schedule.copies(positions)

    def of_copies(self, copies: list[tuple[int, int, int]]) -> list[tuple[int, Any]]:
        """``(row_length, work)`` of each ``(dataset, epoch, index)`` (`copies`)."""
        return [self.length_of(d, e, i) for d, e, i in copies]

    def __call__(self, positions: list[int]) -> list[tuple[int, Any]]:
        return self.of_copies(self.copies(positions))
