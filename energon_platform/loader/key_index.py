"""Sample keys ↔ dataset indices of one split, from Energon's ``index.sqlite`` (no shard is read).

Energon's index (``.nv-meta/index.sqlite``, table ``samples``) holds every sample's key with its
tar file (numbered in the order of ``.nv-meta/.info.json``'s ``shard_counts``) and its number in
that tar file; a split's dataset index is its shard's start in the split's shard list plus that
number (`ShardReader`'s order). Both directions are
one indexed query. On object storage the index file is copied once per node (`node_copy`).
"""

from __future__ import annotations

import json
import sqlite3
from bisect import bisect_right
from fnmatch import fnmatchcase
from itertools import accumulate
from typing import Any

from energon_platform.loader.node_cache import node_copy
from storage import DatasetError, dataset_root, storage_errors


class KeyIndex:
    """``keys(indices)`` and ``index(key)`` for one `SampleSource`."""

    def __init__(self, source: Any):
        meta = dataset_root(source.path) / ".nv-meta"
        self.shard_names = list(source.shard_names)  # in dataset-index order
        self._starts = [0, *accumulate(source.shard_counts)]
        with storage_errors(source.path, "the dataset's index"):
            order = list(json.loads((meta / ".info.json").read_text())["shard_counts"])
            db = meta / "index.sqlite"
            # sqlite needs a file: on object storage, one copy per node (not per process)
            path = str(db.local_path() if db.is_local() else node_copy(db, "key-index"))
        tar_ids = {name: i for i, name in enumerate(order)}
        missing = [n for n in self.shard_names if n not in tar_ids]
        if missing:
            raise DatasetError(
                f"{source.path}: shard {missing[0]} is not in .nv-meta/.info.json; the index is stale"
            )
        self._tar_ids = [tar_ids[n] for n in self.shard_names]
        self._split_shard = {t: k for k, t in enumerate(self._tar_ids)}
        self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        self._db.create_function("fnmatchcase", 2, fnmatchcase, deterministic=True)

    def shard_start(self, k: int) -> int:
        """The dataset index of shard ``k``'s first sample (``k`` = shard count: the dataset's length)."""
        return self._starts[k]

    def shard(self, index: int) -> tuple[int, int]:
        """``(shard number in the split, sample number in that shard)`` of dataset index ``index``."""
        k = bisect_right(self._starts, index) - 1
        return k, index - self._starts[k]

    def keys(self, indices) -> list[str]:
        """The sample keys (as stored, without a dataset prefix) of dataset ``indices``."""
        out = []
        for i in indices:
            k, j = self.shard(int(i))
            row = self._db.execute(
                "SELECT sample_key FROM samples WHERE tar_file_id = ? AND sample_index = ?",
                (self._tar_ids[k], j),
            ).fetchone()
            out.append(row[0] if row else f"#{int(i)}")
        return out

    def index(self, key: str) -> int | None:
        """The dataset index of ``key`` in this split, or None when the split has no such sample."""
        row = self._db.execute(
            "SELECT tar_file_id, sample_index FROM samples WHERE sample_key = ?", (key,)
        ).fetchone()
        if row is None or row[0] not in self._split_shard:
            return None
        return self._starts[self._split_shard[row[0]]] + row[1]

    def matching(self, pattern: str, prefix: str = "", limit: int | None = None) -> list[int]:
        """The dataset indices (sorted) of this split's samples whose ``prefix + key`` matches
        ``pattern`` (``fnmatchcase``); at most ``limit`` of them when given. Only the keys that
        start with the pattern's literal head (before its first ``*``, ``?`` or ``[``) are read: a
        range of the index's sorted keys, so a pattern that matches nothing costs a lookup, not a
        scan. A pattern that starts with a wildcard scans the keys (stopped at ``limit``)."""
        cut = min([pattern.find(c) for c in "*?[" if c in pattern] or [len(pattern)])
        head = pattern[:cut]
        if not (head.startswith(prefix) or prefix.startswith(head)):
            return []  # the pattern's literal part names another dataset
        key_head = head[len(prefix) :] if head.startswith(prefix) else ""
        query = (
            "SELECT tar_file_id, sample_index FROM samples WHERE fnmatchcase(? || sample_key, ?)"
        )
        args: tuple = (prefix, pattern)
        if key_head and ord(key_head[-1]) < 0x10FFFF:
            after = key_head[:-1] + chr(ord(key_head[-1]) + 1)  # the first key past the range
            query += " AND sample_key >= ? AND sample_key < ?"
            args += (key_head, after)
        out = []
        for tar, j in self._db.execute(query, args):
            if tar in self._split_shard:
                out.append(self._starts[self._split_shard[tar]] + j)
                if limit is not None and len(out) >= limit:
                    break
        return sorted(out)
