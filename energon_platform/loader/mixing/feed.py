"""`WeightsFeed`: the blend's new segments, from the training process to its loader workers.

The workers are forked with the blend decided so far and make micro-batches up to
``prefetch_factor`` ahead; the segments the adapter decides later reach them through a file the
training process appends to (one JSON line per update: the segment, if the weights changed, and
the first global batch whose weights are not decided yet). A worker about to make a micro-batch of
a global batch past what it knows reads the new lines, and waits for them when they are not there
yet (with ``lag`` at least the prefetch depth it never waits). Prefetching a shard read for such a
batch is skipped rather than waited for. The file lives in a temporary folder removed at `close`
(or when the feed is garbage-collected).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from energon_platform.loader.blend import Segment

#: seconds between two looks at the file of a worker that waits for weights
POLL = 0.002


class FeedClosed(RuntimeError):
    """The loader closed while a worker waited for weights (the worker is being stopped)."""


class WeightsFeed:
    """The writing side, in the training process."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="energon-platform-weights-"))
        self.path = self.folder / "weights.jsonl"
        self.path.touch()
        #: the workers started since the last `stop_workers` (a reader stops at a later mark)
        self.generation = 0
        self._removed = weakref.finalize(self, shutil.rmtree, self.folder, True)

    def publish(self, decided_before: int, segment: Segment | None) -> None:
        """Tell the workers: weights are decided before global batch ``decided_before``;
        ``segment`` (if not None) is the blend from its start on."""
        line = {"before": decided_before, "segment": None if segment is None else segment.to_json()}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def reader(self, maker: Any, plan: Any, decided_before: int) -> FeedReader:
        """The reader the next workers fork with."""
        return FeedReader(self.path, maker, plan, decided_before, self.generation)

    def stop_workers(self) -> None:
        """Wake the workers that wait for weights so they stop (they are being shut down)."""
        with open(self.path, "a") as f:
            f.write(json.dumps({"stop": self.generation}) + "\n")
        self.generation += 1

    def close(self) -> None:
        """Remove the file (the workers are stopped)."""
        self._removed()


class FeedReader:
    """The reading side: ``reader(batch, wait)`` in a worker before it uses the schedule for
    global ``batch``; True once the weights of ``batch`` are known (False: not yet, and ``wait``
    was False). In the process that made it (the training process) it is always True: that
    process's plan is the one the adapter extends."""

    def __init__(self, path: Path, maker: Any, plan: Any, decided_before: int, generation: int):
        self.path, self.maker, self.plan = path, maker, plan
        self.before, self.offset, self.owner = decided_before, 0, os.getpid()
        self.generation = generation

    def __call__(self, batch: int, wait: bool = True) -> bool:
        if os.getpid() == self.owner:
            return True
        while batch >= self.before:
            self._read()
            if batch < self.before:
                break
            if not wait:
                return False
            time.sleep(POLL)
        return True

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            raise FeedClosed("the loader closed") from None
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        new = []
        for line in whole.splitlines():
            record = json.loads(line)
            if "stop" in record:
                if record["stop"] >= self.generation:
                    raise FeedClosed("the loader stopped its workers")
                continue
            self.before = max(self.before, record["before"])
            seg = record["segment"]
            last = new[-1] if new else self.plan.blend.segments[-1]
            if seg is not None and seg["start"] > last.start:
                new.append(Segment(seg["start"], tuple(seg["weights"])))
        if new:
            self.plan.extend_blend(new)
            self.maker.schedule = self.plan.schedule
