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

Whatever the mode, each dataset's epochs are placed in order (`Pool`): its next epoch is fenced
until its current one is placed, a pool closed by such a fence is planned as runs of like cost
(unpacked) or led by its longest documents (packed, when short), and one global batch straddles
each boundary with the epoch's last samples forced in.

Then rows (samples) are dealt to ranks by cost, each rank its equal number of rows (or its share
of samples), and each rank's share to its micro-batches the same way
(`deal_plan`; `deal_bound` says how close any dealing can come). Rows and batches depend on (seed, position, blend
history, carried samples) only; the dealing also on the world size. The state is
`PlanState`: the next stream position and the carried positions (bounded by the window),
so restore is O(1): planning batch ``b`` continues from the saved state.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from energon_platform.loader.balance.packer import fill_budget, pack_led_rows, pack_rows
from energon_platform.loader.balance.plans import (
    BatchPlan,
    Copy,
    Lengths,
    MicroBatchCost,
    PlanError,
    PlanState,
)
from energon_platform.loader.balance.pool import Pool
from energon_platform.loader.blend import integer_counts
from task_encoders.features import towers

#: The planner's version in the fingerprint (``balance.planner``): what its plans are a function of.
PLANNER_VERSION = "epoch-fenced-v3"
#: Pool fill (positions or cost, relative to the batch's) the packer looks ahead.
DEFAULT_FILL = 3.0
#: Unpacked without a budget: the pool holds this many global batches of samples (at most ``window``).
BUCKET_POOL = 32
#: Packed: rows this empty (a fraction of their positions) are planned again with the next epoch
#: of a dataset whose epoch is ending let in (`Planner._packed`)
STRADDLE_PADDING = 0.05
#: Packed and budgeted: a pool reads on past a dataset's epoch boundary (its fenced copies, `Pool`)
#: until ``window // FENCED_PART`` of its positions are fenced; unpacked: until `pool_size` are
FENCED_PART = 8
#: The planner remembers the copies and lengths of this many windows of positions (`Planner.lookup`)
REMEMBERED = 4


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
    #: ``samples(positions)``: which copy each stream position is, ``(dataset, epoch, index)``
    #: (default: ``lengths.copies``, else each position a sample of its own in epoch 0): a global
    #: batch never holds one sample twice, and a dataset's epochs are placed in order (`Pool`)
    samples: Any = None
    start: PlanState = field(default_factory=PlanState)
    #: plans kept (`plan`): more than the batches planned ahead at once (``blend_adapt.lag``),
    #: or planning the batch after the current one starts again from `start`
    keep: int = 16
    _cache: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _known: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self):
        self._cache[self.start.batch] = (self.start, None)

    def copies(self, positions: list[int]) -> list[tuple[int, int, int]]:
        """``(dataset, epoch, index)`` of each stream position (`samples`)."""
        if self.samples is not None:
            return self.samples(positions)
        of = getattr(self.lengths, "copies", None)
        return of(positions) if of is not None else [(0, 0, p) for p in positions]

    def lookup(self, positions: list[int], ahead: int = 0) -> tuple[list[Copy], list[Lengths]]:
        """`copies` and `lengths` of ``positions`` (as `Copy` and `Lengths`), remembered: a pool is rebuilt from its
        carried positions for every global batch (the last ``REMEMBERED x window`` positions
        looked up are kept, least recently looked up forgotten first). ``ahead``: also look up
        that many positions after the last one, in the same call (the stream is read in order;
        one schedule lookup of many positions costs about what one of a few does)."""
        known = self._known
        missing = [p for p in positions if p not in known]
        if missing and ahead:
            end = max(positions) + 1
            missing += [p for p in range(end, end + ahead) if p not in known]
        if missing:
            copies = self.copies(missing)
            of = getattr(self.lengths, "of_copies", None)  # the lengths without a second lookup
            lengths = of(copies) if of is not None else self.lengths(missing)
            for p, copy, length in zip(missing, copies, lengths):
                known[p] = (Copy(*copy), Lengths(*length))
        found = [known[p] for p in positions]
        for p in positions:
            known.move_to_end(p)
        while len(known) > REMEMBERED * self.window:
            known.popitem(last=False)
        return [f[0] for f in found], [f[1] for f in found]

    def identities(self, positions: list[int]) -> list[tuple[int, int]]:
        """``(dataset, index)`` of each stream position: the same sample in any epoch."""
        return [(d, i) for d, _, i in self.copies(positions)]

    def length_of(self, dataset: int, epoch: int, index: int) -> Lengths:
        """The `Lengths` of one sample (see `SampleLengths`)."""
        return Lengths(*self.lengths.length_of(dataset, epoch, index))

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
            # keep the start (always reachable) and the newest plans
            while len(self._cache) > self.keep:
                oldest = next(k for k in self._cache if k != self.start.batch)
                del self._cache[oldest]
        return plan

    def extend(self, lengths: Any, before: int) -> None:
        """Plan over a stream that is the same before stream position ``before`` (a blend
        extended from there on) with ``lengths`` over it: the plans whose pool read only earlier
        positions are kept, and the lookups of earlier positions; later batches are planned
        again. The same object goes on (whoever holds it plans over the new stream)."""
        self.lengths = lengths
        for batch, (state, plan) in list(self._cache.items()):
            read_to = state.position if plan is None else plan.next_state.position
            if read_to > before and batch != self.start.batch:
                del self._cache[batch]
            elif read_to > before:  # the start: its state stays, its plan goes
                self._cache[batch] = (state, None)
        for p in [p for p in self._known if p >= before]:
            del self._known[p]

    def cost_at(self, batch: int) -> Any:
        """``cost(work_length)`` of global batch ``batch`` (see `cost`)."""
        at = getattr(self.cost, "at", None)
        return self.cost if at is None else at(batch)

    def _plan(self, state: PlanState) -> BatchPlan:
        if self.capacity:
            return self._packed(state, Pool(self, state, self.window // FENCED_PART))
        if self.budget is None:
            return self._bucketed(state, Pool(self, state, self.pool_size))
        return self._budgeted(state, Pool(self, state, self.window // FENCED_PART), self.budget)

    @property
    def pool_size(self) -> int:
        """Unpacked without a budget: the live samples a global batch is chosen from."""
        return min(self.window, BUCKET_POOL * self.items_per_batch)

    @property
    def fixed_counts(self) -> bool:
        """Every rank and micro-batch gets the same number of items (all but the budget mode)."""
        return self.budget is None

    def _bucketed(self, state: PlanState, pool: Pool) -> BatchPlan:
        """Unpacked: ``items_per_batch`` samples of like cost (with `like_lengths`, of like row
        length, and with a grouped cost of the oldest one's towers too, `_same_towers`), so equal
        counts per rank are equal work on any world size. Three cases:

        * the pool is not closed (`Pool.closed` is false, or it holds `pool_size` live samples): the
          ``g`` samples nearest in cost around the oldest, which is always taken (no sample waits
          more global batches than the pool holds samples; most wait a few);
        * the pool is *closed* (a dataset's epoch boundary stops it growing): its live samples
          sorted by cost, cut into runs of ``g`` from the costliest down (the remainder, the
          cheapest, shares the batch that straddles the boundary); the run holding the oldest, or
          the cheapest run when the oldest is in the remainder. Removing a run leaves the others
          as they were, so a closed pool is emitted as its runs, each of like cost;
        * the straddle (`Pool.open`): the forced samples (the end of an epoch), and the next
          epoch's samples nearest in cost to their median; likewise a late epoch (`Pool.overdue`:
          a dataset that needs more of a global batch than the other cases give it, a tiny one
          weighted high) is forced in, with the oldest sample."""
        g = self.items_per_batch
        want = self.pool_size
        pool.read(want)
        pool.require(g, state.batch, "samples")
        live = pool.live
        cost = self.cost_at(state.batch)
        costs = {i: cost(pool.lengths[i].work) for i in live}
        like = {i: pool.lengths[i].row for i in live} if self.like_lengths else costs
        grouped = getattr(cost, "grouped", None) if self.like_lengths else None
        late = pool.forced or pool.overdue(state.batch * g)
        if late:
            forced = pool.forced or ([live[0]] + [i for i in late if i != live[0]])[:g]
            centre = sorted(like[i] for i in forced)[len(forced) // 2]
            chosen = set(forced)
            rest = sorted(
                (i for i in live if i not in chosen), key=lambda i: (abs(like[i] - centre), i)
            )
            taken = forced + rest[: g - len(forced)]
        else:
            among = live if grouped is None else self._same_towers(live, pool, g)
            ranked = sorted(among, key=lambda i: (like[i], i))
            if len(live) < want and pool.closed:
                runs = [ranked[k - g : k] for k in range(len(ranked), g - 1, -g)]
                taken = next((run for run in runs if live[0] in run), runs[-1])
            else:
                anchor = ranked.index(live[0])
                lo = min(max(0, anchor - g + 1), len(among) - g)
                starts = range(lo, min(anchor, len(among) - g) + 1)
                best = min(starts, key=lambda a: (like[ranked[a + g - 1]] - like[ranked[a]], a))
                taken = ranked[best : best + g]
        taken = sorted(taken)
        if grouped is not None:
            grouped = MicroBatchCost([pool.lengths[i].work for i in taken], *grouped)
        return self._batch(state, pool, [[i] for i in taken], costs, grouped)

    @staticmethod
    def _same_towers(live: list[int], pool: Pool, g: int) -> list[int]:
        """The live samples that run the same towers as the oldest (`towers`), when there are at
        least ``g`` of them; else all. Micro-batches costed as a whole pay each tower once: a
        batch of like-length samples with one image among texts gives one micro-batch the vision
        tower's call that none of the others pays, and no dealing can even that out."""
        pattern = towers(pool.lengths[live[0]].work)
        same = [i for i in live if towers(pool.lengths[i].work) == pattern]
        return same if len(same) >= g else live

    def _packed(self, state: PlanState, pool: Pool) -> BatchPlan:
        """Packed rows (`pack_led_rows`) from the open epochs' documents; when they leave more than
        `STRADDLE_PADDING` of the rows empty (the end of a small dataset's epoch), the rows
        planned again with the next epoch let in (`Pool.open`), kept when every forced document
        is placed and the rows are fuller."""
        plan, _ = self._pack(state, pool)
        if plan.padding > STRADDLE_PADDING and self.led:
            straddle, placed = self._pack(state, Pool(self, state, pool.fence_cap), straddle=True)
            if placed and straddle.padding < plan.padding:
                return straddle
        return plan

    def _pack(self, state: PlanState, pool: Pool, straddle: bool = False) -> tuple[BatchPlan, bool]:
        """The packed plan from ``pool`` (``straddle``: its fenced datasets' next epochs let in,
        `Pool.open`) and whether every forced document is placed."""
        rows = self.items_per_batch
        target = self.fill * rows * self.capacity
        pool.read(target, lambda i: pool.lengths[i].row, minimum=rows)
        need = max(rows, pool.reach(target, lambda i: pool.lengths[i].row))
        # and enough short documents to fill the rows around their leads: carried samples are mostly
        # long ones (led rows defer them), so a pool of carried samples alone would leave rows empty.
        # Read at most as many samples again as the first target needs, and keep the live pool within
        # four times that: documents that cannot share rows (as long as a row) would otherwise fill the
        # whole window and carry it from batch to batch.
        short = self.capacity // 4
        pool.read(
            rows * self.capacity,
            lambda i: pool.lengths[i].row if pool.lengths[i].row <= short else 0,
            limit=min(len(pool.positions) + need, 4 * need + pool.waiting),
        )
        if straddle:
            if not pool.open():
                return BatchPlan([], [], [], state), False
            if sum(pool.lengths[i].row for i in pool.forced) > rows * self.capacity:
                return BatchPlan([], [], [], state), False
            pool.read(target, lambda i: pool.lengths[i].row, minimum=rows)
        pool.require(rows, state.batch, "documents to lead its rows")
        live = pool.prioritised(state)
        cost = self.cost_at(state.batch)
        costs = {i: cost(pool.lengths[i].work) for i in live}
        order = [pool.positions[i] for i in live]
        lengths = [pool.lengths[i].row for i in live]
        if self.led:
            # a closed pool (no more live documents come in before a boundary) short of the
            # look-ahead is packed longest first: its long documents lead, its short ones fill
            # (else rows around a short oldest one are left empty, and the long ones wait for the
            # straddle); a closed pool that still holds the look-ahead is led as any other
            closed = pool.closed and not pool.forced and sum(lengths) < target
            rows_, _ = pack_led_rows(
                lengths,
                [costs[i] for i in live],
                order,
                rows,
                self.capacity,
                first=pool.first,
                leads=len(live) if closed else len(pool.forced),
            )
        else:
            rows_, _ = pack_rows(
                lengths, [costs[i] for i in live], order, rows, self.capacity, balance=True
            )
        plan = self._batch(state, pool, [[live[k] for k in row] for row in rows_], costs)
        placed = {live[k] for row in rows_ for k in row}
        return plan, all(i in placed for i in pool.forced)

    def _budgeted(self, state: PlanState, pool: Pool, budget: float) -> BatchPlan:
        """Unpacked with ``global_batch_tokens`` (``budget``): the pool's samples (forced and
        carried first) that fit the budget (`fill_budget`). When the open epochs cannot reach it,
        the batch straddles into the next epoch (`Pool.open`) if everything forced fits it."""
        cost = self.cost_at(state.batch)
        cost_of = lambda i: cost(pool.lengths[i].work)  # noqa: E731
        target = self.fill * budget
        pool.read(target, cost_of, minimum=self.items_per_batch)
        if (
            pool.blocked
            and sum(cost_of(i) for i in pool.live) < budget
            and sum(cost_of(i) for i in pool.closing()) <= budget
            and pool.open()
        ):
            pool.read(target, cost_of, minimum=self.items_per_batch)
        pool.require(self.items_per_batch, state.batch, "samples")
        live = pool.prioritised(state)
        costs = {i: cost_of(i) for i in live}
        # repeats, not the window, limit it
        if pool.blocked and pool.waiting and sum(costs.values()) < budget:
            raise PlanError(
                f"global batch {state.batch}: loader.balance.global_batch_tokens={budget:g} cannot be "
                f"reached without repeating a sample (every distinct sample in reach costs "
                f"{sum(costs.values()):g}); lower balance.global_batch_tokens"
            )
        taken, _ = fill_budget([costs[i] for i in live], budget, minimum=self.items_per_batch)
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
            [sum(pool.lengths[i].row for i in row) for row in rows],
            PlanState(
                state.batch + 1,
                pool.position,
                tuple(p for i, p in enumerate(pool.positions) if i not in placed),
            ),
            self.capacity,
            grouped,
        )


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
