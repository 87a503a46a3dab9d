"""The ``loader:`` entries that apply from a global step on, `BlendStep` (``blend_schedule``) and
`ExcludeRule` (``exclude``), the blend weights' bounds (`weight_problem`) and the loader's limits.

Apart from `energon_platform.loader.settings` (which composes the groups of the mixing, balance
and executors) so that the modules reading these (exclusions, metadataset weights) import no group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from task_encoders.config_parser import At, require

#: The largest ``blend_schedule`` step (no run takes this many; the schedule's positions stay exact).
MAX_STEP = 10**12
#: The most items a global batch, a micro-batch or a pack group may hold (a larger one would not
#: fit in memory: its positions alone are arrays of that length per step).
MAX_BATCH = 2**20
#: The most loader worker processes per rank, and the most batches each may prefetch.
MAX_WORKERS = 1024
#: The most context-parallel ranks ``loader.context_parallel`` may name.
MAX_CONTEXT_PARALLEL = 1024
#: Bounds of a non-zero blend weight (metadataset ``weight`` / ``repetitions``, ``blend_schedule``):
#: within them every weight is an exact fraction of small integers and the periods stay computable.
LOWEST_WEIGHT, HIGHEST_WEIGHT = 1e-9, 1e9


def weight_problem(value) -> str | None:
    """Why ``value`` is not a usable blend weight (``"is not a number"``, ``"is out of range ..."``),
    or None."""
    expected = f"expected 0 or a number in [{LOWEST_WEIGHT:g}, {HIGHEST_WEIGHT:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{value!r} is not a number ({expected})"
    if (
        not math.isfinite(value)
        or value < 0
        or (value != 0 and not LOWEST_WEIGHT <= value <= HIGHEST_WEIGHT)
    ):
        return f"{value!r} is out of range ({expected})"
    return None


@dataclass(frozen=True)
class BlendStep:
    """One entry of ``loader.blend_schedule``: from global step ``step`` on, the blend uses
    ``weights`` (dataset name → weight; names as ``energon-platform`` logs them, datasets not
    named get weight 0)."""

    step: int
    """The global step from which on ``weights`` apply."""
    weights: dict[str, float]
    """Dataset name → weight (names as ``energon-platform`` logs them; datasets not named get 0)."""

    def check(self, at: At) -> None:
        require(
            0 <= self.step <= MAX_STEP,
            at.child("step"),
            f"got {self.step}",
            f"a step in [0, {MAX_STEP}]",
        )
        for name, w in self.weights.items():
            problem = weight_problem(w)
            if problem:
                raise at.child("weights").child(name).error(problem)
        require(
            sum(self.weights.values()) > 0,
            at.child("weights"),
            f"got {self.weights}",
            "weights >= 0 with a positive sum",
        )


@dataclass(frozen=True)
class ExcludeRule:
    """One entry of ``loader.exclude``: from global step ``step`` on (as ``blend_schedule``: the
    steps after the first ``step``), skip ``keys`` (sample keys as logged, ``fnmatch`` patterns
    allowed), every sample of ``shards`` (``train/shard-000003.tar``; in a blend
    ``NAME:train/shard-000003.tar``; patterns allowed) and whole ``datasets`` of a blend (their
    weight becomes 0). Skipped samples are replaced by keyed stand-ins
    (`exclusions`); the rules are kept in the loader state."""

    step: int
    """The global step from which on the rule skips (the steps after the first ``step``)."""
    keys: tuple[str, ...] = ()
    """Sample keys to skip, as logged; ``fnmatch`` patterns allowed."""
    shards: tuple[str, ...] = ()
    """Shards whose every sample is skipped (``train/shard-000003.tar``; in a blend
    ``NAME:train/shard-000003.tar``); patterns allowed."""
    datasets: tuple[str, ...] = ()
    """Whole datasets of a blend to skip (their weight becomes 0)."""

    def check(self, at: At) -> None:
        require(
            0 <= self.step <= MAX_STEP,
            at.child("step"),
            f"got {self.step}",
            f"a step in [0, {MAX_STEP}]",
        )
        require(
            bool(self.keys or self.shards or self.datasets),
            at,
            "nothing listed",
            "at least one of keys, shards, datasets",
        )
