"""The command line as the tests run it: ``python -m energon_platform`` in a process of its own.

`run_cli` runs a command to completion. Most of a command's start is importing torch and the
libraries around it (about 3.7 s of CPU for ``train``, against well under a second of the
project's own imports), and the suite runs a few hundred commands on two cores, so `run_cli`
starts each one from a warm server (`tests.helpers.cli_server`, one per test process): a forked
child that has those libraries imported already, and imports the project afresh, in the command's
own directory, with its own stdout and stderr, exiting the usual way. Anything that would make
that child differ from a fresh interpreter falls back to one: an environment other than the one
the server started with (but for `PER_TEST`), input on stdin, output not captured, or an import
that printed something (the server then refuses to start). ``EP_TESTS_FRESH_CLI=1`` runs every command in a fresh
interpreter. `cli_argv` (for `subprocess.Popen`, where a test signals or kills the command), and
the processes that commands start themselves, are always fresh interpreters.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


def cli_argv(*args: object) -> list[str]:
    """The argv of ``energon-platform ARGS...`` run by this interpreter; each arg made a string."""
    return [sys.executable, "-m", "energon_platform", *map(str, args)]


def python_argv(code: str, *args: object) -> list[str]:
    """The argv of ``python -c CODE ARGS...`` run by this interpreter; each arg made a string."""
    return [sys.executable, "-c", code, *map(str, args)]


def run_cli(*args: object, **kwargs) -> subprocess.CompletedProcess:
    """Run ``energon-platform ARGS...`` to completion, its output captured as text.

    ``kwargs`` go to :func:`subprocess.run` (``cwd``, ``env``, ``timeout``, ``input``...); output is
    captured unless ``kwargs`` say where it goes. Started from the warm server where nothing in
    ``kwargs`` or the environment tells it apart from a fresh interpreter (module doc).
    """
    if "stdout" not in kwargs and "stderr" not in kwargs:
        kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    if set(kwargs) <= {"capture_output", "text", "timeout", "cwd"} and kwargs["capture_output"]:
        warm = _WarmServer.get()
        if warm is not None:
            return warm.run(
                [str(a) for a in args], kwargs.get("cwd"), kwargs.get("timeout"), kwargs["text"]
            )
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


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert that a finished command failed as a user's mistake should: exit status 2 and one
    line on stderr (no traceback), starting ``energon-platform `` and containing every needle.
    Returns the line."""
    return _one_line_refusal(r.returncode, r.stderr, needles)


def one_line_error_in_process(capsys, argv: list[str], *needles: str) -> str:
    """`one_line_error` for the command ``argv`` run in this process (``energon_platform.cli.main``,
    its stderr read from pytest's ``capsys``). Returns the line."""
    from energon_platform.cli import main

    status = main([str(a) for a in argv])
    return _one_line_refusal(status, capsys.readouterr().err, needles)


def _one_line_refusal(status: int, stderr: str, needles: tuple[str, ...]) -> str:
    lines = stderr.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in stderr, (status, stderr[-2000:])
    assert lines[0].startswith("energon-platform ") and all(n in lines[0] for n in needles), lines[
        0
    ]
    return lines[0]


class _WarmServer:
    """This test process's `tests.helpers.cli_server`, started at the first `run_cli`; one
    command at a time (a second, concurrent one runs in a fresh interpreter)."""

    _instance: _WarmServer | None = None
    _failed = False

    @classmethod
    def get(cls) -> _WarmServer | None:
        """The server, when it can stand for a fresh interpreter now (module doc); else None."""
        if os.environ.get("EP_TESTS_FRESH_CLI") == "1" or cls._failed:
            return None
        if cls._instance is None:
            try:
                cls._instance = cls()
            except (OSError, RuntimeError):
                cls._failed = True
                return None
        warm = cls._instance
        if _environ() != warm.environ or not warm.lock.acquire(blocking=False):
            return None
        warm.lock.release()
        return warm

    def __init__(self) -> None:
        self.environ = _environ()
        self.lock = threading.Lock()
        self.folder = tempfile.mkdtemp(prefix="ep-cli-")
        self.path = os.path.join(self.folder, "socket")
        server = Path(__file__).with_name("cli_server.py")
        self.process = subprocess.Popen(
            [sys.executable, str(server), self.path], stdout=subprocess.PIPE, text=True
        )
        atexit.register(self.close)
        if self.process.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the warm CLI server did not start")

    def run(
        self, args: list[str], cwd: object, timeout: float | None, text: bool
    ) -> subprocess.CompletedProcess:
        """`subprocess.run` of ``energon-platform ARGS`` in ``cwd``, output captured: the same
        result, the same `subprocess.TimeoutExpired` (the command killed) past ``timeout``."""
        argv = cli_argv(*args)
        request = json.dumps(
            {"args": args, "cwd": os.fspath(cwd) if cwd else os.getcwd(), "env": dict(os.environ)}
        )
        with (
            self.lock,
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn,
        ):
            try:
                conn.connect(self.path)
            except OSError:  # the server is gone: nothing started, a fresh interpreter runs it
                type(self)._failed = True
                return subprocess.run(
                    argv, capture_output=True, text=text, cwd=cwd, timeout=timeout
                )
            socket.send_fds(conn, [request.encode()], [out.fileno(), err.fileno()])
            pid = int(_answer(conn))
            conn.settimeout(timeout)
            try:
                code = int(_answer(conn))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                conn.settimeout(None)
                _answer(conn)
                # as `subprocess.run` raises it, text or not: the bytes read, None for none
                raise subprocess.TimeoutExpired(
                    argv,
                    timeout,
                    output=_read(out, False) or None,
                    stderr=_read(err, False) or None,
                ) from None
            return subprocess.CompletedProcess(argv, code, _read(out, text), _read(err, text))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


#: Variables passed to a command that do not make the server's imports stale: the test's name and
#: phase (pytest sets it for each test); one that tokenizers reads when it encodes, not when it is
#: imported (`task_encoders.tokenization` sets it when the test process imports it); and the
#: default that torch's compiler stack sets for itself when the test process imports it (the
#: server's imports set the same).
PER_TEST = frozenset({"PYTEST_CURRENT_TEST", "TOKENIZERS_PARALLELISM", "TORCHINDUCTOR_CACHE_DIR"})


def _environ() -> dict[str, str]:
    """This process's environment but for `PER_TEST`."""
    return {k: v for k, v in os.environ.items() if k not in PER_TEST}


def _answer(conn: socket.socket) -> str:
    """The server's next line (a pid or an exit status)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise RuntimeError("the warm CLI server closed the connection")
        data += chunk
    return data.decode()


def _read(file, text: bool) -> str | bytes:
    """What a command wrote to ``file``, decoded as `subprocess.run` with ``text`` does (the
    locale's encoding, universal newlines)."""
    file.seek(0)
    data = file.read()
    if not text:
        return data
    decoded = data.decode(locale.getpreferredencoding(False))
    return decoded.replace("\r\n", "\n").replace("\r", "\n")
