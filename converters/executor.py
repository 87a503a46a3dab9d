"""Executors run work units: in this process, in local worker processes, or as Ray tasks.

All three run the same ``write_unit`` on the same units, so they produce the same bytes. Results
arrive in completion order; ``on_done(unit, stats)`` is called for each one (progress, merging).
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable, Sequence

from converters.units import WorkUnit
from converters.writer import WriteOptions, write_unit

OnDone = Callable[[WorkUnit, dict], None]


def run_inline(units: Sequence[WorkUnit], out_dir: str, opts: WriteOptions, on_done: OnDone) -> None:
    for unit in units:
        on_done(unit, write_unit(unit, out_dir, opts))


def run_local(units: Sequence[WorkUnit], out_dir: str, opts: WriteOptions, on_done: OnDone, workers: int) -> None:
    """``workers`` processes; at most ``2 * workers`` units in flight (bounded memory)."""
    if workers <= 1 or len(units) <= 1:
        return run_inline(units, out_dir, opts, on_done)
    todo = list(units)[::-1]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        running = {}
        while todo or running:
            while todo and len(running) < 2 * workers:
                unit = todo.pop()
                running[pool.submit(write_unit, unit, out_dir, opts)] = unit
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                on_done(running.pop(fut), fut.result())


def run_ray(units: Sequence[WorkUnit], out_dir: str, opts: WriteOptions, on_done: OnDone,
            workers: int, address: str | None) -> None:
    """Units as Ray tasks. ``address=None`` starts a local Ray instance with ``workers`` CPUs;
    otherwise connects to that cluster (``out_dir`` must then be a path every node can write)."""
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        kwargs = {"address": address} if address else {"num_cpus": max(1, workers), "include_dashboard": False}
        ray.init(log_to_driver=False, configure_logging=False, **kwargs)
    try:
        task = ray.remote(num_cpus=1, max_retries=3)(write_unit)
        refs = {task.remote(unit, out_dir, opts): unit for unit in units}
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                on_done(refs.pop(ref), ray.get(ref))
    finally:
        if started_here:
            ray.shutdown()
