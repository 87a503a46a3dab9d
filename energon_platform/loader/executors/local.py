"""`LocalExecutor`: forked worker processes make the micro-batches, the trainer reorders them.

Worker ``w`` of ``W`` is sent micro-batches ``first + w``, ``first + w + W``, ... (round robin),
at most ``prefetch_factor`` per worker in flight; each answers on one shared result queue and the
trainer hands them back by ``c``. Tensors travel through ``torch.multiprocessing`` queues (shared
memory, not copies through the pipe), and are pinned on the trainer's side when CUDA is there.

Each worker, first thing: `die_with_parent` (when forked by the main thread: the kernel's rule
follows the forking thread, so a worker forked by another thread checks its parent itself, every
second while idle), `keep_freed_memory`, one intra-op thread (so tensors are bit-identical with 0
or N workers). With ``loader.blend_adapt`` each request carries the blend's segments the worker
does not have yet, and no micro-batch of a global batch whose weights are not decided is asked for
(`publish`). On object storage a worker starts the reads of its next `LOOKAHEAD` micro-batches
ahead.

Supervision, while the trainer waits for a micro-batch (every second, or a quarter of
``loader.sample_timeout``): a worker that exited (the kernel's OOM killer) is `WorkerLost`; with
a `SampleWatch`, a worker on one sample for longer than the limit is killed, ``on_timeout`` is
called with the stuck samples and the workers restart at the first micro-batch not yet returned.
No SIGCHLD handler is installed: a dead worker is found here, inside `next`, and PyTorch's own
handler (installed by some other DataLoader of the process) watches only its own workers' pids.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from typing import Any

import torch
import torch.multiprocessing as mp

from energon_platform.loader.allocator import keep_freed_memory
from energon_platform.loader.batches import LOOKAHEAD, MicroBatchMaker
from energon_platform.loader.executors.base import Executor, WorkerLost
from energon_platform.loader.processes import die_with_parent
from energon_platform.loader.sample_watch import SampleWatch
from storage import DatasetError

#: seconds between two looks at the workers while the trainer waits (and an idle worker's look
#: at its parent)
CHECK = 1.0
#: seconds a stopping worker has to finish before it is killed
STOP_GRACE = 0.05


class LocalExecutor(Executor):
    """``processes`` forked workers making the micro-batches of ``maker`` (module doc).

    ``plan``: the `RunPlan` the maker's schedule comes from (a worker extends its copy with the
    blend's published segments); ``sample_timeout``: seconds (None: unwatched); ``rank``: named in
    worker ids."""

    def __init__(
        self,
        maker: MicroBatchMaker,
        plan: Any,
        processes: int,
        prefetch_factor: int,
        sample_timeout: float | None = None,
        rank: int = 0,
    ):
        if processes < 1:
            raise ValueError(f"LocalExecutor needs at least one worker process, got {processes}")
        self.maker, self.plan, self.processes = maker, plan, processes
        self.window = processes * prefetch_factor
        self.sample_timeout, self.rank = sample_timeout, rank
        self.pin = torch.cuda.is_available()
        #: global batches before this one may be asked for (None: all; ``loader.blend_adapt``)
        self.decided_before: int | None = None
        self._procs: list = []
        self._segments: list = []  # published since the workers forked

    # --- life ---------------------------------------------------------------------------------

    def start(self, first: int, timed_out: dict) -> None:
        self.close()
        self._first = self._next = self._asked = first
        self._timed_out = timed_out
        self._ready: dict[int, tuple[bool, Any]] = {}
        self._segments, self._sent = [], [0] * self.processes
        self.maker.timed_out = timed_out  # the workers fork with what timed out so far
        self.maker.watch = self._watch = (
            SampleWatch(self.processes) if self.sample_timeout else None
        )
        ctx = mp.get_context("fork")
        self._results = ctx.Queue()
        self._results.cancel_join_thread()  # a worker killed with a result queued still exits
        self._requests = [ctx.Queue() for _ in range(self.processes)]
        for q in self._requests:
            q.cancel_join_thread()
        # the kernel's parent-death rule follows the forking thread: only the main thread's lasts
        main = threading.current_thread() is threading.main_thread()
        parent = os.getpid()
        for w in range(self.processes):
            p = ctx.Process(
                target=_work,
                args=(self.maker, self.plan, w, self.processes, self._requests[w], self._results),
                kwargs={"parent": parent, "pdeathsig": main},
                name=f"energon-platform loader worker {w}",
                daemon=True,
            )
            p.start()
            self._procs.append(p)
        self._ask()

    def close(self) -> None:
        procs, self._procs = self._procs, []
        if not procs:
            return
        for q in self._requests:
            with contextlib.suppress(Exception):
                q.put(None)
        deadline = time.monotonic() + STOP_GRACE
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
            p.join()
        for q in [*self._requests, self._results]:
            q.close()
        self._watch = self.maker.watch = None

    def workers(self) -> list[str]:
        return [_name(w, p.pid) for w, p in enumerate(self._procs) if p.is_alive()]

    def pids(self) -> list[int]:
        """The worker processes' pids, by worker (for tests and tools that watch them)."""
        return [p.pid for p in self._procs]

    # --- requests -----------------------------------------------------------------------------

    def publish(self, decided_before: int, segment: Any) -> None:
        self.decided_before = decided_before
        if segment is not None and self._procs:
            self._segments.append(segment)
        if self._procs:
            self._ask()

    def _askable(self, c: int) -> bool:
        return c < self._next + self.window and (
            self.decided_before is None or c // self.maker.accumulation < self.decided_before
        )

    def _ask(self) -> None:
        """Send requests up to the window (and the decided weights)."""
        while self._askable(self._asked):
            c = self._asked
            w = (c - self._first) % self.processes
            new, self._sent[w] = self._segments[self._sent[w] :], len(self._segments)
            self._requests[w].put((c, new, self.decided_before))
            self._asked += 1

    # --- results ------------------------------------------------------------------------------

    def next(self) -> tuple[int, Any]:
        if not self._procs:
            raise RuntimeError("LocalExecutor.next() before start()")
        c = self._next
        wait = CHECK if not self.sample_timeout else min(CHECK, self.sample_timeout / 4)
        while c not in self._ready:
            if self._asked <= c:
                raise RuntimeError(
                    f"micro-batch {c}: the blend's weights of global batch "
                    f"{c // self.maker.accumulation} are not decided (publish them first)"
                )
            try:
                got, ok, payload = self._results.get(timeout=wait)
            except queue.Empty:
                self._supervise(c)
                continue
            except (ConnectionError, EOFError) as e:  # a kill cut a tensor's transfer
                self._lost(c, wait=1.0, cause=e)
                raise
            self._ready[got] = (ok, payload)
        ok, payload = self._ready.pop(c)
        if not ok:
            self.close()  # bad data or a bug: no worker goes on after it
            raise payload
        self._next = c + 1
        self._ask()
        return c, _pinned(payload) if self.pin else payload

    def _supervise(self, c: int) -> None:
        """A worker that died: `WorkerLost`. Workers stuck on a sample: killed, reported to
        ``on_timeout``, and every worker restarted at ``c`` (the first not yet returned)."""
        self._lost(c, wait=0.0)
        if self._watch is None or not self.sample_timeout:  # watched only with a timeout
            return
        stuck = self._watch.stuck(self.sample_timeout)
        if not stuck:
            return
        for s in stuck:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._procs[s.worker].pid, signal.SIGKILL)
        self.close()
        if self.on_timeout is not None:
            self.on_timeout(stuck)
        self.start(c, self._timed_out)

    def _lost(self, c: int, wait: float, cause: BaseException | None = None) -> None:
        """`WorkerLost` for the first worker that exited (waiting up to ``wait`` seconds for one:
        a transfer cut by a kill can surface just before the exit is visible)."""
        deadline = time.monotonic() + wait
        while True:
            dead = [(w, p) for w, p in enumerate(self._procs) if p.exitcode is not None]
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if not dead:
            return
        w, p = dead[0]
        code = p.exitcode
        reason = (
            f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        )
        self.close()
        raise WorkerLost(_name(w, p.pid), c, reason) from cause


