"""One dataset's epochs: which sample index stands at position ``i`` of epoch ``e``.

Two shuffle modes, both computed per position in O(1) time and memory (no epoch array):

``permutation`` (default for corpora that fit a random-access reader well, i.e. local disk)
    epoch ``e`` is the keyed bijection ``KeyedPermutation(N, key(e))``: every sample once, any
    sample next to any other.

``locality`` (``shuffle_buffer: K``; for object storage and very large corpora)
    The dataset's index space ``[0, N)`` (shards concatenated in order) is cut into *blocks* of
    ``block`` consecutive samples (each block lies in one shard or straddles two). Each epoch
    shuffles the order of the full blocks with a keyed bijection, groups consecutive blocks into
    *windows* of ``window = ceil(K / block)`` blocks and shuffles the samples inside each window
    with another keyed bijection; the partial tail block (``N mod block`` samples) closes the epoch,
    shuffled within itself. So a window of ``window × block ≈ K`` consecutive positions reads from
    at most ``window`` blocks (``2 × window`` shards), like Energon's slices plus a shuffle
    buffer of ``K``, but computable at any position. With ``shuffle_run: R`` the window shuffles
    runs of ``R`` consecutive samples instead of single samples: ``R`` neighbouring positions are
    then one contiguous byte range of one shard, read with one request (object storage).

**Epoch boundaries** (``guard: G``): two epochs are independent shuffles, so the last samples of
one and the first of the next may share a sample, and a global batch that straddles the boundary
would hold it twice. With a guard, every epoch after the first swaps each of its first ``g =
min(G, N // 4)`` positions that holds one of the previous epoch's last ``g`` samples with the
nearest later position in ``[g, N - g)`` that does not (there always is one, and the epoch's tail
is never moved, so no epoch depends on another's swaps): still a bijection, computed once per
epoch from ``O(g)`` positions. Any ``g`` last positions of an epoch and ``g`` first of the next then
hold each sample at most once; the loader sets ``G`` to the samples of a global batch.

The trade-off, measured by ``scripts/bench/scale.py``: ``locality`` touches few shards per window
(good for sequential reads and caches) at the price of correlation between neighbouring positions
(samples of a window come from the same few blocks); ``permutation`` has no such correlation and
touches ``min(window, shards)`` shards per window. A state saved with one mode never restores into
the other: the mode and its parameters are part of the loader fingerprint.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from energon_platform.loader.permutation import KeyedPermutation, derive_key

SHUFFLE_MODES = ("permutation", "locality")
#: Default blocks per window in ``locality`` mode: a window of ``K`` samples reads 16 blocks of
#: ``ceil(K / 16)`` consecutive samples (at most 32 shards).
DEFAULT_WINDOW_BLOCKS = 16


@dataclass(frozen=True)
class DatasetOrder:
    """The epochs of one dataset of ``num_samples`` samples, keyed by ``key`` (64 bit).

    ``shuffle_buffer``: None for ``permutation``; ``K`` for ``locality`` with windows of about
    ``K`` samples. ``block``: samples per block in ``locality`` mode (default ``ceil(K / 16)``).
    """

    num_samples: int
    key: int
    shuffle_buffer: int | None = None
    block: int | None = None
    run: int = 1  #: ``locality``: consecutive samples kept together inside a window
    guard: int = 0  #: epoch boundary guard (module doc); 0: none

    def __post_init__(self):
        if self.num_samples < 1:
            raise ValueError("a dataset split with no samples has no order")
        if self.shuffle_buffer is not None and self.shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1, got {self.shuffle_buffer}")
        if self.run < 1 or (self.run > 1 and self.shuffle_buffer is None):
            raise ValueError("shuffle_run > 1 needs the locality mode (shuffle_buffer)")
        if self.guard < 0:
            raise ValueError(f"guard must be >= 0, got {self.guard}")

    @property
    def boundary(self) -> int:
        """Positions at the head of an epoch kept free of the previous epoch's tail (module doc)."""
        return min(self.guard, self.num_samples // 4)

    @property
    def mode(self) -> str:
        return "permutation" if self.shuffle_buffer is None else "locality"

    @property
    def block_size(self) -> int:
        block = self.block or max(1, -(-(self.shuffle_buffer or 1) // DEFAULT_WINDOW_BLOCKS))
        return -(-block // self.run) * self.run  # whole runs per block

    @property
    def window_blocks(self) -> int:
        return max(1, -(-(self.shuffle_buffer or 1) // self.block_size))

    def describe(self) -> dict:
        """The parameters that decide the order (part of the loader fingerprint)."""
        guard = {"guard": self.guard} if self.guard else {}
        if self.mode == "permutation":
            return {"mode": "permutation", **guard}
        return {
            "mode": "locality",
            "shuffle_buffer": self.shuffle_buffer,
            "block": self.block_size,
            "run": self.run,
            **guard,
        }

    def indices(self, epoch: int, positions) -> np.ndarray:
        """Sample indices (``int64``) at ``positions`` (array of ints in ``[0, num_samples)``) of ``epoch``."""
        pos = np.asarray(positions, dtype=np.int64)
        if epoch > 0 and self.boundary:
            pos = _boundary_swaps(self, epoch).apply(pos)
        return self._shuffled(epoch, pos)

    def _shuffled(self, epoch: int, pos: np.ndarray) -> np.ndarray:
        """`indices` without the boundary guard."""
        if self.mode == "permutation":
            if self.num_samples <= SMALL:
                return _epoch_table(self.num_samples, self.key, epoch)[pos]
            return _epoch_permutation(self.num_samples, self.key, epoch)(pos)
        return self._locality(epoch, pos)

    def _locality(self, epoch: int, pos: np.ndarray) -> np.ndarray:
        s, w = self.block_size, self.window_blocks
        n_full = self.num_samples // s
        span = w * s
        out = np.empty_like(pos)
        tail = pos >= n_full * s
        if tail.any():  # the partial last block closes the epoch, shuffled within itself
            n_tail = self.num_samples - n_full * s
            perm = KeyedPermutation(n_tail, derive_key(self.key, epoch, 1))
            out[tail] = n_full * s + perm(pos[tail] - n_full * s)
        body = ~tail
        if body.any():
            blocks = KeyedPermutation(n_full, derive_key(self.key, epoch, 2))
            p = pos[body]
            win = p // span
            slot = np.empty_like(p)
            for wi in np.unique(win):  # a micro-batch spans one or two windows
                sel = win == wi
                size = min(w, n_full - int(wi) * w) * s
                inner = KeyedPermutation(size // self.run, derive_key(self.key, epoch, 3, int(wi)))
                r = p[sel] - int(wi) * span
                slot[sel] = int(wi) * span + inner(r // self.run) * self.run + r % self.run
            out[body] = blocks(slot // s) * s + slot % s
        return out

    def positions(self, epoch: int, indices) -> np.ndarray:
        """The inverse of `indices`: the positions (``int64``) of sample ``indices`` in ``epoch``,
        in O(1) per index (the keyed bijections run backwards)."""
        idx = np.asarray(indices, dtype=np.int64)
        pos = self._unshuffled(epoch, idx)
        return _boundary_swaps(self, epoch).apply(pos) if epoch > 0 and self.boundary else pos

    def _unshuffled(self, epoch: int, idx: np.ndarray) -> np.ndarray:
        """`positions` without the boundary guard."""
        if self.mode == "permutation":
            return _epoch_permutation(self.num_samples, self.key, epoch).inverse(idx)
        s, w = self.block_size, self.window_blocks
        n_full = self.num_samples // s
        span = w * s
        out = np.empty_like(idx)
        tail = idx >= n_full * s
        if tail.any():
            perm = KeyedPermutation(self.num_samples - n_full * s, derive_key(self.key, epoch, 1))
            out[tail] = n_full * s + perm.inverse(idx[tail] - n_full * s)
        body = ~tail
        if body.any():
            blocks = KeyedPermutation(n_full, derive_key(self.key, epoch, 2))
            slot = blocks.inverse(idx[body] // s) * s + idx[body] % s
            win = slot // span
            pos = np.empty_like(slot)
            for wi in np.unique(win):
                sel = win == wi
                size = min(w, n_full - int(wi) * w) * s
                inner = KeyedPermutation(size // self.run, derive_key(self.key, epoch, 3, int(wi)))
                r = slot[sel] - int(wi) * span
                pos[sel] = int(wi) * span + inner.inverse(r // self.run) * self.run + r % self.run
            out[body] = pos
        return out

    def replacement(self, epoch: int, index: int, attempt: int) -> int:
        """The ``attempt``-th (1, 2, ...) stand-in for sample ``index`` of ``epoch`` when it fails to
        load or encode: a keyed draw of the same dataset, a pure function of its arguments (so the
        same on every layout and every resume). Never ``index`` itself unless the dataset has one sample."""
        perm = KeyedPermutation(self.num_samples, derive_key(self.key, epoch, 4, index))
        candidate = perm((attempt - 1) % self.num_samples)
        return (
            candidate
            if candidate != index or self.num_samples == 1
            else perm(attempt % self.num_samples)
        )

    def shards_per_window(self, shard_counts) -> int:
        """The most shards one window of ``locality`` mode can touch (``permutation``: all)."""
        if self.mode == "permutation":
            return len(shard_counts)
        return min(len(shard_counts), 2 * self.window_blocks)


@functools.lru_cache(maxsize=8192)
def _epoch_permutation(num_samples: int, key: int, epoch: int) -> KeyedPermutation:
    """The ``permutation`` order of one epoch (kept: a small dataset's many epochs recur in every plan)."""
    return KeyedPermutation(num_samples, derive_key(key, epoch))


#: Datasets of at most this many samples keep whole epochs of their order as arrays (a small
#: dataset wraps through many epochs within one plan's pool).
SMALL = 4096


@functools.lru_cache(maxsize=1024)
def _epoch_table(num_samples: int, key: int, epoch: int) -> np.ndarray:
    """The whole ``permutation`` order of one epoch of a small dataset (read-only)."""
    table = _epoch_permutation(num_samples, key, epoch)(np.arange(num_samples, dtype=np.int64))
    table.flags.writeable = False
    return table


class _Swaps:
    """An involution of positions: ``src[k] <-> dst[k]`` (both sorted views kept for lookup)."""

    def __init__(self, pairs: list[tuple[int, int]]):
        both = pairs + [(b, a) for a, b in pairs]
        both.sort()
        self.src = np.array([a for a, _ in both], dtype=np.int64)
        self.dst = np.array([b for _, b in both], dtype=np.int64)

    def apply(self, pos: np.ndarray) -> np.ndarray:
        if not self.src.size:
            return pos
        at = np.clip(np.searchsorted(self.src, pos), 0, self.src.size - 1)
        hit = self.src[at] == pos
        return np.where(hit, self.dst[at], pos)


@functools.lru_cache(maxsize=1024)
def _boundary_swaps(order: DatasetOrder, epoch: int) -> _Swaps:
    """The guard's swaps in ``epoch`` (> 0): each of its first ``g`` positions holding one of the
    previous epoch's last ``g`` samples is paired with the next later position in ``[g, n - g)``
    (in order) holding none of them."""
    g, n = order.boundary, order.num_samples
    tail = set(order._shuffled(epoch - 1, np.arange(n - g, n)).tolist())  # tails are never swapped
    bad = [i for i, x in enumerate(order._shuffled(epoch, np.arange(g)).tolist()) if x in tail]
    pairs, j = [], g
    # [g, n - g) holds >= n - 3g >= g >= len(bad) samples outside the tail
    while len(pairs) < len(bad):
        chunk = np.arange(j, min(n - g, j + max(64, 2 * len(bad))))
        for p, x in zip(chunk.tolist(), order._shuffled(epoch, chunk).tolist()):
            if x not in tail and len(pairs) < len(bad):
                pairs.append((bad[len(pairs)], p))
        j = int(chunk[-1]) + 1
    return _Swaps(pairs)
