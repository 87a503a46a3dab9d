"""What runs when a `TrainLoader` makes its first batch, registered by the rooms above the loader.

The loader must not import the trainer integrations (they sit on it), yet one of them must act
when a framework drives a loader that nobody wired to it: Lightning checkpoints a loader one
prefetched batch ahead, which ``energon_platform.integrations.lightning`` refuses, but only once
that module is imported. The package top (``energon_platform/__init__.py``, above every room)
registers a check here; the loader runs the registered checks each time it starts making batches
(`run`). A check must be cheap when it has nothing to do, and raise only for a real refusal.
"""

from __future__ import annotations

from collections.abc import Callable

#: checks run by `run`, in the order they were registered
CHECKS: list[Callable[[], None]] = []


def register(check: Callable[[], None]) -> None:
    """Run ``check()`` each time a loader starts making batches (once per function)."""
    if check not in CHECKS:
        CHECKS.append(check)


def run() -> None:
    """Run every registered check (called by `TrainLoader` before its first batch)."""
    for check in CHECKS:
        check()
