"""Atomic checkpoints of model, optimizer, scheduler, step, RNG states and every rank's loader.

Layout of ``DIR``:

    DIR/step_000020/model.pt        model, optimizer, scheduler state dicts (tensors + plain data)
    DIR/step_000020/rng_rank0.pt    torch/numpy/python RNG states of rank 0 (tensors + plain data)
    DIR/step_000020/loader_rank0.json   the loader state of rank 0 (plain JSON, see state.py)
    DIR/step_000020/meta.json       step, world size, file list with sha256; written last
    DIR/latest                      name of the newest complete checkpoint; replaced atomically

A checkpoint is written under ``DIR/.tmp-step_000020``, every file flushed and fsynced, the
folder renamed, and only then ``latest`` replaced. A process killed at any point leaves either the
previous checkpoint as latest or the new one complete.

Resuming (`load_newest`) takes the newest *complete* checkpoint: ``meta.json`` readable, every
file listed with the right sha256, its step matching the folder name. Candidates are the one
``latest`` names, then older ones, newest first (all ``step_*`` folders when ``latest`` is
missing); a corrupt one is skipped and the skip reported, so a damaged newest checkpoint falls back
to the previous good one instead of restarting. A ``latest`` that is not a checkpoint name, or
checkpoints of which none is usable, raise `CheckpointError` (one line). ``.pt`` files load
with ``torch.load(weights_only=True)`` (no code execution).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from storage.outputs import write_probe

# torch is imported inside the functions that use it: every command imports this module for
# CheckpointError, and torch at the top would multiply the command's start-up (scripts/bench/cli.py)


class CheckpointError(RuntimeError):
    """A checkpoint folder that cannot be written, found or read; one line naming the path."""


#: the lock files this process holds, by (device, inode) → the holder line written in them
_HELD: dict[tuple[int, int], str] = {}
_HELD_GUARD = threading.Lock()


class RunLock:
    """``with RunLock(ckpt_dir):`` one training run at a time per checkpoint folder.

    An exclusive POSIX record lock (``lockf``) on ``DIR/.run.lock``, held while the run lives: a
    second run pointed at the same folder gets a `CheckpointError` naming the holder (pid,
    host, start time). The lock belongs to the holding process alone: processes it forks (the
    length index's build pool, loader workers) do not hold it, and the kernel releases it when the
    holder dies, so a SIGKILLed run never leaves it held, however long its children take to end.
    Within one process a second ``RunLock`` on a held folder is refused the same way, without
    opening the file (closing any descriptor of it would release the process's lock).

    A run that wrote nothing there (it failed before its first checkpoint) leaves nothing: on exit
    the lock file goes when it is the folder's only file, and so do the folders the lock created,
    when empty. A process that locked the file just as it went finds it unlinked and locks afresh.
    """

    def __init__(self, root: str | Path):
        self.path = Path(root) / ".run.lock"
        self._fd: int | None = None
        self._key: tuple[int, int] | None = None
        #: the folders ``__enter__`` created, deepest first (removed on exit when left empty)
        self._made: list[Path] = []

    def __enter__(self) -> RunLock:
        with _HELD_GUARD:
            missing = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._made = [p for p in missing if p.is_dir()]
                held = _held_by_this_process(self.path)
                if held is not None:
                    raise self._busy(held)
                fd = self._locked()
            except OSError as e:
                raise CheckpointError(
                    f"{self.path.parent}: cannot write checkpoints there ({e.strerror or e})"
                ) from None
            holder = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode(), 0)
            st = os.fstat(fd)
            self._fd, self._key = fd, (st.st_dev, st.st_ino)
            _HELD[self._key] = holder
        return self

    def _locked(self) -> int:
        """A descriptor of the lock file, locked; the file is opened again when the one locked was
        unlinked meanwhile (a run that wrote nothing leaving the folder as it found it)."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    os.close(fd)
                    raise CheckpointError(
                        f"{self.path}: cannot lock it ({e.strerror or e})"
                    ) from None
                holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise self._busy(holder) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def __exit__(self, *exc) -> None:
        with _HELD_GUARD:
            if self._fd is not None:
                _HELD.pop(self._key, None)
                self._tidy()  # while the lock is held: no other run can be starting here
                os.close(self._fd)  # closing releases the lock
                self._fd = self._key = None

    def _tidy(self) -> None:
        """Remove the lock file when it is the folder's only file, then the folders `__enter__`
        made that are left empty (a run that failed before writing anything)."""
        try:
            if [p.name for p in self.path.parent.iterdir()] != [self.path.name]:
                return
            self.path.unlink()
            for folder in self._made:
                folder.rmdir()
        except OSError:  # something else appeared there, or a folder holds another file: kept
            return

    def _busy(self, holder: str) -> CheckpointError:
        return CheckpointError(
            f"{self.path.parent}: another training run is using this checkpoint folder "
            f"({holder}); wait for it to end, or choose another --out"
        )


def _held_by_this_process(path: Path) -> str | None:
    """The holder line of ``path`` when this process holds a `RunLock` on it, else None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return _HELD.get((st.st_dev, st.st_ino))


def writable_dir(path: str | Path, what: str) -> Path:
    """Create ``path`` if needed and prove a file can be written in it; `CheckpointError`
    naming it otherwise (read-only file system, no permission, a file in the way). Call it before
    any work whose result would go there."""
    path = Path(path)
    try:
        write_probe(path)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write {what} there ({e.strerror or e})") from None
    return path


def _fsync_write(path: Path, data: bytes) -> None:
    """Write, flush and fsync ``data``; a full disk (or quota) is a `CheckpointError` naming
    the path, the bytes this file needs and the space left."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        free = shutil.disk_usage(path.parent).free
        raise CheckpointError(
            f"{path}: no space left on the device ({len(data) / 2**20:.1f} MiB needed for this "
            f"file, {free / 2**20:.1f} MiB free); the previous checkpoint stays the latest. "
            f"Free space, or lower train.keep_checkpoints"
        ) from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _torch_bytes(obj: Any) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rng_state() -> dict:
    """Global RNG states as tensors and plain data (loadable with ``weights_only=True``)."""
    import torch

    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }


def set_rng_state(state: dict) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _step_dir(step: int) -> str:
    return f"step_{step:06d}"


def save(
    root: str | Path,
    step: int,
    rank: int,
    world_size: int,
    *,
    model_state: dict | None,
    loader_state: dict,
    barrier=lambda: None,
    all_ok=lambda ok: ok,
) -> Path:
    """Write one checkpoint. Every rank calls it; rank 0 also writes the model/optimizer file
    (replicated under data parallelism), renames the folder and marks it latest, after
    ``barrier()`` (``torch.distributed.barrier`` in multi-rank runs).

    ``all_ok(ok)``: whether every rank wrote its part (a collective in multi-rank runs, see
    `energon_platform.training.train.all_ranks_ok`). A rank whose write fails (a full disk)
    raises its own `CheckpointError`; every other rank raises one too, at once, instead of
    waiting at the next barrier for the process group to time out. The previous checkpoint stays
    the latest; the half-written folder is removed."""
    root = Path(root)
    name = _step_dir(step)
    tmp = root / f".tmp-{name}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    error = None
    try:
        _fsync_write(tmp / f"rng_rank{rank}.pt", _torch_bytes(rng_state()))
        _fsync_write(
            tmp / f"loader_rank{rank}.json", json.dumps(loader_state, sort_keys=True).encode()
        )
        if rank == 0:
            _fsync_write(tmp / "model.pt", _torch_bytes(model_state))
    except Exception as e:  # a full disk, or any other failed write: every rank must hear of it
        error = e
    # disk full somewhere: nothing half-written stays behind (nor is ever loaded)
    if not all_ok(error is None):
        shutil.rmtree(tmp, ignore_errors=True)
        raise error or CheckpointError(
            f"{tmp}: another rank could not write its part of checkpoint {name} (its "
            f"error names the file and the space needed); {root / 'latest'} still "
            f"names the previous checkpoint"
        )
    barrier()
    if rank == 0:
        files = sorted(p.name for p in tmp.iterdir())
        meta = {
            "step": step,
            "world_size": world_size,
            "files": {f: hashlib.sha256((tmp / f).read_bytes()).hexdigest() for f in files},
        }
        _fsync_write(tmp / "meta.json", json.dumps(meta, indent=1, sort_keys=True).encode())
        _fsync_dir(tmp)
        final = root / name
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)
        _fsync_write(root / "latest.tmp", name.encode())
        os.replace(root / "latest.tmp", root / "latest")
        _fsync_dir(root)
    barrier()
    return root / name


