"""The pool a global batch is planned from (`Pool`): carried and newly read stream positions,
each dataset's epochs fenced so they are placed in order."""

from __future__ import annotations

from typing import Any

from energon_platform.loader.balance.plans import PlanError, PlanState

#: Positions looked up beyond those a read takes (`Planner.lookup`): the next reads find them
LOOKUP_AHEAD = 448


class Pool:
    """The samples a global batch is planned from: the carried stream positions, then positions
    read from the stream, in stream order (index ``i`` in `positions`).

    **Epochs are permutations, per dataset.** A dataset's *open* epoch is the least epoch of its
    pending copies (the first one in stream order). Only copies of the open epoch are `live`
    (may be placed); a copy of a later epoch is *fenced* (carried unplaced) until every copy of
    the open epoch is placed. Reading goes on past a fence (other datasets' samples are live) until
    ``fence_cap`` fenced positions are pending. When too few samples are live for one global batch,
    `open` lets each fenced dataset's next epoch in for this one batch and *forces* every pending
    copy of its open epoch into it (`forced`): at most one global batch straddles a boundary, and
    there no sample twice (only the first pending copy of a sample is live).

    ``planner``: the `Planner` it serves (its ``lookup`` and ``window``; not imported here,
    which would make the two modules import each other)."""

    def __init__(self, planner: Any, state: PlanState, fence_cap: int):
        self.planner = planner
        self.positions: list[int] = list(state.carried)
        self.copies, self.lengths = planner.lookup(self.positions)
        self.position = state.position  #: the next unread stream position
        self.carried = len(state.carried)
        self.fence_cap = fence_cap
        #: after `prioritised`: how many of its indices come first (forced or carried)
        self.first = 0
        #: datasets whose next epoch `open` let in
        self.opened: set[int] = set()
        #: after `open`: the pending copies of the opened datasets' open epochs
        self.forced: list[int] = []
        self._classify()

    def _classify(self) -> None:
        self.live: list[int] = []
        self.fenced = 0  #: pending positions of a later epoch than their dataset's open one
        self._epoch: dict[int, int] = {}  # dataset -> its open epoch
        self._first: set = set()  # identities with a live copy
        # dataset -> stream position of its first fenced copy (its keys: the datasets whose open
        # epoch is all read; until `open`, a copy is fenced only for its epoch)
        self._fence: dict[int, int] = {}
        self._sort(range(len(self.positions)))

    def _sort(self, indices) -> None:
        for i in indices:
            d, e, index = self.copies[i]
            open_ = self._epoch.setdefault(d, e)
            if e > open_ + (d in self.opened) or (d, index) in self._first:
                self.fenced += 1
                self._fence.setdefault(d, self.positions[i])
            else:
                self._first.add((d, index))
                self.live.append(i)

    @property
    def waiting(self) -> int:
        """Pending positions that are not live (fenced: a later epoch, or a later copy)."""
        return len(self.positions) - len(self.live)

    @property
    def starved(self) -> bool:
        """The pool could not grow as asked: its window is full (of fenced copies, often)."""
        return len(self.positions) >= self.planner.window

    @property
    def blocked(self) -> bool:
        """No more live samples can be read (the window, or fenced copies, are full)."""
        return self.starved or self.fenced >= self.fence_cap

    @property
    def closed(self) -> bool:
        """Fenced copies stop the pool growing (their cap, or the window full with some of them):
        until a boundary is crossed, the live samples are all there will be."""
        return self.fenced >= self.fence_cap or (self.starved and self.fenced > 0)

    def read(self, target: float, measure=None, minimum: int = 0, limit: int | None = None) -> int:
        """Read stream positions until the live samples' ``measure`` (of a pool index; None:
        their count, and no more positions are read than the count still needs) sums to
        ``target`` and at least ``minimum`` are live, or the pool holds ``limit`` (default: the
        window) positions, or ``fence_cap`` fenced ones; returns the number of live samples."""
        window: int = self.planner.window
        limit = window if limit is None else min(limit, window)
        count = measure is None
        measure = measure or (lambda i: 1)
        total = sum(measure(i) for i in self.live)
        while (
            (total < target or len(self.live) < minimum)
            and len(self.positions) < limit
            and self.fenced < self.fence_cap
        ):
            step = min(limit - len(self.positions), 64)
            if count:
                step = min(step, max(target - total, minimum - len(self.live)))
            new = list(range(self.position, self.position + max(1, int(step))))
            start, before = len(self.positions), len(self.live)
            self.positions += new
            copies, lengths = self.planner.lookup(new, ahead=LOOKUP_AHEAD)
            self.copies += copies
            self.lengths += lengths
            self.position += len(new)
            self._sort(range(start, len(self.positions)))
            total += sum(measure(i) for i in self.live[before:])
        return len(self.live)

    def closing(self) -> list[int]:
        """Live copies, oldest first, of the datasets with fenced copies (their open epoch is all
        read): what `open` forces."""
        return [i for i in self.live if self.copies[i].dataset in self._fence]

    def open(self) -> bool:
        """Let each dataset with fenced copies (its open epoch is all read) into its next epoch,
        for this global batch, and force every live copy of those datasets' open epochs into it
        (`forced`, oldest first); the caller reads on. False (nothing changes) when no dataset is
        fenced. Called when the open epochs cannot make the batch: the forced copies fit it."""
        if not self._fence or self.opened:
            return False
        self.forced = self.closing()
        self.opened = set(self._fence)
        self._classify()
        return True

    def overdue(self, position: int) -> list[int]:
        """Live copies, oldest first, of the datasets whose next epoch began in the stream before
        ``position`` (the global batch's own first stream position): their epoch is late, and
        each copy of it holds a later copy back."""
        late = {d for d, p in self._fence.items() if p < position}
        return [i for i in self.live if self.copies[i].dataset in late] if late else []

    def reach(self, target: float, measure) -> int:
        """How many live samples, oldest first, ``measure`` needs to sum to ``target`` (all if fewer)."""
        total = 0.0
        for k, i in enumerate(self.live):
            total += measure(i)
            if total >= target:
                return k + 1
        return len(self.live)

    def require(self, count: int, batch: int, what: str) -> None:
        """`open` and read on when fewer than ``count`` samples are live, then `PlanError` unless
        at least ``count`` are."""
        if len(self.live) < count and self.open():
            self.read(0, minimum=count)
        if len(self.live) < count:
            raise PlanError(
                f"global batch {batch} needs {count} distinct {what}, but only {len(self.live)} are "
                f"within loader.balance.window={self.planner.window} stream positions without repeating "
                f"one ({self.waiting} later copies wait): a dataset is too small for its share of the "
                f"global batch; lower its weight or the global batch size, or raise balance.window"
            )

    def prioritised(self, state: PlanState) -> list[int]:
        """Live indices with the forced and carried ones first (see `first`), oldest first within
        each (forced before carried)."""
        forced = set(self.forced)
        front = self.forced + [i for i in self.live if i < self.carried and i not in forced]
        self.first = len(front)
        chosen = set(front)
        return front + [i for i in self.live if i not in chosen]
