"""The check's trainer processes: started in sessions of their own, run to their end, or killed with
SIGKILL (their whole tree) once their step log shows a given step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from energon_platform.training.step_log_readers import (
    JsonLines,
    complete_length,
)


def torchrun_argv(nproc: int, *target: object) -> list[str]:
    """The argv of ``torchrun --standalone --nproc-per-node NPROC TARGET...`` run by this
    interpreter (``python -m torch.distributed.run``, which the ``torchrun`` command runs);
    ``target`` is a script and its arguments, or ``-m`` and a module and its arguments, each made a
    string. The one place the project's trainers, scripts and tests build a torchrun command."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *map(str, target),
    ]


class RunFailed(RuntimeError):
    """A trainer process failed or ended early; the message holds its output's tail."""


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once, like a node failure. (torchrun starts
    its workers in sessions of their own, so killing its process group is not enough.) The tree
    is frozen first (SIGSTOP, top down, until no new process appears): a process killed before
    its children would leave them to init, and a process still running could start another one
    (a loader worker) between the listing and the kill."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    frozen: dict[int, psutil.Process] = {}
    for _ in range(100):
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        new = [p for p in procs if p.pid not in frozen]
        if not new:
            break
        for p in new:
            try:
                p.send_signal(signal.SIGSTOP)
                frozen[p.pid] = p
            except psutil.NoSuchProcess:
                pass
    for p in frozen.values():
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(frozen.values()), timeout=30)


def run_command(
    cmd: list[str] | str, log: Path, timeout: float | None = None, cwd: str | None = None
) -> None:
    """Run ``cmd`` (a list, or a shell command line) to its end, output appended to ``log``;
    `RunFailed` with the output's tail when it fails or outlives ``timeout``."""
    with open(log, "ab") as f:
        proc = launch(cmd, f, cwd)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            raise RunFailed(
                f"still running after {timeout:g} s, killed: {_shown(cmd)}\n" + output_tail(log)
            ) from None
    if proc.returncode != 0:
        raise RunFailed(
            f"trainer failed (exit {proc.returncode}): {_shown(cmd)}\n" + output_tail(log)
        )


def _shown(cmd: list[str] | str) -> str:
    return cmd if isinstance(cmd, str) else " ".join(cmd)


def output_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def launch(cmd: list[str] | str, stdout: Any, cwd: str | None = None) -> subprocess.Popen:
    """Start ``cmd`` (a list, or a shell command line run by ``/bin/sh``) in a session of its own,
    stdout and stderr to the open file ``stdout``, Python's output unbuffered (so that a log line
    printed before a kill is in the file, and the kill lands where it was aimed)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd,
        shell=isinstance(cmd, str),
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
        cwd=cwd,
    )


class LogTail:
    """The steps a log has gained since it was opened: `steps` reads only what is new
    (complete lines), so polling a growing log every few milliseconds stays cheap."""

    def __init__(self, path: Path, fmt: Any = None):
        self.path, self.fmt = Path(path), fmt or JsonLines()
        self.offset = _size(self.path)
        self.logged: set[int] = set()

    def steps(self) -> set[int]:
        # cut back (a writer dropping a torn line): read on from its end
        if _size(self.path) < self.offset:
            self.offset = _size(self.path)
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.logged
        end = complete_length(data)
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            row = self.fmt.parse_line(line) if line.strip() else None
            if row is not None:
                self.logged.add(row["step"])
        self.offset += end
        return self.logged


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``ready()`` every 2 ms while ``proc`` runs, then SIGKILL its whole tree
    (`kill_tree`). `RunFailed` when the process ends first or ``timeout`` passes."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if ready():
            break
        time.sleep(0.002)
    if proc.poll() is not None:
        raise RunFailed(f"the run ended (exit {proc.returncode}) before {what}")
    if time.time() >= deadline:
        kill_tree(proc.pid)
        proc.wait()
        raise RunFailed(f"no {what} after {timeout:g} s; the run was killed")
    kill_tree(proc.pid)
    proc.wait()


def run_command_killed(
    cmd: list[str] | str,
    stdout_path: Path,
    log_path: Path,
    fmt: Any,
    kill_at: int,
    timeout: float,
    cwd: str | None = None,
) -> None:
    """Start ``cmd`` and SIGKILL its whole process tree once its log (``log_path``, read with
    ``fmt``) gains step ``kill_at - 1``: while step ``kill_at`` is in flight."""
    tail = LogTail(log_path, fmt)
    with open(stdout_path, "ab") as f:
        proc = launch(cmd, f, cwd)
        try:
            kill_when(
                proc, lambda: kill_at - 1 in tail.steps(), timeout, f"step {kill_at - 1} was logged"
            )
        except RunFailed as e:
            raise RunFailed(f"{e}; see {stdout_path}\n" + output_tail(stdout_path)) from None