_STEP_DIR = re.compile(r"step_(\d+)")


def _step_of(name: str) -> int | None:
    m = _STEP_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


def _read_marker(root: Path) -> str | None:
    """The folder name in ``root/latest``; None when there is no marker."""
    marker = root / "latest"
    if not marker.exists():
        return None
    try:
        name = marker.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{marker}: unreadable ({type(e).__name__}); delete it to resume from the newest "
            f"complete checkpoint"
        ) from None
    if _step_of(name) is None:
        raise CheckpointError(
            f"{marker}: holds {name[:40]!r}, not a checkpoint name (step_NNNNNN); delete it to "
            f"resume from the newest complete checkpoint"
        )
    return name


def _step_dirs(root: Path) -> list[Path]:
    """``step_*`` folders, newest (highest step) first."""
    found = (
        [p for p in root.glob("step_*") if p.is_dir() and _step_of(p.name) is not None]
        if root.is_dir()
        else []
    )
    return sorted(found, key=lambda p: _step_of(p.name), reverse=True)


def exists(root: str | Path) -> bool:
    """Whether ``root`` holds any checkpoint (complete or not) or a ``latest`` marker."""
    root = Path(root)
    return (root / "latest").exists() or bool(_step_dirs(root))


def prune(root: str | Path, keep: int) -> None:
    """Remove all but the newest ``keep`` checkpoints by step number; never the one ``latest`` names."""
    root = Path(root)
    current = _read_marker(root)
    for p in _step_dirs(root)[keep:]:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)


