"""A closed pool (unpacked, no budget): the planner's documented choice, not only its invariants.

One dataset smaller than the pool closes it (its next epoch is fenced): its live samples, sorted by
cost, are cut into runs of ``g`` from the costliest down, the cheapest ``N mod g`` left over (they
share the batch that straddles the boundary). The batch takes the run holding the oldest sample,
or, when the oldest is in that remainder, the *cheapest* run. Taking the costliest there breaks no
invariant (every sample once, the oldest placed within the pool's wait); only balance, which is why
the choice itself is asserted here.
"""

from __future__ import annotations

import random

import pytest

from energon_platform.loader.balance.planner import Planner


def closed_pool_planner(costs: list[int], g: int, seed: int) -> tuple[Planner, list[int]]:
    """A planner over one dataset whose samples cost ``costs`` (index = sample), each epoch a
    shuffled order of them; returns it and epoch 0's order (``order[0]`` is the oldest sample)."""
    n = len(costs)
    order = list(range(n))
    random.Random(seed).shuffle(order)

    def samples(positions):
        return [(0, p // n, order[p % n]) for p in positions]

    def lengths(positions):
        return [(costs[order[p % n]], costs[order[p % n]]) for p in positions]

    return Planner(lengths, float, g, window=8 * n, samples=samples), order


def batch_costs(planner: Planner, batch: int, costs: list[int], order: list[int]) -> list[int]:
    n = len(costs)
    return sorted(costs[order[p % n]] for item in planner.plan(batch).items for p in item)


@pytest.mark.parametrize("n,g,seed", [(10, 4, 1), (13, 5, 2), (23, 6, 3)])
def test_the_oldest_in_the_remainder_takes_the_cheapest_run_not_the_costliest(n, g, seed):
    costs = random.Random(seed).sample(range(10, 10_000), n)
    planner, order = closed_pool_planner(costs, g, seed)
    ranked = sorted(costs)
    remainder = n % g
    assert remainder  # the case: some samples are left below the cheapest run
    # make the oldest sample one of the remainder: swap its cost with the cheapest one's
    oldest, cheapest = order[0], costs.index(ranked[0])
    costs[oldest], costs[cheapest] = costs[cheapest], costs[oldest]
    runs = [ranked[k - g : k] for k in range(n, g - 1, -g)]  # costliest first
    assert batch_costs(planner, 0, costs, order) == runs[-1] != runs[0]
    # and the runs go on as they were cut: the next batch is the next cheapest one
    assert batch_costs(planner, 1, costs, order) == runs[-2]


def test_the_oldest_in_a_run_takes_that_run():
    n, g = 10, 4
    costs = random.Random(5).sample(range(10, 10_000), n)
    planner, order = closed_pool_planner(costs, g, 5)
    ranked = sorted(costs)
    runs = [ranked[k - g : k] for k in range(n, g - 1, -g)]  # costliest first
    # the oldest sample costs the median of the costliest run
    oldest, target = order[0], costs.index(runs[0][1])
    costs[oldest], costs[target] = costs[target], costs[oldest]
    assert batch_costs(planner, 0, costs, order) == runs[0]
