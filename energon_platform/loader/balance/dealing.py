"""Dealing a planned global batch to ranks and micro-batches (`deal_plan`), what each rank then
costs (`rank_costs`), and how close any dealing can come (`deal_bound`, `plan_bound`,
`outlier_anchored`)."""

from __future__ import annotations

from collections.abc import Sequence

from energon_platform.loader.balance.packer import deal, deal_shapes
from energon_platform.loader.balance.plans import BatchPlan, MicroBatchCost


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
        return _deal_grouped(plan.grouped, n, order, world_size, accumulation)
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
    g: MicroBatchCost, n: int, order: list[int], world_size: int, accumulation: int
) -> list[list[list[int]]]:
    """`deal_plan` of a grouped plan of ``n`` items (``g``: how its micro-batches cost):
    micro-batches by `deal_shapes`, ranks by `deal` of them."""
    slots = world_size * accumulation
    micro = deal_shapes(g.works, order, slots, n // slots, g.empty, g.cost)
    first = [order[m[0]] for m in micro]
    ranks = deal([g.of(m) for m in micro], first, world_size, accumulation)
    return [[micro[k] for k in share] for share in ranks]


def rank_costs(plan: BatchPlan, dealt: list[list[list[int]]]) -> list[float]:
    """Each rank's cost under ``dealt``: the sum of its items' costs, or of its micro-batches'
    (a `grouped` plan)."""
    if plan.grouped is not None:
        return [sum(plan.grouped.of(m) for m in rank if m) for rank in dealt]
    return [sum(plan.costs[i] for m in rank for i in m) for rank in dealt]


def deal_bound(costs: Sequence[float], world_size: int, fixed: bool) -> float:
    """A lower bound of max/mean over ranks of any dealing of items of these ``costs`` to
    ``world_size`` ranks. Free counts: the costliest item. Fixed counts (``k`` items per rank):
    by pigeonhole, some rank holds ``m`` of the ``(m - 1) x world_size + 1`` costliest items, at
    least the ``m`` cheapest of them, and ``k - m`` more, at least the cheapest others, for each
    ``m`` in 1..k; with ``k = 2`` the exact least (the costliest paired with the cheapest, the
    second with the second cheapest, ...: no pairing does better)."""
    mean = sum(costs) / world_size
    if not mean:
        return 1.0
    if not fixed:
        return max(1.0, max(costs) / mean)
    c = sorted(costs, reverse=True)
    k = len(c) // world_size
    if k == 2:
        return max(1.0, max(c[i] + c[-1 - i] for i in range(world_size)) / mean)
    top = 0.0
    for m in range(1, k + 1):
        last = (m - 1) * world_size  # the (last + 1) costliest items: indices 0..last
        held = sum(c[last - m + 1 : last + 1])
        top = max(top, held + sum(c[len(c) - (k - m) :]) if k > m else held)
    return max(1.0, top / mean)


def plan_bound(plan: BatchPlan, world_size: int, fixed: bool) -> float | None:
    """`deal_bound` of the plan's items: no dealing of this global batch to ``world_size`` ranks
    does better. None for a `grouped` plan (a micro-batch's cost is not the sum of its items')."""
    if plan.grouped is not None:
        return None
    return deal_bound(plan.costs, world_size, fixed)


def outlier_anchored(plan: BatchPlan, world_size: int) -> bool:
    """One item costs more than a rank's fair share of the batch: no dealing reaches 1.0."""
    return max(plan.costs) * world_size > sum(plan.costs)
