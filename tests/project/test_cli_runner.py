"""The tests' CLI runner (`tests.helpers.cli.run_cli`): a command started from the warm server
gives what a fresh interpreter gives, and falls back to one where it could differ."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import cli


def test_a_warm_command_gives_what_a_fresh_interpreter_gives(tmp_path, monkeypatch):
    assert cli._WarmServer.get() is not None  # started (if not yet) in the directory it was
    monkeypatch.chdir(tmp_path)  # a relative path resolves against the command's directory
    (tmp_path / "here").mkdir()
    commands = [("--help",), ("info", "here"), ("train", "--config", "missing.yaml")]
    warm = [cli.run_cli(*c, timeout=120) for c in commands]
    monkeypatch.setenv("EP_TESTS_FRESH_CLI", "1")
    assert cli._WarmServer.get() is None
    fresh = [cli.run_cli(*c, timeout=120) for c in commands]
    for w, f in zip(warm, fresh):
        assert (w.args, w.returncode, w.stdout, w.stderr) == (
            f.args,
            f.returncode,
            f.stdout,
            f.stderr,
        )
    assert [r.returncode for r in warm] == [0, 2, 2] and "here" in warm[1].stderr


def test_another_environment_runs_in_a_fresh_interpreter(monkeypatch):
    assert cli._WarmServer.get() is not None
    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")  # read by torch when it is imported
    assert cli._WarmServer.get() is None


def test_a_warm_command_past_its_timeout_is_killed_and_the_next_one_runs():
    """The error `subprocess.run` raises, with what it holds: bytes read so far (None for
    none), even for a command run with ``text=True``."""
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        cli.run_cli("--help", timeout=0.01)
    assert all(
        out is None or isinstance(out, bytes)
        for out in (timed_out.value.output, timed_out.value.stderr)
    )
    assert cli.run_cli("--help", timeout=120).returncode == 0


def test_forked_commands_draw_numpys_global_random_numbers_afresh():
    """Two children forked from one process (as the server forks its commands) after
    `cli_server.as_fresh` draw different NumPy numbers, as two fresh interpreters would; without
    it they draw the same ones."""
    import os

    import numpy as np

    from tests.helpers import cli_server

    np.random.random()  # the global state exists before the fork, as in the server

    def child_draws(fresh: bool) -> float:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child)
            os.close(read)
            if fresh:
                cli_server.as_fresh()
            os.write(write, repr(float(np.random.random())).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            value = float(f.read())
        assert os.waitpid(pid, 0)[1] == 0
        return value

    assert child_draws(False) == child_draws(False)
    assert child_draws(True) != child_draws(True)
