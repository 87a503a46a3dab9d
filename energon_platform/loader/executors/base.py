"""The executor seam: who makes a rank's micro-batches, and where.

Micro-batch ``c`` is a pure function of ``c`` (`MicroBatchMaker`), so any process on any machine
may make it and get the same bytes. An `Executor` takes a position, makes the micro-batches from
there on with its workers, and hands them back in order; `TrainLoader` talks to nothing else.
Implementations: `in_process` (the training process itself, ``num_workers: 0``), `local` (forked
worker processes) and ``ray_pool`` (a pool of Ray actors, ``loader.executor: ray``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from energon_platform.loader.blend import Segment
    from energon_platform.loader.sample_watch import Stuck


class WorkerLost(RuntimeError):
    """A worker (process or actor) died or became unreachable while micro-batch `c` was due.
    Attributes: worker (str, e.g. "local worker 1 (pid 1234)" / "ray actor 2 on node 10.0.0.3"), c (int).
    ``says_how_to_resume``: the message is the whole line for the user (a cluster lost: its own
    advice); else the loader adds the out-of-memory advice of a dead worker."""

    says_how_to_resume = False

    def __init__(self, worker: str, c: int, reason: str):
        super().__init__(f"{worker} died while micro-batch {c} was due: {reason}")
        self.worker, self.c, self.reason = worker, c, reason


class Executor(abc.ABC):
    """Makes the micro-batches of one rank from a position on and hands them back in order.
    Micro-batch c is a pure function of c (MicroBatchMaker), so any worker may make any c and a
    lost worker's micro-batches are simply made again."""

    #: called with the `Stuck` samples of workers killed for ``loader.sample_timeout``, before the
    #: workers restart (set by the owner; None: nothing to record)
    on_timeout: Callable[[list[Stuck]], None] | None = None

    @abc.abstractmethod
    def start(self, first: int, timed_out: dict) -> None:
        """Begin making micro-batches first, first+1, ... (after construction or after close()).
        timed_out: (dataset, index) -> (key, limit) samples that count as failed (stand-ins)."""

    @abc.abstractmethod
    def publish(self, decided_before: int, segment: Segment | None) -> None:
        """loader.blend_adapt: the blend's weights are decided for global batches < decided_before;
        segment (if not None) is the blend from segment.start on. The executor never requests a
        micro-batch whose global batch (c // accumulation) is >= decided_before before this says
        so; the segments travel to the workers WITH the requests (no file)."""

    @abc.abstractmethod
    def next(self) -> tuple[int, Any]:
        """The next micro-batch (c, batch), in order. DatasetError (bad data) passes through after
        the executor stopped its workers. A lost worker: local processes raise WorkerLost (today's
        LoaderWorkerError rule is kept by TrainLoader on top); the Ray pool replaces the actor and
        makes its micro-batches again, and raises WorkerLost only when no actor is left / the
        cluster does not answer. A sample stuck longer than loader.sample_timeout: the executor
        kills that worker, calls self.on_timeout(stuck_list) (TrainLoader records the samples in
        its timed_out dict and logs), and restarts workers at the position not yet returned."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every worker now; start() may follow (a resume, a restart)."""

    @abc.abstractmethod
    def workers(self) -> list[str]:
        """Ids of the workers alive now (empty for the in-process executor)."""
