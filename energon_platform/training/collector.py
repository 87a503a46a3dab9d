"""Python's cyclic garbage collector in the trainer's process: paused while the process sets up,
then everything the set-up made frozen.

Importing torch, transformers and the encoder and building the model make a very large number of
objects that live as long as the process. While they are made, every full collection scans all of
them again (a share of the trainer's start-up CPU that grows with what the set-up imports and
builds); after, every full collection still scans them, in the trainer and in each DataLoader worker
forked from it, where the scan also touches (and so copies) pages the worker would otherwise share
with its parent.

`off` is a block run with the collector off, as it was after (``timeit``'s rule: a full
collection of a large process inside one timed step adds its own time to that step).

`pause` turns the collector off; ``energon-platform train`` calls it before its first heavy
import. `settle`, called once the set-up is done and before any worker is forked, freezes every
object alive (`gc.freeze`: later collections skip them) and turns the collector back on; `resume`
turns it back on without freezing anything (a set-up that failed: the command's caller goes on
with its collector as it was). All three act only on a collector that `pause` turned off: in a
process that never paused (a library caller, a test), they change nothing, since that process's
collector is its own to manage.

`before_exit` is for a program about to end (the ``energon-platform`` command, whatever it ran):
it freezes every object alive, so the interpreter's last full collection at exit skips them.
That collection scans every object the imports made (torch's compiler stack included), a large
part of a short command's CPU, for nothing the process needs.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_paused = False


def pause() -> None:
    """Turn the collector off until `settle`, if it is on."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def settle() -> None:
    """After `pause`: freeze every object alive now and turn the collector back on. Otherwise
    nothing."""
    if _paused:
        gc.freeze()
    resume()


def resume() -> None:
    """After `pause` (and no `settle`): turn the collector back on, freezing nothing. Otherwise
    nothing."""
    global _paused
    if _paused:
        gc.enable()
        _paused = False


def before_exit() -> None:
    """Freeze every object alive: the interpreter's collection at exit then scans none of them.

    For a process that ends next. ``atexit`` handlers and ``weakref.finalize`` callbacks still
    run, and so does the clean-up of every module; what no longer runs is the finalizer of an
    object that only a reference cycle keeps (which CPython does not promise at exit either).
    """
    gc.freeze()


@contextmanager
def off() -> Iterator[None]:
    """The block runs with the collector off; after it, the collector is on again if it was
    before (whatever the block raised)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


__all__ = ["before_exit", "off", "pause", "resume", "settle"]
