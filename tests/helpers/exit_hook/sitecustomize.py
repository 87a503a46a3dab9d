"""Imported at start-up by every Python process the tests start (``tests/conftest.py`` puts this
folder first on ``PYTHONPATH``): at exit, after the process's own ``atexit`` handlers, every object
alive is frozen, so the interpreter's last full collection does not scan them.

What ``energon-platform`` does itself (`energon_platform.training.collector.before_exit`), for the
processes the tests start that are not the command: the example trainers, torchrun's launcher,
scripts. With torch imported that collection is a large part of a short process's CPU, and the
suite starts hundreds. Nothing else changes: a process's ``atexit`` handlers and ``weakref.finalize``
callbacks run first and as before; only objects that a reference cycle alone keeps are no longer
finalized at exit, which CPython does not promise either.
"""

import atexit
import gc

atexit.register(gc.freeze)  # registered first, so it runs last
