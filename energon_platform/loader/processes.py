"""Forked helper processes die with the process that forked them.

A SIGKILLed training process cannot stop its children. Left alone they live on as orphans: a
``multiprocessing`` pool worker waits on its task queue for ever, a DataLoader worker until its
next check of its parent (seconds, or the end of the micro-batch it is making), and meanwhile each
keeps what it inherited (memory, open files, a GPU context). `die_with_parent`, called first
thing in a forked child, has the kernel SIGKILL the child the moment its parent dies, so nothing of
a killed run outlives it. Used by the length index's build pool and the loader's worker processes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: ``prctl`` option: the signal the calling process gets when its parent dies (``<linux/prctl.h>``).
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """In a process forked by ``parent_pid``: be SIGKILLed when that parent dies.

    Linux's ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; the kernel fires it when the *thread* that forked
    this process ends, so fork from a thread that lives as long as the child should (the main
    thread, or the thread that also waits for the child). A parent that died between the fork and
    this call (the rule would never fire) is caught by comparing ``getppid()``: the child then
    kills itself at once. A no-op on other systems (no such call there)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent_pid:  # the parent is already gone: this process was reparented
        os.kill(os.getpid(), signal.SIGKILL)
