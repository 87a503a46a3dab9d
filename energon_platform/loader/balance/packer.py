"""Pure functions of the global packer and balancer: costs, rows, dealing.

Nothing here reads data: inputs are per-sample lengths (from the length index, see
`lengths`) and stream positions; outputs are lists of positions.
Every choice is deterministic (ties broken by position, row id, rank id), so the same inputs give
the same rows on every process, layout and resume.

* `sample_cost`: the cost model of ``loader.balance`` (``tokens``: ``L``; ``attention``:
  ``L² + c·L``, self-attention plus a linear term of weight ``c``).
* `pack_rows`: a pool of documents → exactly ``num_rows`` rows of at most ``capacity``
  positions, longest first; what does not fit is carried (returned), never dropped.
* `fill_budget`: a pool of samples → the samples of one global batch within a cost budget
  (unpacked models), the rest carried.
* `deal`: items → ``parts`` groups of equal count (rows) or free count (samples) with
  balanced cost (longest processing time first).
* `deal_shapes`: the same with each group costed as a whole (a micro-batch padded to its
  longest sample, a tower's cost per call), not as the sum of its items'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def sample_cost(work_length: int, mode: str, linear: float) -> float:
    """Cost of one document of ``work_length`` positions under ``mode`` (not ``encoder``/``none``)."""
    if mode == "attention":
        return float(work_length) * work_length + linear * work_length
    return float(work_length)


def pack_rows(
    lengths: Sequence[int],
    costs: Sequence[float],
    order: Sequence[int],
    num_rows: int,
    capacity: int,
    balance: bool,
    first: int = 0,
) -> tuple[list[list[int]], list[int]]:
    """Place pool items into ``num_rows`` rows of ``capacity`` positions.

    ``order``: a tiebreak per item (its stream position). The first ``first`` items (carried from
    the previous batch) are placed before the others, so none waits more than a batch or two;
    within each group items are placed longest first (ties: lower ``order``) into, with
    ``balance``, the feasible row of least cost so far (rows come out of similar cost: longest
    processing time with a capacity), else the feasible row with the least room left (best fit).
    Returns ``(rows, carried)``: rows as lists of item indices in placement order, and the items
    that fit nowhere, in ``order`` order. Every item is in exactly one of the two. An item longer
    than ``capacity`` raises ``ValueError`` (the encoder's truncation makes that impossible).
    """
    rows: list[list[int]] = [[] for _ in range(num_rows)]
    room = [capacity] * num_rows
    cost = [0.0] * num_rows
    carried = []
    for i in sorted(range(len(lengths)), key=lambda i: (i >= first, -lengths[i], order[i])):
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"a document of {n} positions does not fit a row of {capacity}")
        best = -1
        for r in range(num_rows):
            if room[r] < n:
                continue
            if best < 0 or (cost[r] < cost[best] if balance else room[r] < room[best]):
                best = r
        if best < 0:
            carried.append(i)
            continue
        rows[best].append(i)
        room[best] -= n
        cost[best] += costs[i]
    carried.sort(key=lambda i: order[i])
    return rows, carried


def fill_budget(costs: Sequence[float], budget: float, minimum: int) -> tuple[list[int], list[int]]:
    """The pool items (in pool order) of one global batch under a cost ``budget``: each item is
    taken if it still fits the budget (a later, smaller one may fit where an earlier did not);
    the first ``minimum`` items are taken regardless (every micro-batch of every rank gets one).
    Returns ``(taken, carried)`` as index lists in pool order."""
    taken, carried, total = [], [], 0.0
    for i, c in enumerate(costs):
        if len(taken) < minimum or total + c <= budget:
            taken.append(i)
            total += c
        else:
            carried.append(i)
    return taken, carried


def deal(
    costs: Sequence[float], order: Sequence[int], parts: int, per_part: int | None
) -> list[list[int]]:
    """Deal items to ``parts`` groups, largest cost first, each to the group of least cost so far
    (ties: lower group id) among those with fewer than ``per_part`` items (``None``: no limit on
    counts, but every group gets at least one item when there are enough). Groups list item
    indices in ``order`` order. With ``per_part``, ``len(costs)`` must equal ``parts * per_part``."""
    if per_part is not None and len(costs) != parts * per_part:
        raise ValueError(f"{len(costs)} items cannot be dealt as {parts} x {per_part}")
    groups: list[list[int]] = [[] for _ in range(parts)]
    load = [0.0] * parts
    ranked = sorted(range(len(costs)), key=lambda i: (-costs[i], order[i]))
    empty = parts if per_part is None else 0  # groups still empty: the last items go to them first
    for k, i in enumerate(ranked):
        left = len(ranked) - k
        best = -1
        for g in range(parts):
            if per_part is not None and len(groups[g]) >= per_part:
                continue
            if per_part is None and left <= empty and groups[g]:
                continue  # as many items left as empty groups: fill those
            if best < 0 or load[g] < load[best]:
                best = g
        if per_part is None and not groups[best]:
            empty -= 1
        groups[best].append(i)
        load[best] += costs[i]
    for g in groups:
        g.sort(key=lambda i: order[i])
    return groups


def deal_shapes(
    works: Sequence, order: Sequence[int], parts: int, per_part: int, empty: Any, cost: Any
) -> list[list[int]]:
    """Deal items to ``parts`` groups of ``per_part`` items, each group costed as a whole:
    ``cost(shape)`` of its shape, ``empty.grow(work)`` grown by each item's work. Items go
    dearest alone first (ties: lower ``order``), each to the group whose cost *with it* is least
    (ties: lower group id) among those with room: `deal`'s longest processing time first, where
    an item may cost a group less than alone (a second image in a micro-batch that runs the
    vision tower anyway). Groups list item indices in ``order`` order; ``len(works)`` must
    equal ``parts * per_part``."""
    if len(works) != parts * per_part:
        raise ValueError(f"{len(works)} items cannot be dealt as {parts} x {per_part}")
    groups: list[list[int]] = [[] for _ in range(parts)]
    shapes = [empty] * parts
    alone = [cost(empty.grow(w)) for w in works]
    for i in sorted(range(len(works)), key=lambda i: (-alone[i], order[i])):
        best, best_cost, tried_empty = -1, 0.0, False
        for g in range(parts):
            if len(groups[g]) >= per_part:
                continue
            if not groups[g]:  # every empty group is the same: try the first only
                if tried_empty:
                    continue
                tried_empty = True
            c = cost(shapes[g].grow(works[i]))
            if best < 0 or c < best_cost:
                best, best_cost = g, c
        groups[best].append(i)
        shapes[best] = shapes[best].grow(works[i])
    for g in groups:
        g.sort(key=lambda i: order[i])
    return groups


def pack_led_rows(
    lengths: Sequence[int],
    costs: Sequence[float],
    order: Sequence[int],
    num_rows: int,
    capacity: int,
    first: int = 0,
    leads: int = 0,
) -> tuple[list[list[int]], list[int]]:
    """Rows of like cost: ``num_rows`` *leads*, the pool items nearest in length around the oldest
    item (least ``order``: it is always placed, so nothing waits for ever), one per row; then the
    other items no longer than the shortest lead (or than a quarter row, whichever is more),
    carried ones first, longest first, each into the feasible row of least cost. A batch's long
    documents are thus all of one size and one per row, so every row costs about the same and
    any dealing to any number of ranks is balanced. ``leads``: the first ``leads`` items (at most
    ``num_rows``) lead rows whatever their length (the end of an epoch), the other leads nearest in
    length to their median; of more than ``num_rows``, the longest lead, the rest fill first.
    Returns ``(rows, carried)`` as `pack_rows` does; needs at least ``num_rows`` items."""
    n = len(lengths)
    if n < num_rows:
        raise ValueError(f"{n} items cannot lead {num_rows} rows")
    # numpy for the sorts and the row search (a few thousand items, a batch's rows); the result
    # is exactly that of the plain loops it replaced: stable sorts on the same keys, the first
    # least-cost feasible row, the same float sums
    length = np.fromiter(lengths, dtype=np.int64, count=n)
    age = np.fromiter(order, dtype=np.int64, count=n)
    ranked = np.lexsort((age, length))  # by length, then age
    if leads >= num_rows:  # the longest of them lead: the others are no longer than any lead
        chosen = np.lexsort((age[:leads], -length[:leads]))[:num_rows]
        led = chosen[np.lexsort((age[chosen], length[chosen]))].tolist()  # shortest first
    elif leads:
        centre = int(np.sort(length[:leads])[leads // 2])
        rest = leads + np.lexsort((age[leads:], np.abs(length[leads:] - centre)))
        chosen = np.concatenate([np.arange(leads), rest[: num_rows - leads]])
        led = chosen[np.lexsort((age[chosen], length[chosen]))].tolist()  # shortest first
    else:
        anchor = int(np.flatnonzero(ranked == int(age.argmin()))[0])
        lo, hi = max(0, anchor - num_rows + 1), min(anchor, n - num_rows)
        spans = length[ranked[lo + num_rows - 1 : hi + num_rows]] - length[ranked[lo : hi + 1]]
        led = ranked[lo + int(spans.argmin()) :][:num_rows].tolist()  # the narrowest, first
    limit = max(int(length[led[0]]), capacity // 4)
    rows = [[i] for i in led]
    room = capacity - length[led]
    cost = np.array([float(costs[i]) for i in led], dtype=np.float64)
    placed = np.zeros(n, dtype=bool)
    placed[led] = True
    carried: list[int] = []
    most_room = int(room.max())  # an item longer than this fits no row: carried without a search
    fits = min(limit, most_room)
    tier = (np.arange(n) >= leads).astype(np.int64) + (np.arange(n) >= first)
    later = np.lexsort((age, -length, tier))  # forced, then carried, first; longest first
    for i, size in zip(later.tolist(), length[later].tolist()):
        if placed[i]:
            continue
        if size > fits:
            carried.append(i)
            continue
        feasible = (room >= size).nonzero()[0]
        best = int(feasible[cost[feasible].argmin()])
        rows[best].append(i)
        had_most = room[best] == most_room
        room[best] -= size
        if had_most:
            most_room = int(room.max())
            fits = min(limit, most_room)
        cost[best] += costs[i]
    carried.sort(key=lambda i: order[i])
    return rows, carried
