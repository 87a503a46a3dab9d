"""The suite's two tiers, named in one place.

``make test-fast`` runs the tests marked ``fast`` (``pytest -m fast``); ``make test`` runs them
first, then the rest (``-m "not fast"``), so each test runs once. The fast tier is pure and
property tests: the project's code in this process, on small data, and no process started: no
loader worker, no command in an interpreter of its own, no server (S3, Ray, the warm CLI server).

`FAST` names its tests, by module (``tests/x/test_y.py``: every test in it) or by test
(``tests/x/test_y.py::test_z``: every parametrization of it); ``tests/conftest.py`` marks them as
they are collected, so the test files say nothing about their tier. While a fast test runs,
`no_process` refuses to start a process and the test fails (``tests/conftest.py``): a fast test
that comes to need one moves out of `FAST`. The fixtures of a wider scope than the test (session,
module) are set up before it, outside that guard: they are shared, not the test's own doing.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

FAST: tuple[str, ...] = (
    "tests/convert/test_verify_and_info_name_what_is_wrong.py",
    "tests/encoders/test_config.py",
    "tests/encoders/test_features.py",
    "tests/encoders/test_seeding.py",
    "tests/encoders/test_sequences.py",
    "tests/encoders/test_text.py",
    "tests/encoders/test_tokenizer_loading.py",
    "tests/loader/test_balance_config.py",
    "tests/loader/test_balance_grouped.py",
    "tests/loader/test_config_checks.py",
    "tests/loader/test_context_parallel.py",
    "tests/loader/test_epoch_boundaries.py",
    "tests/loader/test_plan_no_repeats.py",
    "tests/loader/test_shard_reader.py",
    "tests/loader/test_stand_in.py",
    "tests/loader/test_val_split.py",
    "tests/project/test_cli_worker_errors.py",
    "tests/project/test_layering.py",
    "tests/project/test_suite_environment.py",
    "tests/project/test_suite_threads.py",
    "tests/project/test_test_order.py",
    "tests/project/test_tiers.py",
    "tests/training/test_batch_digests.py",
    "tests/training/test_row_digest.py",
)


def modules() -> list[str]:
    """The modules `FAST` names tests of, each once (what ``make test-fast`` collects)."""
    return sorted({entry.split("::", 1)[0] for entry in FAST})


def is_fast(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (``tests/x/test_y.py::test_z[param]``) is in `FAST`."""
    module = nodeid.split("::", 1)[0]
    test = nodeid.split("[", 1)[0]
    return module in _FAST_SET or test in _FAST_SET


_FAST_SET = frozenset(FAST)


class ProcessRefused(RuntimeError):
    """A process was to be started inside `no_process`."""


@contextlib.contextmanager
def no_process() -> Iterator[list[str]]:
    """Inside, starting a process from this thread or from a thread started inside raises
    `ProcessRefused` (nothing starts), and is recorded in the list this yields (a caller that
    swallowed the error is still found out). Covered: `subprocess` (and what runs on it: Ray,
    ``os.popen``), `multiprocessing` (process pools included), ``os.fork``, ``os.forkpty``,
    ``os.posix_spawn[p]`` and ``os.system``. Left alone: threads alive before entry (a server
    thread of an earlier test is not this test's doing), and a shared library's lookup
    (``ctypes.util.find_library`` runs ``ldconfig -p``; the loader does once per process, so
    which test pays for it depends on the order)."""
    started: list[str] = []
    earlier = set(threading.enumerate()) - {threading.current_thread()}
    originals: list[tuple[object, str, object]] = []

    def refuse(owner: object, name: str, what: str) -> None:
        original = getattr(owner, name)

        def guarded(*args, **kwargs):
            if threading.current_thread() in earlier or _in_library_lookup():
                return original(*args, **kwargs)
            started.append(what)
            raise ProcessRefused(f"a fast-tier test may not start a process ({what})")

        originals.append((owner, name, original))
        setattr(owner, name, guarded)

    refuse(subprocess.Popen, "_execute_child", "subprocess")
    refuse(multiprocessing.process.BaseProcess, "start", "multiprocessing")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            refuse(os, name, f"os.{name}")
    try:
        yield started
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)


def _in_library_lookup() -> bool:
    """Whether ``ctypes.util`` (``find_library``) is on the calling stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") == "ctypes.util":
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def fast_test(nodeid: str) -> Iterator[None]:
    """The body of the fast test ``nodeid`` runs inside: under `no_process`, and failing the test
    (``pytest.fail``, one line) on leaving if it tried to start a process."""
    import pytest

    with no_process() as started:
        yield
    if started:
        pytest.fail(
            f"{nodeid} is in the fast tier but started a process ({', '.join(started)}):"
            " move it out of FAST (tests/helpers/tiers.py)",
            pytrace=False,
        )


if __name__ == "__main__":
    print(" ".join(modules()))  # for the Makefile: collecting only these keeps test-fast fast
