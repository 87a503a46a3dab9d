"""A warm start for ``energon-platform`` in the tests: `tests.helpers.cli.run_cli`'s server.

Run as ``python cli_server.py SOCKET``: imports the heavy third-party libraries the CLI imports
(torch with its compiler stack, torchvision, torchaudio, transformers' tokenizer, Energon,
webdataset), then serves on the Unix socket ``SOCKET``. A request is one JSON object,
``{"args": [...], "cwd": ..., "env": {...}}``, with the command's stdout and stderr file
descriptors passed along. It runs in a forked child: the fds become its stdout and stderr (stdin
is empty), it takes the request's environment (the client sends only one that equals the server's
but for `tests.helpers.cli.PER_TEST`) and directory, and runs ``python -m energon_platform ARGS`` there
(`runpy`; ``sys.path[0]`` the directory, as ``-m`` sets it). So everything of the project is
imported afresh, in the child, and the interpreter exits the usual way (``atexit`` handlers,
flushed streams). The server answers the child's pid, then its exit status (``-N``: killed by
signal N), as `subprocess` reports it.

Nothing of the project is imported here, and anything an import prints makes the server refuse to
start (exit status 3): a fresh interpreter would print it on every command's streams, which the
tests read. The server quits when its parent (the test process) is gone.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys

#: Seconds between looks at whether the test process that started the server is still there.
PARENT_POLL_S = 2.0


def _preimport() -> str:
    """Import the heavy libraries; what they printed (empty when nothing)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        import megatron.energon  # noqa: F401
        import torch  # noqa: F401
        import torch.optim  # noqa: F401
        import torchaudio  # noqa: F401
        import torchvision  # noqa: F401
        import webdataset  # noqa: F401
        from transformers import PreTrainedTokenizerFast  # noqa: F401
    return out.getvalue() + err.getvalue()


def _serve(path: str, parent: int) -> dict | None:
    """Serve requests until the parent is gone (None); in a forked child, its request."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    server.settimeout(PARENT_POLL_S)
    print("ready", flush=True)
    while os.getppid() == parent:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(None)
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                server.close()
                os.dup2(fds[0], 1)
                os.dup2(fds[1], 2)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                for fd in (*fds, null):
                    os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            _, status = os.waitpid(pid, 0)
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    return None


def as_fresh() -> None:
    """In a forked child: what differs from a fresh interpreter and can be put right. NumPy's
    global random state was seeded once, from the OS's entropy, when the server imported it:
    every child would draw the same numbers, and a run that (wrongly) used them would agree with
    another run where fresh interpreters would not. It is seeded from the OS's entropy again, as
    a fresh interpreter seeds it. (Python's `random` seeds itself again after a fork; torch's
    default generator starts from the same fixed seed in every fresh interpreter. The string hash
    seed stays the server's: a command's runs share it.)"""
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def main() -> None:
    path, parent = sys.argv[1], os.getppid()
    if _preimport():
        sys.exit(3)
    # what the imports made is frozen before any fork (as `gc.freeze` advises): a child's
    # collections then skip it, and do not touch, so copy, the pages it shares with the server
    import gc

    gc.freeze()
    request = _serve(path, parent)
    if request is None:
        return
    as_fresh()
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()
    sys.argv = ["-m", *request["args"]]
    import runpy

    runpy.run_module("energon_platform", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
