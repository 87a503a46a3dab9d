"""The global sample schedule: which samples make up global batch ``b``, as a pure function.

Why not Energon's savable loader state? Energon saves each worker's pipeline state and, on
restore, replays up to ``checkpoint_every_sec`` of work (restore time grows with the position),
requires the same ``num_workers``, and its ``restore_seeds`` augmentation depends on the worker
layout. energon_platform keeps Energon's dataset layer (index, random-access tar reader, decoders,
sample types, task encoders) and replaces the *ordering* layer with this schedule:

* **Blend** (`blend`): stream position ``p`` belongs to dataset
  ``d`` and is that dataset's ``j``-th sample, by an exact low-discrepancy interleave of the
  blend weights (segments of weights that may change at given steps). One dataset is a blend of one.
* **Epochs per dataset** (`orders`): dataset ``d``'s ``j``-th sample
  is position ``j mod N_d`` of its epoch ``j // N_d``, in an order keyed by ``(seed, d's stream
  id, epoch)``: a keyed bijection (``permutation``) or a block-and-window shuffle (``locality``).
  A small dataset wraps into its next epoch while a large one is still in its first; two entries
  of the same dataset have different stream ids and so independent orders.
* **Batches**: the stream is cut into *items* of ``group_size`` consecutive samples (1 without
  packing; a pack group with packing), and items into global batches of ``items_per_batch``.
  Data-parallel rank ``r`` of ``R`` takes the ``r``-th contiguous slice of each global batch.

Every step is computed per position in O(1) time and memory (no epoch array, nothing that grows
with the corpus), so the state of a run is one integer (the next global batch) plus the blend
history; restoring anywhere costs the same as starting; and the global batches do not depend on
the number of ranks or workers. Worker ``w`` of ``W`` on a rank produces that rank's micro-batches
``c`` with ``c ≡ w (mod W)`` relative to the start, the order PyTorch's DataLoader reads in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from energon_platform.loader.blend import Blend
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.permutation import derive_key

#: The schedule's version in the fingerprint (``schedule``): the blend interleave and the orders'
#: bijection that positions are a function of.
SCHEDULE_VERSION = "feistel-chairman-v1"


class LayoutError(ValueError):
    """The requested ranks × workers layout cannot reproduce the schedule's global batches."""


