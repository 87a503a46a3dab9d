"""Random access to an Energon dataset split: index → decoded Energon sample.

Uses Energon's own pieces: ``get_dataset_from_config`` (reads ``.nv-meta``, ``dataset.yaml``,
split), its ``.tar.idx`` tar index and the factory's ``load_sample`` (decoder and field map / sample
loader), the path Energon's ``restore_sample`` takes. Two things are ours: the order in which
indices are asked for (`energon_platform.loader.schedule`) and the byte reads
(`energon_platform.loader.shard_reader`: one ranged read per sample, the index read once per
shard), which give Energon's raw samples without its re-reads and whole-object fetches.

The path is a local folder or ``msc://PROFILE/prefix`` (object storage through multi-storage-client,
profile from ``MSC_CONFIG``): every read goes through Energon's ``EPath``. Failures of the storage
itself (credentials refused, connection lost after the client's retries, an object gone) raise
`StorageError`, at open or mid-run, and are never skipped as bad samples: a skip caused by
the store would change the global batches on one run and not another. A shard whose bytes disagree
with its index (truncated after conversion) is bad data instead: its samples fail and are replaced
like undecodable ones, and when a micro-batch cannot be filled the error names that shard and
``energon-platform verify`` (`SampleSource.samples_failed`), never memory or the loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import yaml
from megatron.energon import WorkerConfig
from megatron.energon.dataset_config import get_dataset_from_config
from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory
from megatron.energon.flavors.webdataset.default_generic_webdataset import (
    DefaultGenericWebdatasetFactory,
)

from energon_platform.loader.shard_reader import CorruptShardError, ShardReader
from storage import (
    DatasetError,
    StorageError,
    caused_by,
    check_there,
    dataset_root,
    is_remote,
    storage_errors,
)

#: ``DatasetError`` and ``StorageError`` are the storage room's (`storage`), re-exported: the
#: loader raises them, so a caller may name them from here.
__all__ = ["DatasetError", "SampleSource", "SamplesFailedError", "StorageError", "split_parts"]


class SamplesFailedError(DatasetError):
    """A sample and all its stand-ins failed (`SampleSource.samples_failed`): bad data, one
    line; when a shard was found corrupt it names the shard and ``energon-platform verify``."""


def _factory(path: str, split: str, subflavors: dict | None = None):
    with storage_errors(path, "the dataset's metadata"):
        return _factory_unchecked(path, split, subflavors)


def _factory_unchecked(path: str, split: str, subflavors: dict | None):

    if not (dataset_root(path) / ".nv-meta" / "dataset.yaml").is_file():
        check_there(path)
        raise DatasetError(
            f"{path}: not an Energon dataset (no .nv-meta/dataset.yaml); "
            f"convert it with `energon-platform convert ...` first"
        )
    splits = split_parts(path)
    if split not in splits:
        raise DatasetError(
            f"{path}: no split {split!r} (the dataset has: {', '.join(splits) or 'none'}); "
            f"set data.train_split / data.val_split to one of them"
        )
    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    factory = get_dataset_from_config(
        dataset_root(path),
        split_part=split,
        training=False,
        worker_config=wc,
        subflavors=subflavors,
    )
    if not isinstance(factory, BaseWebdatasetFactory):
        raise DatasetError(
            f"{path}: a metadataset or non-webdataset source is not supported here yet"
        )
    if not factory.shards:
        raise DatasetError(f"{path}: split {split!r} has no shards")
    if not sum(s.count for s in factory.shards):
        raise DatasetError(f"{path}: split {split!r} has no samples")
    return factory


def split_parts(path: str) -> list[str]:
    """Names of the split parts in ``.nv-meta/split.yaml`` that list at least one shard.

    `DatasetError` when the file is missing or not a split file; `StorageError` when object storage
    fails the read of a file that is there (the server gone between the client's HEAD and its GET
    reads as MSC's ``OSError("Failed to download file ...")``): the store, not the dataset.
    """
    try:
        with storage_errors(path, ".nv-meta/split.yaml"):
            try:
                text = (dataset_root(path) / ".nv-meta" / "split.yaml").read_text()
            except OSError as e:
                if not is_remote(path) or caused_by(e, FileNotFoundError):
                    raise _no_split_file(path, e) from None
                raise
        parts = yaml.safe_load(text)["split_parts"]
        return [name for name, shards in parts.items() if shards]
    except (yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise _no_split_file(path, e) from None


def _listed(shards: Sequence[Any]) -> list[Any]:
    """The file metadata of each of ``shards`` (Energon ``ShardInfo``s, their ``path`` an ``EPath``)
    from one listing of each folder that holds some of them; None for a shard not listed as a file."""
    folders: dict[tuple[str, str], Any] = {}
    for shard in shards:
        folder = shard.path.parent
        folders.setdefault((folder.profile, folder._internal_str_path.strip("/")), folder)
    found = {}
    for (profile, prefix), folder in folders.items():
        for meta in folder.fs.list(f"/{prefix}/" if prefix else "/"):
            found[profile, meta.key.lstrip("/")] = meta
    return [found.get((s.path.profile, s.path._internal_str_path.lstrip("/"))) for s in shards]


def _no_split_file(path: str, error: Exception) -> DatasetError:
    return DatasetError(
        f"{path}: .nv-meta/split.yaml is missing or unreadable ({type(error).__name__}: {error})"
    )


def tag_sample_key(error: BaseException, key: str | None) -> None:
    """Name the sample ``error`` was raised for (its ``__key__``): whoever skips it reads
    ``getattr(error, "sample_key", None)``. Any exception type, so an attribute set on it."""
    setattr(error, "sample_key", key)  # noqa: B010 - the attribute is not the exception type's


class SampleSource:
    """``source[i]`` is the decoded Energon sample with dataset index ``i`` of one split.

    Cheap to construct on the main process (reads metadata only); the tar reader opens lazily, so
    a pickled copy sent to a DataLoader worker opens its own file handles.
    """

    def __init__(self, path: str, split: str = "train", subflavors: dict | None = None):
        self._open(str(path), split, subflavors)
        self.check_shards()

    def _open(self, path: str, split: str, subflavors: dict | None = None) -> None:
        self.path, self.split, self.subflavors = path, split, subflavors
        self._factory = _factory(self.path, split, subflavors)
        self.shard_counts = tuple(s.count for s in self._factory.shards)
        self._reader = None
        self._prefetched: dict = {}  #: index → the future of its background read (`prefetch`)
        self._lookahead = None
        self._shard_files: list[Any] | None = None  #: `shard_files`, once read
        self._pid = os.getpid()
        #: shard name → what is wrong, found by reads of this process
        self._corrupt: dict[str, str] = {}

    def check_shards(self) -> None:
        """`DatasetError` naming the first shard of the split that is not a file
        (deleted, moved, replaced by a folder): caught when the dataset is opened, not mid-run as a
        flood of bad samples. Read from `shard_files` (a listing, not a request per shard); a store
        that refuses or fails: `StorageError`."""
        files = self.shard_files()
        if None in files:
            shard = self._factory.shards[files.index(None)]
            raise DatasetError(
                f"{self.path}: shard {shard.name} of split {self.split!r} is missing "
                f"({files.count(None)} of {len(files)} shards missing); the dataset is "
                f"incomplete: restore the shard or convert the dataset again"
            )

    def shard_files(self) -> list[Any]:
        """Each shard's file metadata (``content_length``, ``last_modified``, ``etag``: an
        ``ObjectMetadata`` of multi-storage-client), in dataset-index order; None for a shard that
        is not a file. One listing per folder that holds shards (on object storage one LIST request
        per 1,000 objects, not a HEAD request per shard), read once per process."""
        if self._shard_files is None:
            with storage_errors(self.path, "the shard list"):
                self._shard_files = _listed(self._factory.shards)
        return self._shard_files

    def __getstate__(self):
        return {"path": self.path, "split": self.split, "subflavors": self.subflavors}

    def __setstate__(self, state):
        # the shards were checked where it was built
        self._open(state["path"], state["split"], state.get("subflavors"))

    def __len__(self) -> int:
        return sum(self.shard_counts)

    @property
    def shard_names(self) -> tuple[str, ...]:
        """The split's shard names (``train/shard-000003.tar``) in dataset-index order: shard ``k``
        holds ``shard_counts[k]`` samples, from index ``sum(shard_counts[:k])`` on."""
        return tuple(s.name for s in self._factory.shards)

    @property
    def remote(self) -> bool:
        return is_remote(self.path)

    def _ensure_reader(self) -> ShardReader:
        """This process's shard reader (opened on first use; a forked process opens its own)."""
        if self._pid != os.getpid() and self.remote:  # a forked DataLoader worker must not share
            # the parent's S3 client and its connections
            self._open(self.path, self.split, self.subflavors)
        if self._reader is None:
            f = self._factory
            self._reader = ShardReader(
                f.path, f.shards, part_filter=f.part_filter, sample_filter=f.sample_filter
            )
        return self._reader

    def prefetch(self, indices) -> None:
        """Start reading the raw bytes of ``indices`` in the background (object storage only; a
        local read is a ``pread`` and gains nothing); ``source[i]`` waits for its read. Reading
        ahead of the micro-batch being encoded hides the store's latency behind the decoding. A
        store that fails here (a forked worker reopening the dataset) raises `StorageError`, as a
        read does; a failed background read is raised by the ``source[i]`` that waits for it."""
        if not self.remote:
            return
        with storage_errors(self.path, "a read ahead"):
            reader = self._ensure_reader()
        todo = sorted({int(i) for i in indices} - set(self._prefetched))
        if todo:
            if self._lookahead is None:
                self._lookahead = ThreadPoolExecutor(2, thread_name_prefix="prefetch")
            future = self._lookahead.submit(reader.fetch_many, todo)
            self._prefetched.update({i: future for i in todo})

    def __getitem__(self, index: int) -> Any:
        return self.load(index)

    def load(self, index: int, decoder: Any = None) -> Any:
        """The sample with dataset index ``index``, its parts decoded by ``decoder`` (an Energon
        ``SampleDecoder``: the encoder's own, as Energon's loader does; None: the dataset's
        default, which decodes images to float). Errors as `__getitem__`."""
        reader = self._ensure_reader()
        try:
            with storage_errors(self.path, f"sample {index}"):
                future = self._prefetched.pop(index, None)
                raw = future.result()[index] if future is not None else reader[index]
                if isinstance(raw, Exception):
                    raise raw
        # bad data, skipped by the caller; remembered for samples_failed
        except CorruptShardError as e:
            if e.shard is not None:
                self._corrupt.setdefault(e.shard, e.detail)
            raise
        if raw is None:
            raise KeyError(f"sample {index} is excluded from the dataset")
        try:
            if decoder is None or not isinstance(self._factory, DefaultGenericWebdatasetFactory):
                return self._factory.load_sample(raw)
            return DefaultGenericWebdatasetFactory.load_sample(self._factory, decoder(raw))
        # a bad sample (undecodable media): the caller skips it, logged by its key
        except Exception as e:
            tag_sample_key(e, raw.get("__key__"))
            raise

    def samples_failed(self, what: str) -> SamplesFailedError:
        """The error for ``what`` (samples that failed to load; the caller raises it): names the
        first corrupt shard this process read, if any, and how to check the dataset, else points
        to the log of skipped samples. Never blames memory or the loader: the data is bad."""
        if not self._corrupt:
            return SamplesFailedError(f"{what}; see the skipped samples in the log")
        (shard, detail), others = next(iter(self._corrupt.items())), len(self._corrupt) - 1
        more = f" (and {others} other shard{'s' * (others > 1)})" if others else ""
        return SamplesFailedError(
            f"{what}: shard {shard} of {self.path} is corrupt{more} ({detail}); check the "
            f"dataset with `energon-platform verify {shlex.quote(self.path)}`, then restore the shard or "
            f"convert the dataset again"
        )

    def identity(self) -> dict:
        """What makes this data *this* data: Energon's index uuid, the split and its shard list."""
        meta = dataset_root(self.path) / ".nv-meta"
        shards = [[s.name, s.count] for s in self._factory.shards]
        return {
            "index_uuid": (meta / "index.uuid").read_text().strip()
            if (meta / "index.uuid").is_file()
            else None,
            "split": self.split,
            "num_shards": len(shards),
            "num_samples": len(self),
            "shards_sha256": hashlib.sha256(json.dumps(shards).encode()).hexdigest(),
        }
