"""Checkpoint faults of long runs: a full disk mid-write, two runs on one checkpoint folder."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from energon_platform.training import checkpoint
from energon_platform.training.checkpoint import CheckpointError, RunLock
from energon_platform.training.resume_check.processes import torchrun_argv
from tests.helpers.cli import run_python, start_python


def _tmpfs(path, size="64k") -> bool:
    """Mount a size-limited tmpfs at ``path`` where the machine allows it (root in a sandbox may not)."""
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def _save(root, step, model_state):
    return checkpoint.save(
        root, step, 0, 1, model_state=model_state, loader_state={"position": step}
    )


def test_disk_full_during_a_checkpoint_keeps_the_previous_latest(tmp_path, monkeypatch):
    import torch

    root = tmp_path / "ckpt"
    mounted = _tmpfs(root)
    try:
        _save(root, 5, {"w": torch.zeros(10)})
        big = {"w": torch.zeros(1 << 16)}  # 256 KiB: more than a 64 KiB tmpfs holds
        if not mounted:  # no tmpfs here: the write fails the way a full disk makes it fail

            def full(fd):
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(
            CheckpointError, match=r"no space left on the device \(.* MiB needed for this file"
        ):
            _save(root, 10, big)
        monkeypatch.undo()
        assert (root / "latest").read_text() == "step_000005"
        assert not list(root.glob(".tmp-*")), "nothing half-written stays behind"
        assert checkpoint.load_newest(root, 0).content["step"] == 5
    finally:
        if mounted:
            subprocess.run(["umount", str(root)], check=False)


RANKS_SCRIPT = """
import errno, os, sys
from datetime import timedelta
import torch.distributed as dist
from energon_platform.training import checkpoint
from energon_platform.training.train import all_ranks_ok

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank, root = dist.get_rank(), sys.argv[1]
save = lambda step: checkpoint.save(root, step, rank, 2, model_state={"w": step} if rank == 0 else None,
                                    loader_state={"pos": step}, barrier=dist.barrier,
                                    all_ok=lambda ok: all_ranks_ok(ok, 2))
save(5)
if rank == 1:  # rank 1's disk is full
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    os.fsync = full
try:
    save(10)
    print(f"rank {rank}: saved", flush=True)
except checkpoint.CheckpointError as e:
    print(f"rank {rank}: CheckpointError: {e}", flush=True)
"""


@pytest.mark.slow
def test_disk_full_on_one_rank_stops_every_rank_at_once(tmp_path):
    """The rank that cannot write raises; the others raise too, at once, rather than waiting at a
    barrier until the process group times out (120 s here; the run below gets 90 s)."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    root = tmp_path / "ckpt"
    t0 = time.time()
    r = subprocess.run(
        torchrun_argv(2, script, root),
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = r.stdout + r.stderr[-3000:]
    assert "rank 1: CheckpointError: " in out and "no space left on the device" in out, out
    assert "rank 0: CheckpointError: " in out and "another rank could not write its part" in out, (
        out
    )
    assert time.time() - t0 < 60, out
    assert (root / "latest").read_text() == "step_000005"
    assert not list(root.glob(".tmp-*")), "nothing half-written stays behind"


def test_a_second_run_on_the_same_checkpoint_folder_is_refused(tmp_path):
    with RunLock(tmp_path / "ckpt"):
        with pytest.raises(
            CheckpointError, match=rf"another training run is using .*pid {os.getpid()}"
        ):
            with RunLock(tmp_path / "ckpt"):
                pass
    with RunLock(tmp_path / "ckpt"):  # released when the first run ends
        pass


def test_a_sigkilled_holder_does_not_leave_the_lock_stuck(tmp_path):
    code = (
        "import sys, time; from energon_platform.training.checkpoint import RunLock\n"
        f"with RunLock({str(tmp_path / 'ckpt')!r}):\n    print('held', flush=True); time.sleep(60)\n"
    )
    with start_python(code) as holder:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=f"pid {holder.pid}"):
            RunLock(tmp_path / "ckpt").__enter__()
        holder.kill()
    time.sleep(0.1)
    with RunLock(tmp_path / "ckpt"):
        pass


def test_a_run_that_wrote_nothing_leaves_no_lock_file_nor_folder_it_made(tmp_path):
    with RunLock(tmp_path / "out" / "checkpoints"):
        pass
    assert list(tmp_path.iterdir()) == []  # both folders were the lock's
    (tmp_path / "mine").mkdir()
    with RunLock(tmp_path / "mine" / "checkpoints"):
        pass
    assert [p.name for p in tmp_path.iterdir()] == ["mine"] and not any(
        (tmp_path / "mine").iterdir()
    )
    with RunLock(tmp_path / "out" / "checkpoints"):  # a checkpoint written: all of it stays
        (tmp_path / "out" / "checkpoints" / "step_000001").mkdir()
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir()) == [
        ".run.lock",
        "step_000001",
    ]


def test_a_lock_file_unlinked_while_it_is_being_locked_is_opened_again(tmp_path, monkeypatch):
    """A run that tidies up (unlinks its lock file) just after another opened the file: the other
    locks the unlinked file, sees it, and locks the new one, so two runs never both hold."""
    root = tmp_path / "ckpt"
    root.mkdir()
    real, locked = checkpoint.fcntl.lockf, []

    def lockf(fd, op):
        if not locked:
            (root / ".run.lock").unlink()  # the earlier run tidied up between open and lock
        locked.append(os.fstat(fd).st_ino)
        return real(fd, op)

    monkeypatch.setattr(checkpoint.fcntl, "lockf", lockf)
    with RunLock(root) as lock:
        assert len(locked) == 2 and os.path.samestat(os.fstat(lock._fd), os.stat(lock.path))
        monkeypatch.setattr(checkpoint.fcntl, "lockf", real)
        assert _lock_state_elsewhere(root) == "held"