@dataclass(frozen=True)
class Schedule:
    """Global order of a training stream over one or more datasets.

    ``unit``: samples per blend unit: 1 (datasets interleave sample by sample) or the samples of
    one micro-batch (``blend_unit: batch``: every micro-batch comes from one dataset).
    """

    orders: tuple[DatasetOrder, ...]
    items_per_batch: int  #: global batch size in items
    group_size: int = 1  #: samples per item (pack group); 1 without packing
    blend: Blend = field(default_factory=Blend.single, compare=False)
    unit: int = 1

    def __post_init__(self):
        if self.items_per_batch < 1 or self.group_size < 1 or self.unit < 1:
            raise ValueError("items_per_batch, group_size and unit must be >= 1")
        if self.blend.num_datasets != len(self.orders):
            raise ValueError(
                f"the blend has {self.blend.num_datasets} datasets, the schedule {len(self.orders)}"
            )
        if self.samples_per_batch % self.unit:
            raise ValueError(
                f"a global batch of {self.samples_per_batch} samples is not a whole number of "
                f"blend units of {self.unit}"
            )

    @classmethod
    def for_dataset(
        cls,
        num_samples: int,
        seed: int,
        items_per_batch: int,
        group_size: int = 1,
        shuffle_buffer: int | None = None,
    ) -> Schedule:
        """The schedule of one dataset (stream id 0)."""
        return cls(
            (DatasetOrder(num_samples, derive_key(seed, 0), shuffle_buffer),),
            items_per_batch,
            group_size,
        )

    @property
    def samples_per_batch(self) -> int:
        return self.items_per_batch * self.group_size

    def samples(self, positions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(dataset, epoch of that dataset, sample index)`` of each stream position (``int64`` arrays)."""
        pos = np.asarray(positions, dtype=np.int64)
        d, ju = self.blend.locate(pos // self.unit)
        j = ju * self.unit + pos % self.unit
        sizes = np.array([o.num_samples for o in self.orders], dtype=np.int64)
        epoch, i = np.divmod(j, sizes[d])
        index = np.empty_like(i)
        # one group per (dataset, epoch): a tiny dataset spans many epochs
        order = np.lexsort((epoch, d))
        ds, es = d[order], epoch[order]
        cuts = np.flatnonzero((ds[1:] != ds[:-1]) | (es[1:] != es[:-1])) + 1
        for group in np.split(order, cuts) if order.size else ():
            index[group] = self.orders[int(d[group[0]])].indices(int(epoch[group[0]]), i[group])
        return d, epoch, index

    def copies(self, positions) -> list[tuple[int, int, int]]:
        """`samples` of ``positions`` as one ``(dataset, epoch, index)`` tuple per position."""
        if not len(positions):
            return []
        return list(zip(*(x.tolist() for x in self.samples(positions))))

    def sample_at(self, position: int) -> tuple[int, int, int]:
        """``(dataset, epoch, index)`` of one stream position."""
        d, e, i = self.samples([position])
        return int(d[0]), int(e[0]), int(i[0])

    def items(self, batch: int, item_ids) -> list[list[tuple[int, int, int]]]:
        """The ``(dataset, epoch, index)`` samples of each item (0-based within global batch ``batch``)."""
        ids = np.asarray(list(item_ids), dtype=np.int64)
        starts = (batch * self.items_per_batch + ids) * self.group_size
        pos = (starts[:, None] + np.arange(self.group_size)[None, :]).ravel()
        d, e, i = self.samples(pos)
        triples = list(zip(d.tolist(), e.tolist(), i.tolist()))
        return [triples[k * self.group_size : (k + 1) * self.group_size] for k in range(len(ids))]

    def consumed(self, batch: int) -> list[dict]:
        """Per dataset, before global batch ``batch``: samples taken and epochs completed (fractional)."""
        taken = self.blend.consumed(batch * self.samples_per_batch // self.unit) * self.unit
        return [
            {"samples": int(t), "epochs": round(int(t) / o.num_samples, 6)}
            for t, o in zip(taken, self.orders)
        ]

    def rank_items(self, rank: int, world_size: int) -> range:
        """Items of every global batch that data-parallel rank ``rank`` of ``world_size`` takes."""
        per_rank = self.check_world_size(world_size)
        return range(rank * per_rank, (rank + 1) * per_rank)

    def check_world_size(self, world_size: int, micro_items: int | None = None) -> int:
        """Items per rank; [`LayoutError`][energon_platform.loader.schedule.LayoutError] naming the
        world sizes that work otherwise. ``micro_items``: the micro-batch size, which must divide
        each rank's share."""
        return self.check_split(self.items_per_batch, self.group_size, world_size, micro_items)

    @staticmethod
    def check_split(
        items_per_batch: int, group_size: int, world_size: int, micro_items: int | None = None
    ) -> int:
        """`check_world_size` before a schedule exists (the split depends on nothing else)."""
        g = items_per_batch

        def fits(d: int) -> bool:
            return d >= 1 and g % d == 0 and (micro_items is None or (g // d) % micro_items == 0)

        if not fits(world_size):
            ok = [d for d in range(1, g + 1) if fits(d)]
            unit = "pack groups" if group_size > 1 else "samples"
            micro = f" in micro-batches of {micro_items}" if micro_items else ""
            raise LayoutError(
                f"a global batch of {g} {unit} cannot be split over {world_size} data-parallel ranks{micro}; "
                f"world sizes that keep the same global batches: {ok} (any number of workers per rank works)"
            )
        return g // world_size

    def epoch_of_batch(self, batch: int) -> float:
        """Fractional epoch of the first dataset at the start of ``batch`` (for logs)."""
        return self.consumed(batch)[0]["epochs"]
