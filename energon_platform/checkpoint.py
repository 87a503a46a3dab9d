"""Atomic checkpoints of model, optimizer, scheduler, step, RNG states and every rank's loader.

Layout of ``DIR``::

    DIR/step_000020/model.pt        model, optimizer, scheduler state dicts (tensors + plain data)
    DIR/step_000020/rng_rank0.pt    torch/numpy/python RNG states of rank 0 (tensors + plain data)
    DIR/step_000020/loader_rank0.json   the loader state of rank 0 (plain JSON, see state.py)
    DIR/step_000020/meta.json       step, world size, file list with sha256; written last
    DIR/latest                      name of the newest complete checkpoint; replaced atomically

A checkpoint is written under ``DIR/.tmp-step_000020``, every file flushed and fsynced, the
folder renamed, and only then ``latest`` replaced. Loading reads ``latest``, checks ``meta.json``
and every file's sha256; ``.pt`` files load with ``torch.load(weights_only=True)`` (no code
execution). A process killed at any point leaves either the previous checkpoint as latest or the
new one complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


class CheckpointError(RuntimeError):
    pass


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _torch_bytes(obj: Any) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def rng_state() -> dict:
    """Global RNG states as tensors and plain data (loadable with ``weights_only=True``)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _step_dir(step: int) -> str:
    return f"step_{step:06d}"


def save(root: str | Path, step: int, rank: int, world_size: int, *, model_state: dict | None,
         loader_state: dict, barrier=lambda: None) -> Path:
    """Write one checkpoint. Every rank calls it; rank 0 also writes the model/optimizer file
    (replicated under data parallelism), renames the folder and marks it latest, after
    ``barrier()`` (``torch.distributed.barrier`` in multi-rank runs)."""
    root = Path(root)
    name = _step_dir(step)
    tmp = root / f".tmp-{name}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    _fsync_write(tmp / f"rng_rank{rank}.pt", _torch_bytes(rng_state()))
    _fsync_write(tmp / f"loader_rank{rank}.json", json.dumps(loader_state, sort_keys=True).encode())
    if rank == 0:
        _fsync_write(tmp / "model.pt", _torch_bytes(model_state))
    barrier()
    if rank == 0:
        files = sorted(p.name for p in tmp.iterdir())
        meta = {"step": step, "world_size": world_size,
                "files": {f: hashlib.sha256((tmp / f).read_bytes()).hexdigest() for f in files}}
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


def prune(root: str | Path, keep: int) -> None:
    """Remove all but the newest ``keep`` checkpoints by step number; never the one ``latest`` names."""
    root = Path(root)
    current = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
    steps = sorted((p for p in root.glob("step_*") if p.is_dir() and p.name.split("_")[1].isdigit()),
                   key=lambda p: int(p.name.split("_")[1]))
    for p in steps[:-keep]:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None when there is none."""
    root = Path(root)
    marker = root / "latest"
    if not marker.is_file():
        return None
    path = root / marker.read_text().strip()
    if not (path / "meta.json").is_file():
        raise CheckpointError(f"{marker} names {path.name}, which has no meta.json")
    return path


def load(path: Path, rank: int) -> dict:
    """``{"step", "world_size", "model_state", "rng", "loader_state"}`` of a checkpoint, for
    ``rank``; verifies every file against ``meta.json``. A rank beyond the saved world size
    (elastic resume) gets rank 0's loader state: it is the same global position."""
    meta = json.loads((path / "meta.json").read_text())
    for name, digest in meta["files"].items():
        if hashlib.sha256((path / name).read_bytes()).hexdigest() != digest:
            raise CheckpointError(f"{path / name}: checksum mismatch; the checkpoint is corrupt")
    src_rank = rank if rank < meta["world_size"] else 0
    return {
        "step": meta["step"],
        "world_size": meta["world_size"],
        "model_state": torch.load(path / "model.pt", weights_only=True),
        "rng": torch.load(path / f"rng_rank{src_rank}.pt", weights_only=True),
        "loader_state": json.loads((path / f"loader_rank{src_rank}.json").read_text()),
    }
