"""Batching modes as strategies: how a run's global batches are cut from its schedule.

``loader.balance`` picks one from `BATCHING`:

* ``none``: `StreamBatching`, consecutive stream
  positions (the schedule's pack groups), epoch boundaries guarded;
* ``tokens``, ``attention``, ``encoder``: `
  PlannedBatching`, global batches planned from sample lengths (packed rows, or unpacked samples)
  with that cost model (`COST_MODELS`).

A strategy (`Batching`) owns its config checks, what the schedule and planner are built
with, its part of the fingerprint and of the state (``LoaderState.plan``), the samples consumed
and its log statistics, so the plan, the loader and the trace ask it instead of branching.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from energon_platform.loader.balance.costs import COST_MODELS
from energon_platform.loader.balance.planned import PlannedBatching
from energon_platform.loader.batching.stream import StreamBatching

if TYPE_CHECKING:
    from energon_platform.config import RunConfig
    from energon_platform.loader.datasets import DatasetSet
    from energon_platform.loader.schedule import Schedule
    from task_encoders.base import SeededTaskEncoder


class Batching(Protocol):
    """What a batching mode answers (see `StreamBatching` and `PlannedBatching`)."""

    name: str  #: ``stream`` or ``planned``
    planned: bool  #: global batches come from a planner (``planner`` is set)
    packed_rows: bool  #: fixed rows of ``seq_len`` packed across the global batch
    packed: bool  #: micro-batches hold packed sequences
    sorts_logged_keys: bool  #: logged keys are sorted (their rank order depends on the layout)
    fixed_samples: bool  #: every global batch holds the same number of samples
    epoch_guard: int  #: positions each dataset's epoch boundary is kept from
    schedule_group: int  #: samples per schedule item
    planner: Any  #: the `Planner`, or None
    changes: Any  #: what `resume_from` changed (strings naming the global batch)

    def start(self, schedule: Schedule, plan_state: Any = None) -> None: ...
    def fingerprint(self) -> dict: ...
    def state_at(self, batch: int) -> dict | None: ...
    def resume_from(self, state: Any) -> Any: ...
    def resume_unit(self, plan_state: Any) -> int | None: ...
    def consumed(self, batch: int, schedule: Schedule, names: list[str]) -> dict: ...
    def stats(self, batch: int, world_size: int, accumulation: int) -> dict: ...
    def step_done(self, batch: int) -> None: ...


#: ``loader.balance`` → the batching mode's class (each has ``from_config``)
BATCHING: dict[str, type] = {
    "none": StreamBatching,
    **{mode: PlannedBatching for mode in COST_MODELS},
}


def batching_for(
    cfg: RunConfig, encoder: SeededTaskEncoder, pack_group: int, datasets: DatasetSet, workers: int
) -> Batching:
    """The batching mode ``cfg.loader.balance`` names, built for this run (its checks run here)."""
    return BATCHING[cfg.loader.balance.mode].from_config(
        cfg, encoder, pack_group, datasets, workers
    )


__all__ = [
    "BATCHING",
    "COST_MODELS",
    "Batching",
    "PlannedBatching",
    "StreamBatching",
    "batching_for",
]