def _lock_state_elsewhere(root) -> str:
    """``free`` or ``held``: what another process finds when it tries :class:`RunLock` on ``root``."""
    code = (
        "import sys; from energon_platform.training.checkpoint import CheckpointError, RunLock\n"
        f"try:\n    RunLock({str(root)!r}).__enter__()\n    print('free')\n"
        "except CheckpointError:\n    print('held')\n"
    )
    return run_python(code, cwd=None, timeout=60).stdout.strip()


def test_a_refused_second_lock_in_the_holding_process_keeps_the_first(tmp_path):
    with RunLock(tmp_path / "ckpt"):
        with pytest.raises(CheckpointError, match="another training run"):
            RunLock(tmp_path / "ckpt").__enter__()
        assert _lock_state_elsewhere(tmp_path / "ckpt") == "held"
    assert _lock_state_elsewhere(tmp_path / "ckpt") == "free"


def test_processes_forked_by_a_killed_holder_do_not_keep_the_lock(tmp_path):
    """A run forks helpers while it holds the lock (length index pool, loader workers); killed
    alone, it must leave the folder free even while such a child still lives."""
    code = (
        "import os, time; from energon_platform.training.checkpoint import RunLock\n"
        f"lock = RunLock({str(tmp_path / 'ckpt')!r}).__enter__()\n"
        "child = os.fork()\n"
        "if child == 0:\n    time.sleep(60); os._exit(0)\n"
        "print(child, flush=True); time.sleep(60)\n"
    )
    with start_python(code) as holder:
        child = int(holder.stdout.readline())
        try:
            holder.kill()
            holder.wait()
            os.kill(child, 0)  # the orphan still lives
            with RunLock(tmp_path / "ckpt"):
                pass
        finally:
            os.kill(child, signal.SIGKILL)


@pytest.fixture
def fs_steps(monkeypatch, tmp_path):
    """The file-system steps of this process under ``tmp_path``, in order: ``("write", name)`` (a
    file opened for writing), ``("fsync", name)`` (a file or a folder), ``("rename", old, new)``;
    names relative to ``tmp_path / "ckpt"`` (``"."`` is that folder itself)."""
    import builtins

    root = tmp_path / "ckpt"
    steps, names = [], {}  # fd → name
    real_open, real_os_open, real_fsync = builtins.open, os.open, os.fsync
    real_replace, real_rename = os.replace, os.rename

    def rel(path) -> str | None:
        try:
            return (
                os.path.relpath(os.fspath(path), root)
                if os.fspath(path).startswith(str(root))
                else None
            )
        except TypeError:  # a file descriptor
            return None

    def logged_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if rel(file) is not None:
            names[f.fileno()] = rel(file)
            if "w" in mode or "a" in mode:
                steps.append(("write", rel(file)))
        return f

    def logged_os_open(path, flags, *args, **kwargs):
        fd = real_os_open(path, flags, *args, **kwargs)
        if rel(path) is not None:
            names[fd] = rel(path)
        return fd

    def logged_fsync(fd):
        real_fsync(fd)
        if fd in names:
            steps.append(("fsync", names[fd]))

    def logged(real):
        def move(src, dst, *args, **kwargs):
            real(src, dst, *args, **kwargs)
            steps.append(("rename", rel(src), rel(dst)))

        return move

    monkeypatch.setattr(builtins, "open", logged_open)
    monkeypatch.setattr(os, "open", logged_os_open)
    monkeypatch.setattr(os, "fsync", logged_fsync)
    monkeypatch.setattr(os, "replace", logged(real_replace))
    monkeypatch.setattr(os, "rename", logged(real_rename))
    return root, steps


def test_checkpoint_save_makes_each_step_durable_before_the_next(fs_steps):
    """Crash safety of ``save`` (module doc) is an order of file-system steps: every file written
    and fsynced, the folder fsynced, renamed into place, the parent folder fsynced (else a crash
    can persist ``latest`` but not the rename it names), and only then ``latest`` written, fsynced,
    renamed and the parent fsynced again."""
    root, steps = fs_steps
    _save(root, 4, {"w": 1})
    steps.clear()
    final = _save(root, 5, {"w": 2})
    tmp, name = ".tmp-step_000005", "step_000005"
    files = sorted(p.name for p in final.iterdir())
    assert files == ["loader_rank0.json", "meta.json", "model.pt", "rng_rank0.pt"]
    cut = steps.index(("fsync", tmp)) if ("fsync", tmp) in steps else len(steps)
    written = [s[1] for s in steps[:cut] if s[0] == "write"]
    assert sorted(written) == [f"{tmp}/{f}" for f in files] and written[-1] == f"{tmp}/meta.json", (
        steps
    )
    assert steps[:cut] == [step for f in written for step in (("write", f), ("fsync", f))], (
        "each file fsynced right after it is written"
    )
    assert steps[cut:] == [
        ("fsync", tmp),
        ("rename", tmp, name),
        ("fsync", "."),
        ("write", "latest.tmp"),
        ("fsync", "latest.tmp"),
        ("rename", "latest.tmp", "latest"),
        ("fsync", "."),
    ], steps[cut:]
    assert (root / "latest").read_text() == name
