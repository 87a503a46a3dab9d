"""The suite's exit hook (``tests/conftest.py``, ``tests/helpers/exit_hook``): every Python process
the tests start freezes what is alive once its own exit handlers have run."""

from __future__ import annotations

from tests.helpers import REPO
from tests.helpers.cli import run_python

HOOK = REPO / "tests" / "helpers" / "exit_hook" / "sitecustomize.py"

PROBE = """
import atexit, gc, sitecustomize
import torch
before = gc.get_freeze_count()
atexit._run_exitfuncs()  # what the interpreter runs at exit, here before it goes on
print(sitecustomize.__file__, before, gc.get_freeze_count())
"""


def test_a_child_process_freezes_what_torch_made_at_exit_and_not_before():
    r = run_python(PROBE)
    assert r.returncode == 0, r.stderr[-2000:]
    path, before, after = r.stdout.split()
    assert path == str(HOOK) and int(before) == 0 and int(after) > 100_000, r.stdout
