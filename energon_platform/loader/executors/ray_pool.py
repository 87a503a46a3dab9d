"""A pool of Ray actors that make a rank's micro-batches (``loader.executor: ray``).

``loader.num_workers`` actors, each with Ray's options ``loader.ray_actor_options`` (default one
CPU), hold the rank's maker, built from a `MakerSpec` on their node (`ray_actor`). Micro-batch
``c`` goes to actor ``(c - first) % n``; at most ``prefetch_factor`` requests per actor are in
flight, and results come back through Ray's object store, handed out in the order of ``c``. With
``loader.blend_adapt`` no request runs ahead of the weights decided (`publish`): the segments
travel with the requests.

Faults. An actor that dies (killed, its node lost) is replaced and its micro-batches not yet
returned are made again by the new one: the same bytes, the run goes on. A micro-batch whose
actor died `MAX_DEATHS` times, or an actor that cannot be placed within `PLACE_TIMEOUT` (the
cluster lost its nodes), stops the run with `RayUnavailable`, one line that says how to resume.
With ``loader.sample_timeout`` an actor on one sample for longer is killed and replaced, the
sample counts as failed (``on_timeout``; its stand-in is used) and every micro-batch not yet
returned is requested again. A micro-batch that raises (bad data) stops the pool and its error
passes through as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from typing import Any, cast

import ray
from ray.exceptions import GetTimeoutError, ObjectLostError, RayActorError, RayTaskError

import energon_platform.loader.executors.ray_connect as ray_connect
from energon_platform.loader.executors.base import Executor
from energon_platform.loader.executors.maker_spec import NodeMismatch, spec_of
from energon_platform.loader.executors.ray_actor import MakerActor
from energon_platform.loader.executors.ray_connect import RayUnavailable
from task_encoders.config_parser import ConfigError

log = logging.getLogger(__name__)

#: seconds a new actor gets to be placed and to build its maker
PLACE_TIMEOUT = 180.0
#: times the actors making one micro-batch may die before the run stops
MAX_DEATHS = 3
#: Ray's options of an actor when ``loader.ray_actor_options`` sets none
DEFAULT_OPTIONS = {"num_cpus": 1}

#: the actor class: `make` one request at a time, `stuck` answered beside it (its own thread)
# Ray's typed overloads of ray.remote omit concurrency_groups, which it takes for an actor class
_RemoteMaker = ray.remote(concurrency_groups={"watch": 1})(MakerActor)  # pyright: ignore[reportCallIssue]


@dataclasses.dataclass
class _Slot:
    """One actor of the pool and what it was sent."""

    handle: Any
    name: str  #: "ray actor 2 (pid 1234) on node host (10.0.0.3)"
    pid: int
    segments: int = 0  #: blend segments sent so far
    timed_out: set = dataclasses.field(default_factory=set)  #: failed samples sent so far


class RayExecutor(Executor):
    """The pool (module doc); ``source``: the `TrainLoader` (see `executors.build`)."""

    def __init__(self, config: Any, source: Any, workers: int):
        if workers < 1:
            raise ConfigError(
                getattr(source.run_config, "source", "<dict>"),
                "loader.num_workers",
                "0 with executor 'ray' (expected the number of Ray actors, at least 1, or "
                "executor: local)",
            )
        self.config, self.source, self.n = config, source, workers
        self.options = {**DEFAULT_OPTIONS, **dict(config.ray_actor_options)}
        self._started_ray = False
        self._slots: list[_Slot] = []
        self._pending: dict[int, tuple[int, Any]] = {}  # c -> (slot, object ref)
        self._deaths: dict[int, int] = {}
        self._first = self._next = self._submitted = 0
        self._before = math.inf
        self._segments: list[dict] = []
        self._timed_out: dict = {}
        self._spec_ref = None

    # --- start and stop --------------------------------------------------------------------

    def start(self, first: int, timed_out: dict) -> None:
        self.close()
        self._started_ray = ray_connect.connect(self.config.ray_address, first) or (
            self._started_ray and ray.is_initialized()
        )
        self._timed_out = timed_out  # the owner's: on_timeout adds to it
        adapter = getattr(self.source, "adapter", None)
        self._before = math.inf if adapter is None else adapter.decided_before()
        self._segments, self._deaths = [], {}
        self._spec_ref = ray.put(spec_of(self.source, first, timed_out))
        self._first = self._next = self._submitted = first
        handles = [self._new_actor(i) for i in range(self.n)]
        try:
            self._slots = [self._placed(i, h, first) for i, h in enumerate(handles)]
        except BaseException:
            _kill(*handles)
            self.close()
            raise
        self._fill()

    def _new_actor(self, index: int) -> Any:
        return _RemoteMaker.options(**self.options).remote(
            self._spec_ref, index, self.config.sample_timeout is not None
        )

    def _placed(self, index: int, handle: Any, c: int) -> _Slot:
        """The slot of a new actor once it is up; `RayUnavailable` when it cannot be placed in
        time, `NodeMismatch` when its node does not read the trainer's data (the actor killed)."""
        try:
            # an actor method's ref is untyped in Ray's stubs, so ray.get's list overload wins
            info = cast(dict, ray.get(handle.ready.remote(), timeout=PLACE_TIMEOUT))
        except GetTimeoutError:
            _kill(handle)
            raise RayUnavailable(
                f"ray actor {index} was not placed within {PLACE_TIMEOUT:g} s (the cluster has "
                f"no node with loader.ray_actor_options {self.options} free)",
                c,
            ) from None
        except RayActorError as e:
            raise RayUnavailable(f"ray actor {index} died at start ({_first_line(e)})", c) from None
        if info["problem"] is not None:
            _kill(handle)
            raise NodeMismatch(info["problem"])
        name = f"ray actor {index} (pid {info['pid']}) on node {info['node']}"
        return _Slot(handle, name, info["pid"])

    def _replaced(self, indexes: list[int], c: int) -> None:
        """New actors in the slots ``indexes`` (their old ones killed); the pool stops when one
        cannot be placed."""
        for index in indexes:
            _kill(self._slots[index].handle)
            try:
                self._slots[index] = self._placed(index, self._new_actor(index), c)
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        _kill(*(slot.handle for slot in self._slots))
        self._slots, self._pending, self._spec_ref = [], {}, None
        ray_connect.disconnect(self._started_ray)
        self._started_ray = False

    def workers(self) -> list[str]:
        return [slot.name for slot in self._slots]

    def pids(self) -> list[int]:
        """The process ids of the actors alive (on their nodes)."""
        return [slot.pid for slot in self._slots]

    # --- requests --------------------------------------------------------------------------

    def publish(self, decided_before: int, segment: Any) -> None:
        self._before = decided_before
        if segment is not None:
            self._segments.append(segment.to_json())
        if self._slots:
            self._fill()

    def _accumulation(self) -> int:
        return self.source.plan.accumulation

    def _fill(self) -> None:
        """Request micro-batches up to ``prefetch_factor`` per actor ahead of the next one, none
        whose weights are not decided."""
        window = self._next + self.n * self.config.prefetch_factor
        while self._submitted < window and self._submitted // self._accumulation() < self._before:
            self._submit(self._submitted)
            self._submitted += 1

    def _submit(self, c: int) -> None:
        index = (c - self._first) % self.n
        slot = self._slots[index]
        new = {k: v for k, v in self._timed_out.items() if k not in slot.timed_out}
        segments = self._segments[slot.segments :]
        ref = slot.handle.make.remote(c, segments, new)
        slot.segments += len(segments)
        slot.timed_out.update(new)
        self._pending[c] = (index, ref)

    # --- results ---------------------------------------------------------------------------

    def next(self) -> tuple[int, Any]:
        self._fill()
        c = self._next
        poll = (
            None if self.config.sample_timeout is None else min(1.0, self.config.sample_timeout / 4)
        )
        while True:
            if c not in self._pending:  # blend_adapt: the weights of its batch are not decided
                raise RuntimeError(
                    f"micro-batch {c} needs blend weights not published yet (decided before "
                    f"global batch {self._before})"
                )
            index, ref = self._pending[c]
            done, _ = ray.wait([ref], timeout=poll)
            if not done:
                self._replace_stuck()
                continue
            try:
                batch = ray.get(ref)
            except RayTaskError as e:  # the micro-batch raised: its own error, as it is
                self.close()
                cause = e.cause if isinstance(e.cause, BaseException) else RuntimeError(str(e))
                raise cause from None
            except (RayActorError, ObjectLostError) as e:  # the actor, or its node, died
                self._replace(index, c, _first_line(e))
                continue
            del self._pending[c]
            self._next += 1
            self._fill()
            return c, batch

    def _replace(self, index: int, c: int, reason: str) -> None:
        """A new actor in slot ``index`` (its old one died while ``c`` was due), and the old
        one's micro-batches not yet returned requested from it again."""
        self._deaths[c] = self._deaths.get(c, 0) + 1
        old = self._slots[index]
        if self._deaths[c] >= MAX_DEATHS:
            self.close()
            raise RayUnavailable(
                f"{old.name} died {MAX_DEATHS} times making micro-batch {c} ({reason}): out of "
                f"memory? Lower loader.prefetch_factor or raise the actors' memory",
                c,
            )
        log.warning(
            "%s died making micro-batch %d (%s): replaced, its micro-batches made again",
            old.name,
            c,
            reason,
        )
        self._replaced([index], c)
        for k in sorted(k for k, (i, _) in self._pending.items() if i == index):
            self._submit(k)

    def _replace_stuck(self) -> None:
        """With ``loader.sample_timeout``: kill and replace the actors on one sample for longer,
        report the samples (``on_timeout``) and request every micro-batch not yet returned
        again (the others' results, made before the samples failed, are dropped)."""
        limit = self.config.sample_timeout
        if limit is None:
            return
        stuck = []
        for index, slot in enumerate(self._slots):
            try:
                ask = slot.handle.stuck.options(concurrency_group="watch")
                found = ray.get(ask.remote(limit), timeout=max(limit, 5.0))
            except (RayActorError, GetTimeoutError):
                continue  # dead: found when its result is due
            stuck += [dataclasses.replace(s, worker=index) for s in found]
        if not stuck:
            return
        for s in stuck:
            slot = self._slots[s.worker]
            log.warning("%s stuck on a sample for %.1f s: killed", slot.name, s.seconds)
            _kill(slot.handle)
        if self.on_timeout is not None:
            self.on_timeout(stuck)
        for s in stuck:
            self._timed_out.setdefault((s.dataset, s.index), (f"#{s.index}", limit))
        self._replaced(sorted({s.worker for s in stuck}), self._next)
        for _, ref in self._pending.values():
            with contextlib.suppress(Exception):  # a request already running is just dropped
                ray.cancel(ref)
        self._pending, self._submitted = {}, self._next
        self._fill()


def _kill(*handles: Any) -> None:
    """Kill these actors (no restart); one already dead, or Ray already shut down, is no error."""
    for handle in handles:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
