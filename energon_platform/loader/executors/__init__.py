"""Executors: who makes a rank's micro-batches (`base.Executor`), built by `build`.

* ``loader.num_workers: 0`` (and no ``loader.sample_timeout``): `InProcessExecutor`, the training
  process makes each micro-batch when it is asked for.
* ``loader.executor: local`` (the default): `LocalExecutor`, forked worker processes.
* ``loader.executor: ray``: ``RayExecutor``, a pool of Ray actors (Ray is imported only then).

Each is a builder registered in `EXECUTORS` under the name ``loader.executor`` gives it.
"""

from __future__ import annotations

from typing import Any

from energon_platform.loader.executors.base import Executor, WorkerLost
from energon_platform.loader.executors.registry import EXECUTORS, register


def build(loader_config: Any, maker_source: Any, num_workers: int | None = None) -> Executor:
    """The executor of ``loader_config`` (a `LoaderConfig`, whose ``executor`` names one of
    `EXECUTORS`) for ``maker_source``: the
    `TrainLoader` whose micro-batches it makes. It reads from it ``maker`` (the
    `MicroBatchMaker`, forked or called as is), ``plan`` (the `RunPlan`), ``rank``,
    ``world_size``, ``state_at(c)`` (the loader state at a position) and ``run_config`` (the
    `RunConfig`), from which a remote worker builds its own maker. ``num_workers``: overrides
    ``loader_config.num_workers``."""
    workers = loader_config.num_workers if num_workers is None else num_workers
    return EXECUTORS[getattr(loader_config, "executor", "local")](
        loader_config, maker_source, workers
    )


@register("local")
def _local(loader_config: Any, maker_source: Any, workers: int) -> Executor:
    """Forked worker processes; none (the training process) for 0 workers and no timeout."""
    # a sample stuck in the training process itself could not be stopped: one worker at least
    processes = max(workers, 1 if loader_config.sample_timeout else 0)
    if processes == 0:
        from energon_platform.loader.executors.in_process import InProcessExecutor

        return InProcessExecutor(maker_source.maker)
    from energon_platform.loader.executors.local import LocalExecutor

    return LocalExecutor(
        maker_source.maker,
        maker_source.plan,
        processes,
        loader_config.prefetch_factor,
        loader_config.sample_timeout,
        rank=maker_source.rank,
    )


@register("ray")
def _ray(loader_config: Any, maker_source: Any, workers: int) -> Executor:
    """A pool of ``workers`` Ray actors."""
    from energon_platform.loader.executors.ray_pool import RayExecutor

    return RayExecutor(loader_config, maker_source, workers)


__all__ = ["EXECUTORS", "Executor", "WorkerLost", "build", "register"]
