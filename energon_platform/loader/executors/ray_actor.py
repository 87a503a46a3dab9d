"""The body of one Ray actor of the pool (`ray_pool`): a rank's maker on some node of the cluster.

`MakerActor` is a plain class; `ray_pool` makes it a Ray actor (so this module imports no Ray
and can be read and tested without it). At start it applies the settings of a local worker
process (`keep_freed_memory`, one intra-op thread), builds the maker from its `MakerSpec`
(`build_maker`, which checks the node reads the trainer's data, index and encoder) and keeps what
went wrong for `ready` to report (an actor whose constructor raises only says it died). `make`
runs one request at a time; with ``loader.sample_timeout`` the actor marks the sample it is on in a
one-row `SampleWatch` that `stuck` reads from a second thread while `make` runs.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from energon_platform.loader.allocator import keep_freed_memory
from energon_platform.loader.blend import Segment
from energon_platform.loader.executors.maker_spec import MakerSpec, build_maker, node_name
from energon_platform.loader.sample_watch import SampleWatch, Stuck


class MakerActor:
    """One worker of the pool (module doc). ``index``: its slot in the pool, for messages."""

    def __init__(self, spec: MakerSpec, index: int, watched: bool):
        keep_freed_memory()
        torch.set_num_threads(1)
        self.index, self.problem = index, None
        self.maker = self.plan = None
        try:
            self.maker, self.plan = build_maker(spec, f"ray actor {index}")
        except Exception as e:  # reported by `ready`: the trainer stops in one line
            self.problem = (str(e).splitlines() or [type(e).__name__])[0]
            return
        self.watch = SampleWatch(1) if watched else None
        self.maker.watch, self.maker.watch_row = self.watch, 0

    def ready(self) -> dict:
        """``{"pid", "node", "problem"}``: this actor's process and node, and why it cannot make
        micro-batches (None: it can)."""
        return {"pid": os.getpid(), "node": node_name(), "problem": self.problem}

    def make(self, c: int, segments: list[dict], timed_out: dict) -> Any:
        """Micro-batch ``c``, after taking the blend segments decided since the last request
        (``loader.blend_adapt``) and the samples that timed out since (failed from now on)."""
        maker, plan = self.maker, self.plan
        if maker is None or plan is None:  # `ready` reported why: the pool sends it no request
            raise RuntimeError(f"ray actor {self.index} cannot make micro-batches: {self.problem}")
        last = plan.blend.segments[-1].start
        new = [Segment(s["start"], tuple(s["weights"])) for s in segments if s["start"] > last]
        if new:
            plan.extend_blend(new)
            maker.schedule = plan.schedule
        maker.timed_out.update(timed_out)
        return maker(c)

    def stuck(self, limit: float) -> list[Stuck]:
        """The sample this actor has been on for longer than ``limit`` seconds (at most one)."""
        return [] if self.watch is None else self.watch.stuck(limit)