def verify(path: Path) -> dict:
    """``meta.json`` of a complete checkpoint, after checking every file it lists (present, sha256)
    and that the files a resume needs are listed; `CheckpointError` saying what is wrong."""
    try:
        meta = json.loads((path / "meta.json").read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no meta.json (an incomplete checkpoint)") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{path / 'meta.json'}: unreadable ({type(e).__name__}: {e})"
        ) from None
    files = meta.get("files") if isinstance(meta, dict) else None
    if not (
        isinstance(files, dict)
        and isinstance(meta.get("step"), int)
        and isinstance(meta.get("world_size"), int)
        and meta["world_size"] >= 1
    ):
        raise CheckpointError(
            f"{path / 'meta.json'}: not a checkpoint description (step, world_size, files)"
        )
    if meta["step"] != _step_of(path.name):
        raise CheckpointError(
            f"{path / 'meta.json'}: says step {meta['step']}, but the folder is {path.name}"
        )
    needed = {
        "model.pt",
        *(
            f"{kind}_rank{r}.{ext}"
            for r in range(meta["world_size"])
            for kind, ext in (("rng", "pt"), ("loader", "json"))
        ),
    }
    if needed - set(files):
        raise CheckpointError(
            f"{path / 'meta.json'}: does not list {sorted(needed - set(files))[0]}"
        )
    for name, digest in files.items():
        try:
            data = (path / name).read_bytes()
        except OSError as e:
            raise CheckpointError(f"{path / name}: unreadable ({e.strerror or e})") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise CheckpointError(f"{path / name}: checksum mismatch; the checkpoint is corrupt")
    return meta


@dataclass(frozen=True)
class Found:
    """What `load_newest` (or `find`) chose: the folder, what it read, and the newer
    candidates it skipped, each ``"<path>: <why>"``."""

    path: Path
    content: Any
    skipped: tuple[str, ...] = ()


