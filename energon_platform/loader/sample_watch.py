"""Which sample each loader worker is on, and since when: the watch behind ``loader.sample_timeout``.

A `SampleWatch` is a small shared-memory table with one row per DataLoader worker, made in
the main process before the workers are forked (they inherit it). A worker writes its row when it
starts reading a sample and clears it when the sample is encoded (or has failed); the main process,
while it waits for a micro-batch, reads the rows and finds the workers that have been on one
sample longer than the limit (`SampleWatch.stuck`). Rows hold schedule positions, not keys:
a read that never returns never produced its key.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: a row: start of the current sample (``time.monotonic_ns``; 0: none), micro-batch, dataset, epoch, index
_ROW = 5


@dataclass(frozen=True)
class Stuck:
    """A worker that has been on one sample for ``seconds``."""

    worker: int
    micro_batch: int
    dataset: int
    epoch: int
    index: int
    seconds: float


class SampleTimeoutError(Exception):
    """A sample whose read and encode took longer than ``loader.sample_timeout`` (its worker was
    replaced); reported to the encoder's skip policy like any failed sample."""


class SampleWatch:
    """One row per worker (see module doc). Create it before the workers fork; each worker writes
    only its own row (`on`), the main process only reads (`stuck`)."""

    def __init__(self, workers: int):
        self.workers = workers
        # zeros: idle
        self._rows = multiprocessing.get_context("fork").RawArray("q", workers * _ROW)

    @contextmanager
    def on(
        self, worker: int, micro_batch: int, dataset: int, epoch: int, index: int
    ) -> Iterator[None]:
        """Mark ``worker`` busy with one sample for the duration of the ``with`` block."""
        base = worker * _ROW
        # where first, then since:
        self._rows[base + 1 : base + _ROW] = [
            micro_batch,
            dataset,
            epoch,
            index,
        ]
        self._rows[base] = time.monotonic_ns()  # a reader that sees the start sees where it is
        try:
            yield
        finally:
            self._rows[base] = 0

    def stuck(self, limit: float) -> list[Stuck]:
        """The workers on one sample for longer than ``limit`` seconds (a consistent read of each row:
        a row that changed while read is skipped, its worker has moved on)."""
        now = time.monotonic_ns()
        out = []
        for w in range(self.workers):
            base = w * _ROW
            since, *where = self._rows[base : base + _ROW]
            if since and now - since > limit * 1e9 and self._rows[base] == since:
                out.append(Stuck(w, *where, seconds=(now - since) / 1e9))
        return out