def _name(w: int, pid: int) -> str:
    return f"loader worker {w} (pid {pid})"


def _pinned(value: Any) -> Any:
    """``value`` with its tensors in pinned memory (a batch's own ``pin_memory``, else tensors,
    dicts, lists and tuples, nested)."""
    if hasattr(value, "pin_memory"):
        return value.pin_memory()
    if isinstance(value, dict):
        return type(value)((k, _pinned(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_pinned(v) for v in value)
    return value


def _portable(e: BaseException, w: int) -> BaseException:
    """``e`` as it can cross to the trainer: itself when it pickles, else a RuntimeError with its
    text; a bug's traceback travels as a note (bad data stays one line)."""
    if not isinstance(e, DatasetError):
        e.add_note(f"in loader worker {w}:\n{''.join(traceback.format_exception(e)).rstrip()}")
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def worker_start(parent: int, pdeathsig: bool) -> None:
    """First thing in a worker: die with ``parent`` (when ``pdeathsig``: forked by the main
    thread), keep freed memory for the next samples."""
    if pdeathsig:
        die_with_parent(parent)
    keep_freed_memory()


def _read_ahead(maker, c: int, ahead: int, n: int, decided_before: int | None) -> int:
    """Start the reads of this worker's micro-batches from ``ahead`` up to ``LOOKAHEAD`` turns
    past ``c`` (not past the blend decided so far); the next one not started. A store that fails
    a read ahead (`DatasetError`: `StorageError`) costs only the head start: the micro-batch that
    needs the data meets the same failure and reports it as its own. Anything else is a bug, and
    fails micro-batch ``c``."""
    try:
        while ahead <= c + LOOKAHEAD * n and (
            decided_before is None or ahead // maker.accumulation < decided_before
        ):
            maker.prefetch(ahead)
            ahead += n
    except DatasetError:
        pass
    return ahead


def _work(maker, plan, w: int, n: int, requests, results, parent: int, pdeathsig: bool) -> None:
    """A worker process: make the micro-batches asked for, in the order asked, until ``None``."""
    worker_start(parent, pdeathsig)
    torch.set_num_threads(1)
    results.cancel_join_thread()  # stopped with a result queued, it exits all the same
    maker.watch_row = w
    remote = any(s.remote for s in maker.sources)
    ahead = 0  # the next micro-batch of this worker whose reads have not started
    try:
        while True:
            try:
                request = requests.get(timeout=CHECK)
            except queue.Empty:
                if os.getppid() != parent:  # forked by a thread that ended: no kernel rule
                    return
                continue
            if request is None:
                return
            c, segments, decided_before = request
            if segments:
                plan.extend_blend(segments)
                maker.schedule = plan.schedule
            try:
                if remote:  # the reads of the next micro-batches overlap this one's work
                    ahead = _read_ahead(maker, c, max(ahead, c), n, decided_before)
                results.put((c, True, maker(c)))
            except Exception as e:
                results.put((c, False, _portable(e, w)))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole group: the trainer stops itself
        return
