"""`InProcessExecutor`: the training process makes each micro-batch when it is asked for.

``loader.num_workers: 0`` without ``loader.sample_timeout`` (a sample stuck in the training
process itself could not be stopped; with a timeout `build` gives one worker process instead).
The maker is the training process's own, so the blend's new segments are in its schedule as soon
as `TrainLoader` extends its plan: `publish` has nothing to send.
"""

from __future__ import annotations

from typing import Any

from energon_platform.loader.allocator import keep_freed_memory
from energon_platform.loader.batches import LOOKAHEAD, MicroBatchMaker
from energon_platform.loader.executors.base import Executor


class InProcessExecutor(Executor):
    """Micro-batch ``c`` made by ``maker(c)`` in this process, on `next`; on object storage the
    reads of the next `LOOKAHEAD` micro-batches start ahead (their bytes only)."""

    def __init__(self, maker: MicroBatchMaker):
        self.maker = maker
        self._next: int | None = None
        self._remote = any(s.remote for s in maker.sources)

    def start(self, first: int, timed_out: dict) -> None:
        keep_freed_memory()  # this process makes the batches: its allocator keeps freed memory
        self.maker.timed_out, self.maker.watch, self.maker.watch_row = timed_out, None, 0
        self._next = first
        for k in range(LOOKAHEAD if self._remote else 0):
            self.maker.prefetch(first + k)

    def publish(self, decided_before: int, segment: Any) -> None:
        """Nothing to send: the maker reads the plan `TrainLoader` extended."""

    def next(self) -> tuple[int, Any]:
        if self._next is None:
            raise RuntimeError("InProcessExecutor.next() before start()")
        c = self._next
        if self._remote:
            self.maker.prefetch(c + LOOKAHEAD)
        batch = self.maker(c)
        self._next = c + 1
        return c, batch

    def close(self) -> None:
        self._next = None

    def workers(self) -> list[str]:
        return []
