"""Checkpoint faults of long runs: a full disk mid-write, two runs on one checkpoint folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from energon_platform.training import checkpoint
from energon_platform.training.checkpoint import CheckpointError, RunLock


def _tmpfs(path, size="64k") -> bool:
    """Mount a size-limited tmpfs at ``path`` where the machine allows it (root in a sandbox may not)."""
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _save(root, step, model_state):
    return checkpoint.save(root, step, 0, 1, model_state=model_state, loader_state={"position": step})


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
        with pytest.raises(CheckpointError, match=r"no space left on the device \(.* MiB needed for this file"):
            _save(root, 10, big)
        monkeypatch.undo()
        assert (root / "latest").read_text() == "step_000005"
        assert not list(root.glob(".tmp-*")), "nothing half-written stays behind"
        assert checkpoint.load_newest(root, 0).content["step"] == 5
    finally:
        if mounted:
            subprocess.run(["umount", str(root)], check=False)


def test_a_second_run_on_the_same_checkpoint_folder_is_refused(tmp_path):
    with RunLock(tmp_path / "ckpt"):
        with pytest.raises(CheckpointError, match=rf"another training run is using .*pid {os.getpid()}"):
            with RunLock(tmp_path / "ckpt"):
                pass
    with RunLock(tmp_path / "ckpt"):  # released when the first run ends
        pass


def test_a_sigkilled_holder_does_not_leave_the_lock_stuck(tmp_path):
    code = ("import sys, time; from energon_platform.training.checkpoint import RunLock\n"
            f"with RunLock({str(tmp_path / 'ckpt')!r}):\n    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(CheckpointError, match=f"pid {holder.pid}"):
        RunLock(tmp_path / "ckpt").__enter__()
    holder.kill()
    holder.wait()
    time.sleep(0.1)
    with RunLock(tmp_path / "ckpt"):
        pass
