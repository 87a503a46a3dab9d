"""The global planner: which samples form global batch ``b``, in which rows, on which rank.

With ``loader.balance`` set, a global batch is no longer ``items_per_batch`` consecutive stream
positions: it is *planned* from the stream (`Schedule`,
unchanged) with each sample's exact length from the length index, before any media is decoded.

* **Packed** (an encoder with packing): every global batch is exactly ``global_batch_size`` rows
  of ``seq_len`` positions, from a pool of the carried samples plus the next stream samples (until
  the pool holds ``fill`` batches of positions, at most ``window`` samples). Each row is led by
  one of the pool's documents nearest in length around the oldest one, then filled with shorter
  documents, each into the feasible row of least cost
  (`pack_led_rows`): rows of like cost, on any world size.
  What does not fit is carried to a later global batch, first in line there: never dropped, never
  duplicated; the oldest sample is always placed.
* **Unpacked**: ``global_batch_size`` samples of like cost around the oldest of a pool of
  `BUCKET_POOL` batches, or, with ``global_batch_tokens``, the pool's samples that fit that
  cost budget (the rest carried). With ``like_lengths`` (``balance: measured``), samples of like
  row length instead: a micro-batch is padded to its longest sample, which a sum of per-sample
  predicted times cannot see; the dealing below then evens out the rest of the predicted time.
  With a cost model of the micro-batch as it runs (a grouped `CostModel`), that dealing costs each
  micro-batch as a whole (`MicroBatchCost`, `deal_shapes`): its padded positions, one call per
  tower; and the global batch takes samples that run the oldest one's towers
  (`Planner._same_towers`), so every micro-batch pays the same calls.

Then rows (samples) are dealt to ranks by cost, each rank its equal number of rows (or its share
of samples), and each rank's share to its micro-batches the same way
(`deal`). Rows and batches depend on (seed, position, blend
history, carried samples) only; the dealing also on the world size. The state is
`PlanState`: the next stream position and the carried positions (bounded by the window),
so restore is O(1): planning batch ``b`` continues from the saved state.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from energon_platform.loader.blend import integer_counts
from energon_platform.loader.packer import (
    deal,
    deal_shapes,
    fill_budget,
    pack_led_rows,
    pack_rows,
)
from storage import DatasetError
from task_encoders.features import towers

#: The planner's version in the fingerprint (``balance.planner``): what its plans are a function of.
PLANNER_VERSION = "pool-led-v2"
#: The previous planner, whose checkpoints this one continues (their saved state means the same).
PREVIOUS_PLANNER_VERSION = "pool-led-v1"
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
    def from_json(cls, data: dict) -> PlanState:
        return cls(
            int(data["batch"]), int(data["position"]), tuple(int(p) for p in data["carried"])
        )


@dataclass(frozen=True)
class BatchPlan:
    """One global batch: ``items`` (rows: lists of stream positions; unpacked: one position each),
    their ``costs`` and ``positions`` used (row positions), and the state after it."""

    items: list[list[int]]
    costs: list[float]
    used: list[int]
    next_state: PlanState
    capacity: int = 0  #: positions per row (packed), 0 unpacked
    #: how a micro-batch of these items costs as a whole (unpacked ``measured`` with a grouped
    #: cost model); None: a micro-batch costs the sum of its items' ``costs``
    grouped: MicroBatchCost | None = None

    @property
    def padding(self) -> float:
        """Fraction of the rows' positions left empty (0 unpacked)."""
        return 1.0 - sum(self.used) / (len(self.items) * self.capacity) if self.capacity else 0.0


@dataclass(frozen=True)
class MicroBatchCost:
    """A micro-batch of a plan's items costed as a whole: ``works``, each item's work (its
    features), grown from ``empty`` into a shape (``empty.grow(work)``) that ``cost(shape)``
    prices (`CostModel.shape_cost`)."""

    works: list
    empty: Any
    cost: Any

    def shape(self, items: Sequence[int]) -> Any:
        """The shape of a micro-batch of these item indices."""
        shape = self.empty
        for i in items:
            shape = shape.grow(self.works[i])
        return shape

    def of(self, items: Sequence[int]) -> float:
        """The cost of a micro-batch of these item indices."""
        return self.cost(self.shape(items))


