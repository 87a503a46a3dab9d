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

An index is a cache: `index_damage` checks its ``meta.json`` and each file's size against what the
meta says (``4·N·K`` bytes of facts, ``8·(N+1)`` of offsets, the key bytes it records), so a
truncated or overwritten file is found when the index is opened, never read as if whole.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from energon_platform.loader.balance.ranged_copy import SOURCE_FILE, copies
from energon_platform.loader.node_cache import cache_root
from storage import DatasetError
from task_encoders.abilities import segment_multiple
from task_encoders.sequences import padded_length

if TYPE_CHECKING:
    from energon_platform.loader.schedule import Schedule
    from task_encoders.abilities import StatesLengths


FORMAT = "energon-platform-lengths-v2"


def default_cache_dir() -> Path:
    """``$ENERGON_PLATFORM_CACHE/lengths``, else ``~/.cache/energon-platform/lengths``."""
    return cache_root() / "lengths"


class LengthIndexDamaged(DatasetError):
    """An index whose ``meta.json`` cannot be read or whose files do not have the sizes it says:
    one line naming the file (`index_damage`)."""


def parse_meta(raw: bytes, where: str) -> dict:
    """The meta of an index, read from ``raw`` (the bytes of ``where``, its ``meta.json``), with its
    format and counts checked; `LengthIndexDamaged` naming ``where`` when it is not one."""
    try:
        meta = json.loads(raw)
    except ValueError as e:
        raise LengthIndexDamaged(f"{where}: not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise LengthIndexDamaged(f"{where}: not the meta of a {FORMAT} index")
    for name in ("samples", "width", "key_bytes"):
        if name in meta or name != "key_bytes":  # key_bytes: absent from earlier indexes
            if not isinstance(meta.get(name), int) or meta[name] < 0:
                raise LengthIndexDamaged(f"{where}: no count of {name}")
    return meta


def read_meta(folder: Path) -> dict:
    """`parse_meta` of ``folder/meta.json``; `LengthIndexDamaged` when it cannot be read."""
    path = Path(folder) / "meta.json"
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise LengthIndexDamaged(f"{path}: unreadable ({e.strerror or e})") from None
    return parse_meta(raw, str(path))


def meta_sizes(meta: dict) -> dict[str, int | None]:
    """The size in bytes of each index file that ``meta`` implies (the keys': None when the meta
    predates ``key_bytes``)."""
    samples, width = meta["samples"], meta["width"]
    return {
        "facts.i32": 4 * samples * width,
        "keys.off": 8 * (samples + 1),
        "keys.bin": meta.get("key_bytes"),
    }


def check_index(folder: Path) -> dict:
    """The meta of the complete index ``folder`` (its ``meta.json`` is there) once it reads and
    the files agree with it: ``4·N·K`` bytes of facts, ``8·(N+1)`` of offsets running from 0 to
    the key bytes (``meta["key_bytes"]``; an index written before that was recorded: its last
    offset), that many bytes of keys. A ranged copy (`ranged_copy`) is checked by the sizes it
    records (its files are made of those sizes when opened; its offsets are not fetched to check
    them). Else `LengthIndexDamaged`, naming the file."""
    folder = Path(folder)
    meta = read_meta(folder)
    samples, key_bytes = meta["samples"], meta.get("key_bytes")
    sizes = meta_sizes(meta)
    ranged = recorded_sizes(folder)
    for name, size in sizes.items():
        path = folder / name
        try:
            actual = ranged[name] if ranged is not None else path.stat().st_size
        except (OSError, KeyError):
            raise LengthIndexDamaged(f"{path}: missing") from None
        if name == "keys.off" and ranged is None and actual == size:
            with open(path, "rb") as f:
                first = int(np.frombuffer(f.read(8), np.int64)[0])
                f.seek(8 * samples)
                last = int(np.frombuffer(f.read(8), np.int64)[0])
            if first != 0 or last < 0 or (key_bytes is not None and last != key_bytes):
                said = "" if key_bytes is None else f", its meta.json says 0 to {key_bytes:,}"
                raise LengthIndexDamaged(f"{path}: offsets from {first:,} to {last:,}{said}")
            sizes["keys.bin"] = last
        elif size is not None and actual != size:
            raise LengthIndexDamaged(f"{path}: {actual:,} bytes, its meta.json says {size:,}")
    return meta


def recorded_sizes(folder: Path) -> dict[str, int] | None:
    """The file sizes a ranged copy in ``folder`` records (`ranged_copy.write_source`), None for a
    folder of whole local files; an unreadable record is ``{}`` (every file then missing)."""
    try:
        sizes = json.loads((Path(folder) / SOURCE_FILE).read_bytes())["sizes"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return sizes if isinstance(sizes, dict) else {}


def index_damage(folder: Path) -> str | None:
    """`check_index`'s line for ``folder``, or None when it is whole."""
    try:
        check_index(folder)
    except LengthIndexDamaged as e:
        return str(e)
    return None


class LengthIndex:
    """Read side: ``facts(i)`` (a tuple of ``width`` ints) and ``key(i)`` of sample ``i``.

    The files are memory-mapped and read through plain read-only array views of the maps (a
    ``np.memmap`` wraps every row it hands out in another memmap, which cost a lookup more than the
    read itself). An index whose files do not match its meta is `LengthIndexDamaged`, on open."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        meta = check_index(self.folder)
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
        encoder: StatesLengths,
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
        self.multiple = segment_multiple(encoder)
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
