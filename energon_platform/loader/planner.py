"""The global planner: which samples form global batch ``b``, in which rows, on which rank.

With ``loader.balance`` set, a global batch is no longer ``items_per_batch`` consecutive stream
positions: it is *planned* from the stream (:class:`~energon_platform.loader.schedule.Schedule`,
unchanged) with each sample's exact length from the length index, before any media is decoded.

* **Packed** (an encoder with packing): every global batch is exactly ``global_batch_size`` rows
  of ``seq_len`` positions, from a pool of the carried samples plus the next stream samples (until
  the pool holds ``fill`` batches of positions, at most ``window`` samples). Each row is led by
  one of the pool's documents nearest in length around the oldest one, then filled with shorter
  documents, each into the feasible row of least cost
  (:func:`~energon_platform.loader.packer.pack_led_rows`): rows of like cost, on any world size.
  What does not fit is carried to a later global batch, first in line there: never dropped, never
  duplicated; the oldest sample is always placed.
* **Unpacked**: ``global_batch_size`` samples of like cost around the oldest of a pool of
  :data:`BUCKET_POOL` batches, or, with ``global_batch_tokens``, the pool's samples that fit that
  cost budget (the rest carried).

Then rows (samples) are dealt to ranks by cost, each rank its equal number of rows (or its share
of samples), and each rank's share to its micro-batches the same way
(:func:`~energon_platform.loader.packer.deal`). Rows and batches depend on (seed, position, blend
history, carried samples) only; the dealing also on the world size. The state is
:class:`PlanState`: the next stream position and the carried positions (bounded by the window),
so restore is O(1): planning batch ``b`` continues from the saved state.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from dataclasses import dataclass, field
from typing import Any

from energon_platform.loader.packer import deal, fill_budget, pack_led_rows, pack_rows

#: Pool fill (positions or cost, relative to the batch's) the packer looks ahead.
DEFAULT_FILL = 3.0
#: Unpacked without a budget: the pool holds this many global batches of samples (at most ``window``).
BUCKET_POOL = 32


@dataclass(frozen=True)
class PlanState:
    """Where planning of global batch ``batch`` starts: the next unread stream ``position`` and
    the ``carried`` stream positions (read earlier, not yet placed), in stream order."""

    batch: int = 0
    position: int = 0
    carried: tuple[int, ...] = ()

    def to_json(self) -> dict:
        return {"batch": self.batch, "position": self.position, "carried": list(self.carried)}

    @classmethod
    def from_json(cls, data: dict) -> "PlanState":
        return cls(int(data["batch"]), int(data["position"]), tuple(int(p) for p in data["carried"]))


@dataclass(frozen=True)
class BatchPlan:
    """One global batch: ``items`` (rows: lists of stream positions; unpacked: one position each),
    their ``costs`` and ``positions`` used (row positions), and the state after it."""

    items: list[list[int]]
    costs: list[float]
    used: list[int]
    next_state: PlanState
    capacity: int = 0  #: positions per row (packed), 0 unpacked

    @property
    def padding(self) -> float:
        """Fraction of the rows' positions left empty (0 unpacked)."""
        return 1.0 - sum(self.used) / (len(self.items) * self.capacity) if self.capacity else 0.0