@dataclass
class Planner:
    """Plans global batches of one run (module doc). ``lengths(positions)`` gives each stream
    position's ``(row_length, work_length)``; ``cost(work_length)`` its balance cost, or, for a
    cost that changed during the run, ``cost.at(batch)`` that of global batch ``batch``."""

    lengths: Any
    cost: Any
    items_per_batch: int  #: rows (packed) or samples (unpacked, no budget) per global batch
    capacity: int = 0  #: row length (packed); 0 unpacked
    budget: float | None = None  #: cost per global batch (unpacked with a token budget)
    window: int = 4096  #: most samples in the pool
    fill: float = DEFAULT_FILL
    led: bool = True  #: packed: rows led by like-length documents (`pack_led_rows`), else LPT rows
    #: unpacked, no budget: a global batch's samples are of like row length, not of like cost (a
    #: cost that is not a function of the length: the padding to a micro-batch's longest sample
    #: is computed, and no per-sample cost sees it)
    like_lengths: bool = False
    #: ``identity(positions)``: which sample each stream position is (default: ``lengths.identities``,
    #: else the position itself); two positions of one identity are never in one global batch
    identity: Any = None
    start: PlanState = field(default_factory=PlanState)
    _cache: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self):
        self._cache[self.start.batch] = (self.start, None)

    def identities(self, positions: list[int]) -> list:
        """The sample identity of each stream position (`identity`)."""
        if self.identity is not None:
            return self.identity(positions)
        of = getattr(self.lengths, "identities", None)
        return of(positions) if of is not None else list(positions)

    def length_of(self, dataset: int, epoch: int, index: int) -> tuple[int, int]:
        """``(row_length, work_length)`` of one sample (see `SampleLengths`)."""
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
        """Whether the plan of ``batch`` is kept (`plan` returns it without planning)."""
        return self._cache.get(batch, (None, None))[1] is not None

    def state_at(self, batch: int) -> PlanState:
        """The state where planning of ``batch`` starts (``batch >= start.batch``)."""
        if batch == self.start.batch:
            return self.start
        return self.plan(batch - 1).next_state

    def plan(self, batch: int) -> BatchPlan:
        """The plan of global batch ``batch`` (sequential from the newest cached one)."""
        if batch < self.start.batch:
            raise ValueError(
                f"global batch {batch} is before this planner's start {self.start.batch}"
            )
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

    def cost_at(self, batch: int) -> Any:
        """``cost(work_length)`` of global batch ``batch`` (see `cost`)."""
        at = getattr(self.cost, "at", None)
        return self.cost if at is None else at(batch)

    def _plan(self, state: PlanState) -> BatchPlan:
        pool = Pool(self, state)
        if self.capacity:
            return self._packed(state, pool)
        if self.budget is None:
            return self._bucketed(state, pool)
        return self._budgeted(state, pool)

    @property
    def fixed_counts(self) -> bool:
        """Every rank and micro-batch gets the same number of items (all but the budget mode)."""
        return self.budget is None

    def _bucketed(self, state: PlanState, pool: Pool) -> BatchPlan:
        """Unpacked: the ``items_per_batch`` pool samples nearest in cost around the oldest one
        (which is always taken, so no sample waits more global batches than the pool holds samples;
        most wait a few): samples of like cost, so equal counts per rank are equal work on any
        world size; with `like_lengths`, of like row length, and with a grouped cost (a cost of
        the micro-batch as it runs) of the oldest one's towers too (`_same_towers`). Samples
        whose next copy waits (`Pool`) are taken first."""
        g = self.items_per_batch
        want = min(self.window, BUCKET_POOL * g)
        pool.read(want, lambda i: 1, limit=want)
        pool.read(want, lambda i: 1, minimum=g)  # more only when waiting copies leave too few live
        pool.require(g, state.batch, "samples")
        live = pool.live
        cost = self.cost_at(state.batch)
        costs = {i: cost(pool.lengths[i][1]) for i in live}
        like = {i: pool.lengths[i][0] for i in live} if self.like_lengths else costs
        grouped = getattr(cost, "grouped", None) if self.like_lengths else None
        forced = [live[0]] + [i for i in pool.due if i != live[0]][: g - 1]
        if len(forced) == 1:  # the common case: a window of like ones around the oldest
            among = live if grouped is None else self._same_towers(live, pool, g)
            ranked = sorted(among, key=lambda i: (like[i], i))
            anchor = ranked.index(live[0])
            lo = min(max(0, anchor - g + 1), len(among) - g)
            best = min(
                range(lo, min(anchor, len(among) - g) + 1),
                key=lambda a: (like[ranked[a + g - 1]] - like[ranked[a]], a),
            )
            taken = sorted(ranked[best : best + g])
        else:  # due samples, then the others nearest in cost (or length) to them
            centre = sorted(like[i] for i in forced)[len(forced) // 2]
            chosen = set(forced)
            rest = sorted(
                (i for i in live if i not in chosen), key=lambda i: (abs(like[i] - centre), i)
            )
            taken = sorted(forced + rest[: g - len(forced)])
        if grouped is not None:
            grouped = MicroBatchCost([pool.lengths[i][1] for i in taken], *grouped)
        return self._batch(state, pool, [[i] for i in taken], costs, grouped)

    @staticmethod
    def _same_towers(live: list[int], pool: Pool, g: int) -> list[int]:
        """The live samples that run the same towers as the oldest (`towers`), when there are at
        least ``g`` of them; else all. Micro-batches costed as a whole pay each tower once: a
        batch of like-length samples with one image among texts gives one micro-batch the vision
        tower's call that none of the others pays, and no dealing can even that out."""
        pattern = towers(pool.lengths[live[0]][1])
        same = [i for i in live if towers(pool.lengths[i][1]) == pattern]
        return same if len(same) >= g else live

    def _packed(self, state: PlanState, pool: Pool) -> BatchPlan:
        rows = self.items_per_batch
        target = self.fill * rows * self.capacity
        pool.read(target, lambda i: pool.lengths[i][0], minimum=rows)
        need = max(rows, pool.reach(target, lambda i: pool.lengths[i][0]))
        # and enough short documents to fill the rows around their leads: carried samples are mostly
        # long ones (led rows defer them), so a pool of carried samples alone would leave rows empty.
        # Read at most as many samples again as the first target needs, and keep the live pool within
        # four times that: documents that cannot share rows (as long as a row) would otherwise fill the
        # whole window and carry it from batch to batch.
        short = self.capacity // 4
        pool.read(
            rows * self.capacity,
            lambda i: pool.lengths[i][0] if pool.lengths[i][0] <= short else 0,
            limit=min(len(pool.positions) + need, 4 * need + pool.waiting),
        )
        pool.require(rows, state.batch, "documents to lead its rows")
        live = pool.prioritised(state)
        cost = self.cost_at(state.batch)
        costs = {i: cost(pool.lengths[i][1]) for i in live}
        pack = pack_led_rows if self.led else partial(pack_rows, balance=True)
        rows_, _ = pack(
            [pool.lengths[i][0] for i in live],
            [costs[i] for i in live],
            [pool.positions[i] for i in live],
            rows,
            self.capacity,
            first=pool.first,
        )
        return self._batch(state, pool, [[live[k] for k in row] for row in rows_], costs)

    def _budgeted(self, state: PlanState, pool: Pool) -> BatchPlan:
        cost = self.cost_at(state.batch)
        cost_of = lambda i: cost(pool.lengths[i][1])  # noqa: E731
        pool.read(self.fill * self.budget, cost_of, minimum=self.items_per_batch)
        pool.require(self.items_per_batch, state.batch, "samples")
        live = pool.prioritised(state)
        costs = {i: cost_of(i) for i in live}
        if (
            pool.starved and pool.waiting and sum(costs.values()) < self.budget
        ):  # repeats, not the window, limit it
            raise PlanError(
                f"global batch {state.batch}: loader.balance.global_batch_tokens={self.budget:g} cannot be "
                f"reached without repeating a sample (every distinct sample in reach costs "
                f"{sum(costs.values()):g}); lower balance.global_batch_tokens"
            )
        taken, _ = fill_budget([costs[i] for i in live], self.budget, minimum=self.items_per_batch)
        return self._batch(
            state, pool, [[live[k]] for k in sorted(taken, key=lambda k: live[k])], costs
        )

    def _batch(
        self,
        state: PlanState,
        pool: Pool,
        rows: list[list[int]],
        costs: dict,
        grouped: MicroBatchCost | None = None,
    ) -> BatchPlan:
        """The `BatchPlan` of ``rows`` (lists of pool indices); everything else is carried."""
        placed = {i for row in rows for i in row}
        return BatchPlan(
            [[pool.positions[i] for i in row] for row in rows],
            [sum(costs[i] for i in row) for row in rows],
            [sum(pool.lengths[i][0] for i in row) for row in rows],
            PlanState(
                state.batch + 1,
                pool.position,
                tuple(p for i, p in enumerate(pool.positions) if i not in placed),
            ),
            self.capacity,
            grouped,
        )


class PlanError(DatasetError):
    """A global batch cannot be made without putting one sample in it twice (one line).
    ``smallest``: the samples of the dataset too small for its share, where one is known."""

    def __init__(self, message: str, smallest: int | None = None):
        super().__init__(message)
        self.smallest = smallest


def check_distinct(
    blend: Any, sizes: Sequence[int], names: Sequence[str], units_per_batch: int, unit: int = 1
) -> None:
    """`PlanError` when, in some segment of ``blend`` (``units_per_batch`` blend units of
    ``unit`` samples per global batch), a dataset's share of a global batch exceeds its number of
    samples: every global batch would then hold one of its samples twice, whatever the order
    (the blend's ratios are exact)."""
    for seg in blend.segments:
        counts = integer_counts(seg.weights)
        period = sum(counts)
        for name, size, c in zip(names, sizes, counts):
            if c * units_per_batch * unit > size * period:
                share = c * units_per_batch * unit / period
                when = f" from global batch {seg.start // units_per_batch}" if seg.start else ""
                raise PlanError(
                    f"dataset {name!r} has {size} samples, but its share of a global batch of "
                    f"{units_per_batch * unit} samples is {share:.4g}{when}: every global batch would repeat "
                    f"some of them; lower its weight or the global batch size",
                    smallest=size,
                )


class Pool:
    """The samples a global batch is planned from: the carried stream positions, then positions
    read from the stream, in stream order (index ``i`` in `positions`).

    One sample (dataset and index) may be pending at several positions when a small dataset
    wraps into its next epoch: only its *first* pending copy is `live` (may be placed);
    later copies *wait* (are carried unplaced) until the earlier one is placed. A global batch
    never holds one sample twice, and a sample's copy of epoch ``e + 1`` is never placed while
    its copy of epoch ``e`` is pending. Live samples with a waiting copy are `due` and are
    placed first, so waiting copies move on."""

    def __init__(self, planner: Planner, state: PlanState):
        self.planner = planner
        self.positions: list[int] = list(state.carried)
        self.lengths: list[tuple[int, int]] = planner.lengths(self.positions)
        self.position = state.position  #: the next unread stream position
        self.carried = len(state.carried)
        self.first = 0  #: after `prioritised`: how many of its indices come first (due or carried)
        self.live: list[int] = []
        self.due: list[int] = []
        self._first: dict = {}  # sample identity -> index of its live copy
        self._due: set[int] = set()
        self._sort(range(len(self.positions)), planner.identities(self.positions))

    def _sort(self, indices, ids) -> None:
        for i, key in zip(indices, ids):
            live = self._first.setdefault(key, i)
            if live == i:
                self.live.append(i)
            elif live not in self._due:
                self._due.add(live)
                self.due.append(live)

    @property
    def waiting(self) -> int:
        """Pending positions that are not live (later copies of a live sample)."""
        return len(self.positions) - len(self.live)

    @property
    def starved(self) -> bool:
        """The pool could not grow as asked: its window is full (of waiting copies, often)."""
        return len(self.positions) >= self.planner.window

    def read(self, target: float, measure, minimum: int = 0, limit: int | None = None) -> int:
        """Read stream positions until the live samples' ``measure`` (of a pool index) sums to
        ``target`` and at least ``minimum`` are live, or the pool holds ``limit`` (default: the
        window) positions; returns the number of live samples."""
        limit = self.planner.window if limit is None else min(limit, self.planner.window)
        total = sum(measure(i) for i in self.live)
        while (total < target or len(self.live) < minimum) and len(self.positions) < limit:
            new = list(
                range(self.position, self.position + max(1, min(limit - len(self.positions), 64)))
            )
            start, before = len(self.positions), len(self.live)
            self.positions += new
            self.lengths += self.planner.lengths(new)
            self.position += len(new)
            self._sort(range(start, len(self.positions)), self.planner.identities(new))
            total += sum(measure(i) for i in self.live[before:])
        return len(self.live)

    def reach(self, target: float, measure) -> int:
        """How many live samples, oldest first, ``measure`` needs to sum to ``target`` (all if fewer)."""
        total = 0.0
        for k, i in enumerate(self.live):
            total += measure(i)
            if total >= target:
                return k + 1
        return len(self.live)

    def require(self, count: int, batch: int, what: str) -> None:
        """`PlanError` unless at least ``count`` samples are live."""
        if len(self.live) < count:
            raise PlanError(
                f"global batch {batch} needs {count} distinct {what}, but only {len(self.live)} are "
                f"within loader.balance.window={self.planner.window} stream positions without repeating "
                f"one ({self.waiting} later copies wait): a dataset is too small for its share of the "
                f"global batch; lower its weight or the global batch size, or raise balance.window"
            )

    def prioritised(self, state: PlanState) -> list[int]:
        """Live indices with the due and carried ones first (see `first`), oldest first within each."""
        due = set(self.due)
        front = [i for i in self.live if i in due or i < self.carried]
        self.first = len(front)
        return front + [i for i in self.live if i not in due and i >= self.carried]


def deal_plan(
    plan: BatchPlan, world_size: int, accumulation: int, fixed: bool
) -> list[list[list[int]]]:
    """``[rank][micro-batch]`` → indices into ``plan.items``. ``fixed``: every rank and micro-batch
    gets the same number of items (rows); else counts vary and costs are balanced. A `grouped`
    plan (fixed counts) is dealt to all ``world_size x accumulation`` micro-batches at once, each
    costed as a whole (`deal_shapes`), and the micro-batches to ranks by their cost (`deal`)."""
    n = len(plan.items)
    order = [item[0] for item in plan.items]
    if plan.grouped is not None and fixed:
        return _deal_grouped(plan, order, world_size, accumulation)
    ranks = deal(plan.costs, order, world_size, n // world_size if fixed else None)
    out = []
    for share in ranks:
        micro = deal(
            [plan.costs[i] for i in share],
            [order[i] for i in share],
            accumulation,
            len(share) // accumulation if fixed else None,
        )
        out.append([[share[i] for i in m] for m in micro])
    return out


def _deal_grouped(
    plan: BatchPlan, order: list[int], world_size: int, accumulation: int
) -> list[list[list[int]]]:
    """`deal_plan` of a grouped plan: micro-batches by `deal_shapes`, ranks by `deal` of them."""
    g = plan.grouped
    slots = world_size * accumulation
    micro = deal_shapes(g.works, order, slots, len(plan.items) // slots, g.empty, g.cost)
    first = [order[m[0]] for m in micro]
    ranks = deal([g.of(m) for m in micro], first, world_size, accumulation)
    return [[micro[k] for k in share] for share in ranks]


def rank_costs(plan: BatchPlan, dealt: list[list[list[int]]]) -> list[float]:
    """Each rank's cost under ``dealt``: the sum of its items' costs, or of its micro-batches'
    (a `grouped` plan)."""
    if plan.grouped is not None:
        return [sum(plan.grouped.of(m) for m in rank if m) for rank in dealt]
    return [sum(plan.costs[i] for m in rank for i in m) for rank in dealt]