def find(root: str | Path, read: Callable[[Path], Any] = verify) -> Found | None:
    """The newest complete checkpoint in ``root`` (see module doc), read with ``read`` (which
    raises `CheckpointError` for a bad one). None when ``root`` holds no checkpoint at all."""
    root = Path(root)
    named = _read_marker(root)
    candidates = _step_dirs(root)
    if named is not None:
        top = _step_of(named)
        candidates = [root / named] + [p for p in candidates if _step_of(p.name) < top]
    skipped = []
    for path in candidates:
        try:
            return Found(path, read(path), tuple(skipped))
        except CheckpointError as e:
            skipped.append(str(e))
    if skipped:
        raise CheckpointError(
            f"{root}: no usable checkpoint ({'; '.join(skipped)}); pass another --out to start "
            f"a new run"
        )
    return None


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None when there is none (see `find`)."""
    found = find(root)
    return found.path if found else None


def newest_at_or_before(root: str | Path, step: int) -> Path | None:
    """The newest complete checkpoint folder in ``root`` saved at ``step`` or earlier (checked
    with `verify`; an incomplete or corrupt one is passed over); None when there is none."""
    for path in _step_dirs(Path(root)):
        if _step_of(path.name) > step:
            continue
        try:
            verify(path)
        except CheckpointError:
            continue
        return path
    return None


def copy_as_latest(src: Path, root: str | Path) -> Path:
    """Copy the checkpoint folder ``src`` into ``root`` (created if needed) and name it ``latest``
    there, so that a run resumed in ``root`` continues from it; ``src`` is only read."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{src.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, root / src.name)
    _fsync_write(root / "latest.tmp", src.name.encode())
    os.replace(root / "latest.tmp", root / "latest")
    _fsync_dir(root)
    return root / src.name


def load_newest(root: str | Path, rank: int) -> Found | None:
    """`find` with `load` of ``rank``: ``Found.content`` is the loaded checkpoint."""
    return find(root, lambda path: load(path, rank))


def load(path: Path, rank: int) -> dict:
    """``{"step", "world_size", "model_state", "rng", "loader_state"}`` of a checkpoint, for
    ``rank``; verifies it first (`verify`). A rank beyond the saved world size (elastic
    resume) gets rank 0's loader state: it is the same global position."""
    import torch

    meta = verify(path)
    src_rank = rank if rank < meta["world_size"] else 0
    try:
        return {
            "step": meta["step"],
            "world_size": meta["world_size"],
            "model_state": torch.load(path / "model.pt", weights_only=True),
            "rng": torch.load(path / f"rng_rank{src_rank}.pt", weights_only=True),
            "loader_state": json.loads((path / f"loader_rank{src_rank}.json").read_bytes()),
        }
    except Exception as e:  # the checksums matched, so these are files of another build or a bug
        first = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"{path}: cannot be loaded ({type(e).__name__}: {first})") from None


#: Files of a run's output folder besides its checkpoints: a folder holding one is a run's
RUN_FILES = ("run.json", "run.yaml", "log.jsonl")


def newest_in(path: str | Path) -> Path | None:
    """The checkpoint ``path`` names: itself when it is one (``step_000020``), else the newest
    complete one under a run's output folder or its ``checkpoints`` folder; None when there is
    none there (yet). `CheckpointError` when the only ones there are damaged (`find`)."""
    path = Path(path)
    if (path / "meta.json").is_file():
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    return latest(root) if root.is_dir() else None


def loader_state(path: str | Path) -> dict:
    """Rank 0's loader state of the checkpoint `newest_in` ``path`` finds (``trace
    --checkpoint``); `CheckpointError` when there is none: a run's output folder (it holds
    `RUN_FILES` or ``checkpoints``) is said to have no checkpoint yet."""
    path = Path(path)
    found = newest_in(path)
    if found is None:
        if (path / "checkpoints").is_dir() or any((path / f).is_file() for f in RUN_FILES):
            raise CheckpointError(
                f"{path}: the run has no checkpoint yet (none complete under "
                f"{path / 'checkpoints'})"
            )
        raise CheckpointError(
            f"{path}: no checkpoint there (a step_NNNNNN folder, or a run's output folder)"
        )
    verify(found)
    return json.loads((found / "loader_rank0.json").read_text())
