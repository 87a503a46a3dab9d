"""The global sample schedule: which samples make up global batch ``b``, as a pure function.

Why not Energon's savable loader state? Energon saves each worker's pipeline state and, on
restore, replays up to ``checkpoint_every_sec`` of work (restore time grows with the position),
requires the same ``num_workers``, and its ``restore_seeds`` augmentation depends on the worker
layout. energon_platform keeps Energon's dataset layer (index, random-access tar reader, decoders,
sample types, task encoders) and replaces the *ordering* layer with this schedule:

* The training stream is the concatenation of epochs; epoch ``e`` visits every sample once, in an
  order that is a function of ``(seed, e)`` only: a full permutation, or, with ``shuffle_buffer=K``,
  a shuffled shard order whose consecutive windows of ``K`` samples are each shuffled (locality of
  reads, like a shuffle buffer of size ``K``, but computable at any position).
* The stream is cut into *items* of ``group_size`` consecutive samples (1 without packing; a pack
  group with packing), and items into global batches of ``items_per_batch``.
* Data-parallel rank ``r`` of ``R`` takes the ``r``-th contiguous slice of each global batch.

So the state of a run is one integer, the next global batch; restoring anywhere costs the same as
starting; and the global batches do not depend on the number of ranks or workers. Worker ``w`` of
``W`` on a rank produces that rank's batches ``b`` with ``b ≡ w (mod W)`` relative to the start
batch, which is the order PyTorch's DataLoader reads its workers in.

Memory: one int32/int64 array of ``num_samples`` per cached epoch (two epochs are kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class LayoutError(ValueError):
    """The requested ranks × workers layout cannot reproduce the schedule's global batches."""


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed & 0xFFFFFFFF, seed >> 32, *stream]))


@dataclass(frozen=True)
class Schedule:
    """Global order of a training stream. All fields are part of the loader's fingerprint."""

    shard_counts: tuple[int, ...]  #: samples per shard, in the dataset's shard order
    seed: int
    items_per_batch: int  #: global batch size in items
    group_size: int = 1  #: samples per item (pack group); 1 without packing
    shuffle_buffer: int | None = None  #: None: full permutation per epoch; K: windowed shuffle
    _cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self):
        if self.num_samples < 1:
            raise ValueError("the dataset split has no samples")
        if self.items_per_batch < 1 or self.group_size < 1:
            raise ValueError("items_per_batch and group_size must be >= 1")

    @property
    def num_samples(self) -> int:
        return int(sum(self.shard_counts))

    @property
    def samples_per_batch(self) -> int:
        return self.items_per_batch * self.group_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Dataset-global sample indices in the order epoch ``epoch`` visits them."""
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = self._make_order(epoch)
        return self._cache[epoch]

    def _make_order(self, epoch: int) -> np.ndarray:
        n = self.num_samples
        dtype = np.int32 if n < 2**31 else np.int64
        rng = _rng(self.seed, epoch)
        if not self.shuffle_buffer:
            return rng.permutation(n).astype(dtype)
        starts = np.concatenate([[0], np.cumsum(self.shard_counts)[:-1]])
        order = np.concatenate([np.arange(starts[s], starts[s] + self.shard_counts[s], dtype=dtype)
                                for s in rng.permutation(len(self.shard_counts))])
        k = self.shuffle_buffer
        for w in range(0, n, k):
            order[w:w + k] = order[w:w + k][_rng(self.seed, epoch, 1 + w // k).permutation(min(k, n - w))]
        return order

    def sample_at(self, position: int) -> tuple[int, int]:
        """``(epoch, dataset index)`` of stream position ``position``."""
        epoch, i = divmod(position, self.num_samples)
        return epoch, int(self.epoch_order(epoch)[i])

    def item_samples(self, batch: int, item: int) -> list[tuple[int, int]]:
        """The ``(epoch, index)`` samples of item ``item`` (0-based, global) of batch ``batch``."""
        start = (batch * self.items_per_batch + item) * self.group_size
        return [self.sample_at(p) for p in range(start, start + self.group_size)]

    def rank_items(self, rank: int, world_size: int) -> range:
        """Items of every global batch that data-parallel rank ``rank`` of ``world_size`` takes."""
        per_rank = self.check_world_size(world_size)
        return range(rank * per_rank, (rank + 1) * per_rank)

    def check_world_size(self, world_size: int, micro_items: int | None = None) -> int:
        """Items per rank; :class:`LayoutError` naming the world sizes that work otherwise.
        ``micro_items``: the micro-batch size, which must divide each rank's share."""
        g = self.items_per_batch

        def fits(d: int) -> bool:
            return d >= 1 and g % d == 0 and (micro_items is None or (g // d) % micro_items == 0)

        if not fits(world_size):
            ok = [d for d in range(1, g + 1) if fits(d)]
            unit = "pack groups" if self.group_size > 1 else "samples"
            micro = f" in micro-batches of {micro_items}" if micro_items else ""
            raise LayoutError(
                f"a global batch of {g} {unit} cannot be split over {world_size} data-parallel ranks{micro}; "
                f"world sizes that keep the same global batches: {ok} (any number of workers per rank works)"
            )
        return g // world_size

    def epoch_of_batch(self, batch: int) -> float:
        """Fractional epoch at the start of ``batch`` (for logs)."""
        return batch * self.samples_per_batch / self.num_samples
