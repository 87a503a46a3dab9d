"""The command line as the tests run it: ``python -m energon_platform`` in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys


def cli_argv(*args: object) -> list[str]:
    """The argv of ``energon-platform ARGS...`` run by this interpreter; each arg made a string."""
    return [sys.executable, "-m", "energon_platform", *map(str, args)]


def python_argv(code: str, *args: object) -> list[str]:
    """The argv of ``python -c CODE ARGS...`` run by this interpreter; each arg made a string."""
    return [sys.executable, "-c", code, *map(str, args)]


def run_cli(*args: object, **kwargs) -> subprocess.CompletedProcess:
    """Run ``energon-platform ARGS...`` to completion, its output captured as text.

    ``kwargs`` go to :func:`subprocess.run` (``cwd``, ``env``, ``timeout``, ``input``...); output is
    captured unless ``kwargs`` say where it goes.
    """
    if "stdout" not in kwargs and "stderr" not in kwargs:
        kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(cli_argv(*args), **kwargs)


def run_python(code: str, *args: object, **kwargs) -> subprocess.CompletedProcess:
    """Run ``python -c CODE ARGS...`` in a fresh interpreter (this one's), from the repository
    root unless ``cwd`` is given; output captured as text, as `run_cli`."""
    from tests.helpers import REPO

    kwargs.setdefault("cwd", REPO)
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(python_argv(code, *args), **kwargs)


def start_python(code: str, *args: object, **kwargs) -> subprocess.Popen:
    """Start ``python -c CODE ARGS...`` in a fresh interpreter (this one's), its stdout a text
    pipe (for the lines it prints as it gets where a test waits for it); ``kwargs`` go to
    :class:`subprocess.Popen`."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("text", True)
    return subprocess.Popen(python_argv(code, *args), **kwargs)