@dataclass
class Planner:
    """Plans global batches of one run (module doc). ``lengths(positions)`` gives each stream
    position's ``(row_length, work_length)``; ``cost(work_length)`` its balance cost."""

    lengths: Any
    cost: Any
    items_per_batch: int  #: rows (packed) or samples (unpacked, no budget) per global batch
    capacity: int = 0  #: row length (packed); 0 unpacked
    budget: float | None = None  #: cost per global batch (unpacked with a token budget)
    window: int = 4096  #: most samples in the pool
    fill: float = DEFAULT_FILL
    led: bool = True  #: packed: rows led by like-length documents (:func:`pack_led_rows`), else LPT rows
    start: PlanState = field(default_factory=PlanState)
    _cache: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self):
        self._cache[self.start.batch] = (self.start, None)

    def length_of(self, dataset: int, epoch: int, index: int) -> tuple[int, int]:
        """``(row_length, work_length)`` of one sample (see :class:`~energon_platform.loader.lengths.SampleLengths`)."""
        return self.lengths.length_of(dataset, epoch, index)

    def restart(self, state: PlanState) -> None:
        """Continue from ``state`` (a restore): forget what was planned."""
        self.start = state
        self._cache.clear()
        self._cache[state.batch] = (state, None)

    @property
    def newest(self) -> int:
        """The newest global batch planned so far (the start's batch before any): planning a batch
        at or shortly before it is cached, one after it plans the batches in between."""
        return max(self._cache)

    def kept(self, batch: int) -> bool:
        """Whether the plan of ``batch`` is kept (:meth:`plan` returns it without planning)."""
        return self._cache.get(batch, (None, None))[1] is not None

    def state_at(self, batch: int) -> PlanState:
        """The state where planning of ``batch`` starts (``batch >= start.batch``)."""
        if batch == self.start.batch:
            return self.start
        return self.plan(batch - 1).next_state

    def plan(self, batch: int) -> BatchPlan:
        """The plan of global batch ``batch`` (sequential from the newest cached one)."""
        if batch < self.start.batch:
            raise ValueError(f"global batch {batch} is before this planner's start {self.start.batch}")
        b = max(k for k in self._cache if k <= batch)
        state, plan = self._cache[b]
        while b < batch or plan is None:
            if plan is not None:
                state, b = plan.next_state, b + 1
            plan = self._plan(state)
            self._cache[b] = (state, plan)
            while len(self._cache) > 16:  # keep the start (always reachable) and the newest plans
                oldest = next(k for k in self._cache if k != self.start.batch)
                del self._cache[oldest]
        return plan

    def _plan(self, state: PlanState) -> BatchPlan:
        pool, position = list(state.carried), state.position
        if self.capacity:
            return self._packed(state, pool, position)
        if self.budget is None:
            return self._bucketed(state, pool, position)
        return self._budgeted(state, pool, position)

    @property
    def fixed_counts(self) -> bool:
        """Every rank and micro-batch gets the same number of items (all but the budget mode)."""
        return self.budget is None

    def _bucketed(self, state: PlanState, pool: list[int], position: int) -> BatchPlan:
        """Unpacked: the ``items_per_batch`` pool samples nearest in cost around the oldest one
        (which is always taken, so no sample waits more global batches than the pool holds samples;
        most wait a few): samples of like cost, so equal counts per rank are equal work on any
        world size."""
        want = min(self.window, BUCKET_POOL * self.items_per_batch)
        new = list(range(position, position + max(0, want - len(pool))))
        pool += new
        lengths = self.lengths(pool)
        costs = [self.cost(w) for _, w in lengths]
        ranked = sorted(range(len(pool)), key=lambda i: (costs[i], pool[i]))
        anchor = ranked.index(min(range(len(pool)), key=lambda i: pool[i]))
        g = self.items_per_batch
        lo = min(max(0, anchor - g + 1), len(pool) - g)
        best = min(range(lo, min(anchor, len(pool) - g) + 1), key=lambda a: (costs[ranked[a + g - 1]] - costs[ranked[a]], a))
        taken = sorted(ranked[best:best + g], key=lambda i: pool[i])
        chosen = set(taken)
        return BatchPlan([[pool[i]] for i in taken], [costs[i] for i in taken], [lengths[i][0] for i in taken],
                         PlanState(state.batch + 1, position + len(new),
                                   tuple(p for i, p in enumerate(pool) if i not in chosen)))

    def _grow(self, pool: list[int], position: int, lengths: list, target: float, measure) -> int:
        """Append stream positions to ``pool`` (and their lengths) until ``measure`` reaches
        ``target`` or the pool holds ``window`` samples; returns the next position."""
        total = sum(measure(x) for x in lengths)
        while (total < target or len(pool) < self.items_per_batch) and len(pool) < self.window:
            step = max(1, min(self.window - len(pool), 64))
            new = list(range(position, position + step))
            got = self.lengths(new)
            pool += new
            lengths += got
            total += sum(measure(x) for x in got)
            position += step
        return position

    def _packed(self, state: PlanState, pool: list[int], position: int) -> BatchPlan:
        lengths = self.lengths(pool)
        position = self._grow(pool, position, lengths, self.fill * self.items_per_batch * self.capacity,
                              lambda x: x[0])
        # and enough short documents to fill the rows around their leads: carried samples are mostly
        # long ones (led rows defer them), so a pool of carried samples alone would leave rows empty
        short = self.capacity // 4
        position = self._grow(pool, position, lengths, self.items_per_batch * self.capacity / 2,
                              lambda x: x[0] if x[0] <= short else 0)
        costs = [self.cost(w) for _, w in lengths]
        pack = pack_led_rows if self.led else partial(pack_rows, balance=True)
        rows, carried = pack([r for r, _ in lengths], costs, pool, self.items_per_batch, self.capacity,
                             first=len(state.carried))
        return BatchPlan([[pool[i] for i in row] for row in rows], [sum(costs[i] for i in row) for row in rows],
                         [sum(lengths[i][0] for i in row) for row in rows],
                         PlanState(state.batch + 1, position, tuple(pool[i] for i in carried)), self.capacity)

    def _budgeted(self, state: PlanState, pool: list[int], position: int) -> BatchPlan:
        lengths = self.lengths(pool)
        position = self._grow(pool, position, lengths, self.fill * self.budget, lambda x: self.cost(x[1]))
        costs = [self.cost(w) for _, w in lengths]
        taken, carried = fill_budget(costs, self.budget, minimum=self.items_per_batch)
        return BatchPlan([[pool[i]] for i in taken], [costs[i] for i in taken], [lengths[i][0] for i in taken],
                         PlanState(state.batch + 1, position, tuple(pool[i] for i in carried)))


def deal_plan(plan: BatchPlan, world_size: int, accumulation: int, fixed: bool) -> list[list[list[int]]]:
    """``[rank][micro-batch]`` → indices into ``plan.items``. ``fixed``: every rank and micro-batch
    gets the same number of items (rows); else counts vary and costs are balanced."""
    n = len(plan.items)
    order = [item[0] for item in plan.items]
    ranks = deal(plan.costs, order, world_size, n // world_size if fixed else None)
    out = []
    for share in ranks:
        micro = deal([plan.costs[i] for i in share], [order[i] for i in share], accumulation,
                     len(share) // accumulation if fixed else None)
        out.append([[share[i] for i in m] for m in micro])
    return out


def rank_costs(plan: BatchPlan, dealt: list[list[list[int]]]) -> list[float]:
    """Each rank's summed cost under ``dealt``."""
    return [sum(plan.costs[i] for m in rank for i in m) for rank in dealt]
