"""Executors run work units: in this process, in local worker processes, or as Ray tasks.

All three run the same ``write_unit`` on the same units, so they produce the same bytes. Results
arrive in completion order; ``on_done(unit, stats)`` is called for each one (progress, merging).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from typing import TypeVar

from converters.output import ConvertError
from converters.units import WorkUnit
from converters.writer import WriteOptions, write_unit

#: ``writer(unit, out_dir, opts) -> stats``: ``write_unit``, or one that also uploads (converters.remote).
Writer = Callable[..., dict]

OnDone = Callable[[WorkUnit, dict], None]
#: a unit and its options of `run_ray`, which runs any ``writer`` (the length index's shards too)
Unit = TypeVar("Unit")
Options = TypeVar("Options")


def run_inline(
    units: Sequence[WorkUnit],
    out_dir: str,
    opts: WriteOptions,
    on_done: OnDone,
    writer: Writer = write_unit,
) -> None:
    for unit in units:
        on_done(unit, writer(unit, out_dir, opts))


def run_local(
    units: Sequence[WorkUnit],
    out_dir: str,
    opts: WriteOptions,
    on_done: OnDone,
    workers: int,
    writer: Writer = write_unit,
) -> None:
    """``workers`` processes; at most ``2 * workers`` units in flight (bounded memory)."""
    if workers <= 1 or len(units) <= 1:
        return run_inline(units, out_dir, opts, on_done, writer)
    todo = list(units)[::-1]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        running = {}
        while todo or running:
            while todo and len(running) < 2 * workers:
                unit = todo.pop()
                running[pool.submit(writer, unit, out_dir, opts)] = unit
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                on_done(running.pop(fut), fut.result())


def _call(writer: Writer, unit: WorkUnit, out_dir: str, opts: WriteOptions) -> dict:
    """A Ray task's body: ``writer`` may be any picklable callable (Ray wraps functions only)."""
    return writer(unit, out_dir, opts)


#: Seconds to wait for a Ray cluster's address to answer before giving up.
RAY_CONNECT_TIMEOUT_S = 10.0


def check_ray_address(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Fail within ``timeout`` seconds, with a `ConvertError`, when ``HOST:PORT`` or
    ``ray://HOST:PORT`` does not accept a TCP connection (Ray itself retries for minutes).
    ``None`` (a local instance) and ``auto`` (Ray fails fast itself) are not probed."""
    if not address or address == "auto":
        return
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ConvertError(
            f"--ray-address {address!r}: expected HOST:PORT, ray://HOST:PORT or auto"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConvertError(
            f"--ray-address {address}: cannot reach {host}:{port} within {timeout:g} s "
            f"({e.strerror or type(e).__name__})"
        ) from e


def run_ray(
    units: Sequence[Unit],
    out_dir: str,
    opts: Options,
    on_done: Callable[[Unit, dict], None],
    workers: int,
    address: str | None,
    writer: Writer = write_unit,
) -> None:
    """Units as Ray tasks. ``address=None`` starts a local Ray instance with ``workers`` CPUs;
    otherwise connects to that cluster (``out_dir`` must then be a path every node can write).
    Ray started here is shut down after, and the process's environment is put back as ``ray.init``
    found it: it sets variables of its own (``PYTHONBREAKPOINT`` to Ray's debugger, among others),
    which would outlive the conversion in a caller's process. (What importing Ray sets stays.)"""
    import ray

    with ExitStack() as cleanup:
        if not ray.is_initialized():  # started here: shut down after, the environment put back
            cleanup.enter_context(environment_as_found())
            kwargs = (
                {"address": address}
                if address
                # "local": a Ray of its own, never a cluster this node already runs
                else {"address": "local", "num_cpus": max(1, workers), "include_dashboard": False}
            )
            try:
                ray.init(log_to_driver=False, configure_logging=False, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConvertError(
                    f"cannot start or join Ray{f' at {address}' if address else ''}: "
                    f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                ) from e
            cleanup.callback(ray.shutdown)  # before the environment is put back
        task = ray.remote(num_cpus=1, max_retries=3)(_call)
        refs = {task.remote(writer, unit, out_dir, opts): unit for unit in units}
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                on_done(refs.pop(ref), ray.get(ref))


@contextmanager
def environment_as_found(keep: frozenset[str] = frozenset()) -> Iterator[None]:
    """After the body, ``os.environ`` is what it was before it: variables added are removed and
    changed ones set back, all but those named in ``keep`` (left as the body left them). Only what
    differs is touched."""
    before = {k: v for k, v in os.environ.items() if k not in keep}
    try:
        yield
    finally:
        for key in set(os.environ) - set(before) - keep:
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
