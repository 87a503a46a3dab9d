"""`BlendAdapter`: the per-dataset losses of the steps in, new blend segments out.

The trainer reports each global step's per-sample losses (`report`), on every data-parallel rank.
The adapter sums them per dataset, all-reduced over the ranks (one small ``all_reduce`` a step), so
every rank holds the same sums whatever the world size. After step ``s`` of an update (every
``every`` steps from the step it started at), the mean loss of each dataset since the last update,
rounded to ``resolution``, goes to the method; its weights, each at least ``floor`` and rounded to
multiples of 1/`GRID`, become the blend from global batch ``s + 1 + lag`` on: from the unit that
batch starts reading (``unit_at``; with ``loader.balance``, where the planner's pool starts
reading for it, so the batches planned before keep their samples: `RunPlan.weights_from`).
Before that batch the weights in force stay, so the loader's workers, ``lag`` batches ahead at
most, never need weights that are not decided yet (`decided_before`).

Why rounded: ranks of another world size compute per-sample losses in other batch shapes, which
differ in the last bits; rounded inputs and weights on a grid make the decisions the same, so a
run resumed on another world size draws the same samples. The state (`state_dict`) is plain JSON:
the method's state, the sums since the last update, the next step expected.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from energon_platform.loader.blend import Segment
from energon_platform.loader.mixing.method import make_method
from energon_platform.loader.state import StateMismatchError

#: weights are multiples of 1/GRID (a blend period of at most GRID units)
GRID = 1000

#: the settings a saved adapter state must share with the run's config to continue it
SETTINGS = ("method", "every", "lag", "floor", "resolution", "options")


class AdaptError(RuntimeError):
    """A report out of order or missing, or a saved mixer this run cannot continue; one line."""


def floor_problem(floor: float, datasets: int) -> str | None:
    """Why ``floor`` cannot be the least weight of each of ``datasets`` datasets, or None.

    The rule: the floors together are at most the whole blend, ``floor <= 1/datasets``, to within
    half a grid step (so ``0.3333`` serves three datasets as a third; `grid_floor` then keeps each
    floor on the grid inside the blend, ``0.333``)."""
    if floor * GRID <= GRID / datasets + 0.5:
        return None
    return (
        f"{floor} for {datasets} datasets: the floors alone exceed the whole blend "
        f"({datasets} x {floor} = {datasets * floor:.6g}; at most 1/{datasets} = {1 / datasets:.6g})"
    )


def grid_floor(floor: float, datasets: int) -> int:
    """The least weight of each dataset in units of 1/`GRID`: ``floor`` rounded up to the grid,
    but no more than an equal share of the grid (a floor at 1/``datasets`` that the grid cannot
    hold for every dataset)."""
    return min(math.ceil(floor * GRID - 1e-9), GRID // datasets)


def on_grid(weights: Sequence[float], floor: float) -> tuple[str, ...]:
    """``weights`` normalised to multiples of 1/`GRID`, each at least ``floor`` (rounded up to the
    grid, at most an equal share: `grid_floor`), by largest remainder (ties to the first
    dataset): fractions as strings."""
    k = len(weights)
    least = grid_floor(floor, k)
    rest = GRID - k * least
    clipped = [max(0.0, float(w)) for w in weights]
    total = sum(clipped) or 1.0
    shares = [w / total * rest if sum(clipped) else rest / k for w in clipped]
    counts = [int(s) for s in shares]
    order = sorted(range(k), key=lambda d: (-(shares[d] - counts[d]), d))
    for d in order[: rest - sum(counts)]:
        counts[d] += 1
    return tuple(str(Fraction(least + c, GRID)) for c in counts)


class BlendAdapter:
    """The mixer of one run (see the module doc).

    Args:
        config: ``loader.blend_adapt`` (`BlendAdaptConfig`).
        datasets: the blend's dataset names, in schedule order.
        weights: the weights in force at ``start`` (fractions as strings).
        start: the first global step the adapter sees (0, or the batch it was turned on at).
        unit_at: where weights that apply from global batch ``b`` start, ``unit_at(b)``
            (`RunPlan.weights_from`), or blend units per global batch (``b x unit_at``).
    """

    def __init__(
        self,
        config: Any,
        datasets: Sequence[str],
        weights: Sequence[str],
        start: int,
        unit_at: int | Callable[[int], int],
    ):
        self.config, self.datasets = config, list(datasets)
        problem = floor_problem(config.floor, len(self.datasets))
        if problem is not None:
            raise AdaptError(f"loader.blend_adapt.floor: {problem}")
        start_weights = [float(Fraction(w)) for w in weights]
        try:
            self.method = make_method(config.method, self.datasets, start_weights, config.options)
        except ValueError as e:
            raise AdaptError(f"loader.blend_adapt: {e}") from None
        self.start, self.next_step = start, start
        self.unit_at = (lambda b, n=unit_at: b * n) if isinstance(unit_at, int) else unit_at
        self.sums, self.counts = [0.0] * len(self.datasets), [0] * len(self.datasets)

    # --- the cadence -------------------------------------------------------------------------

    @property
    def next_update(self) -> int:
        """The step whose report makes the next update."""
        done = (self.next_step - self.start) // self.config.every
        return self.start + (done + 1) * self.config.every - 1

    def decided_before(self) -> int:
        """Global batches before this one have their weights decided (the next update's weights
        apply from its step + 1 + lag)."""
        return self.next_update + 1 + self.config.lag

    def check_batch(self, batch: int) -> None:
        """`AdaptError` naming the step whose losses are missing when global batch ``batch``
        needs weights not decided yet."""
        if batch >= self.decided_before():
            raise AdaptError(
                f"loader.blend_adapt: global batch {batch} needs the weights decided after step "
                f"{self.next_update}, but the losses of step {self.next_step} were not reported: "
                f"call loader.report_losses(step, keys, losses) after every step, on every rank"
            )

    # --- reports -----------------------------------------------------------------------------

    def report(
        self, step: int, datasets: Sequence[int], losses: Sequence[float], reduce=None
    ) -> Segment | None:
        """Take step ``step``'s per-sample ``losses`` of this rank (``datasets``: each sample's
        dataset number; a loss that is not finite, NaN for a sample without targets, is left out).
        ``reduce(values)`` sums a list of floats over the data-parallel ranks (None: one rank).
        Returns the new segment when this step makes an update that changes the weights, else
        None."""
        if step != self.next_step:
            raise AdaptError(
                f"loader.blend_adapt: losses reported for step {step}, but step {self.next_step} "
                f"is due (report every step once, in order, before its checkpoint is saved)"
            )
        k = len(self.datasets)
        local = [0.0] * (2 * k)
        for d, loss in zip(datasets, losses):
            if math.isfinite(loss):  # NaN: a sample without targets (it says nothing)
                local[d] += float(loss)
                local[k + d] += 1.0
        total = reduce(local) if reduce is not None else local
        for d in range(k):
            self.sums[d] += total[d]
            self.counts[d] += round(total[k + d])
        update = step == self.next_update
        self.next_step += 1
        if not update:
            return None
        res = self.config.resolution
        means = [round(s / c / res) * res if c else None for s, c in zip(self.sums, self.counts)]
        counts = list(self.counts)
        self.sums, self.counts = [0.0] * k, [0] * k
        method = self.method
        decided = method.update(means, counts) if method.counted else method.update(means)
        weights = on_grid(decided, self.config.floor)
        return Segment(self.unit_at(step + 1 + self.config.lag), weights)

    # --- state -------------------------------------------------------------------------------

    def settings(self) -> dict:
        c = self.config
        return {
            "method": c.method,
            "every": c.every,
            "lag": c.lag,
            "floor": c.floor,
            "resolution": c.resolution,
            "options": dict(c.options),
        }

    def state_dict(self) -> dict:
        return {
            **self.settings(),
            "datasets": list(self.datasets),
            "start": self.start,
            "next_step": self.next_step,
            "sums": list(self.sums),
            "counts": list(self.counts),
            "mixer": self.method.state_dict(),
        }

    def load_state_dict(self, state: dict, resume_batch: int) -> None:
        """Continue a saved mixer; `StateMismatchError` (one line) for another method, other
        settings or another blend, and for a state saved before its last step's losses were
        reported."""
        ours = self.settings()
        for name in SETTINGS:
            if state.get(name) != ours[name]:
                raise StateMismatchError(
                    f"loader.blend_adapt.{name}: the saved mixer has {state.get(name)!r}, the config "
                    f"{ours[name]!r}; resume with the saved value, or set loader.blend_adapt to null "
                    f"to continue with fixed weights"
                )
        if state.get("datasets") != self.datasets:
            raise StateMismatchError(
                f"loader.blend_adapt: the saved mixer is over datasets {state.get('datasets')}, "
                f"this blend has {self.datasets}; a mixer continues over the same blend only"
            )
        if state["next_step"] != resume_batch:
            raise StateMismatchError(
                f"loader.blend_adapt: the state was saved at global batch {resume_batch} with the "
                f"losses reported through step {state['next_step'] - 1}; report a step's losses "
                f"before saving its checkpoint"
            )
        self.start, self.next_step = int(state["start"]), int(state["next_step"])
        self.sums = [float(x) for x in state["sums"]]
        self.counts = [int(x) for x in state["counts"]]
        self.method.load_state_dict(state["mixer"])
