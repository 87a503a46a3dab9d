"""Build a thing once for the whole test run, whichever test process asks first.

``pytest -n N`` runs N test processes, and a ``scope="session"`` fixture is one per process:
each builds it again. `once_per_run` builds it once: in the base temporary folder that the
processes of one run share (the parent of each one's own), under a file lock, with what the
build returned kept beside it as JSON. A build that raises leaves nothing behind; the next
process to ask tries again. For things the tests only read.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every test process of this run sees: the base temporary folder, or its parent
    in a process that pytest-xdist started (each of those has a base folder of its own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]
) -> object:
    """``build(folder)``'s result (JSON-able), ``folder`` being ``<shared root>/<name>`` (made
    empty for it); built by the first process that asks, read back by the others."""
    root = shared_root(tmp_path_factory)
    result = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not result.exists():
            folder = root / name
            shutil.rmtree(folder, ignore_errors=True)  # what a build that raised left
            folder.mkdir()
            value = build(folder)
            result.write_text(json.dumps(value))
        return json.loads(result.read_text())
