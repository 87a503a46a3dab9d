"""Megatron-LM's per-data-parallel-rank dataloader state files: where they live, writing and reading
them. Their format (``torch.save`` of plain data, read with ``weights_only=True``) and why: the
package doc, [`energon_platform.integrations.megatron`][energon_platform.integrations.megatron].
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

from energon_platform.loader.state import StateMismatchError


def state_file(
    dataloader_save: str | os.PathLike,
    iteration: int,
    dp_rank: int,
    *,
    pipeline_parallel: bool = False,
) -> Path:
    """``{dataloader_save}/iter_{iteration:07d}/mp_rank_00/train_dataloader_dprank{dp_rank:03d}.pt``
    (``mp_rank_00_000`` when ``pipeline_parallel``), the path Megatron's ``get_checkpoint_name``
    gives the dataloader state (tensor rank 0, pipeline rank 0)."""
    mp = "mp_rank_00_000" if pipeline_parallel else "mp_rank_00"
    return (
        Path(dataloader_save)
        / f"iter_{int(iteration):07d}"
        / mp
        / f"train_dataloader_dprank{int(dp_rank):03d}.pt"
    )


def latest_iteration(dataloader_save: str | os.PathLike) -> int:
    """The highest ``iter_NNNNNNN`` folder in ``dataloader_save``; ``FileNotFoundError`` naming the
    folder when there is none. Prefer the iteration of the model checkpoint actually loaded
    (Megatron's ``args.iteration``): a later dataloader state would not match the model."""
    root = Path(dataloader_save)
    found = [
        int(m.group(1))
        for p in (root.iterdir() if root.is_dir() else ())
        if p.is_dir() and (m := re.fullmatch(r"iter_(\d{7,})", p.name))
    ]
    if not found:
        raise FileNotFoundError(
            f"{root}: no iter_NNNNNNN folder with a data loader state to restore"
        )
    return max(found)


def save_dataloader_state(
    train_iter: Any,
    dataloader_save: str | os.PathLike,
    iteration: int,
    dp_rank: int,
    *,
    pipeline_parallel: bool = False,
) -> Path:
    """Write ``train_iter.save_state()`` where Megatron's ``maybe_save_dataloader_state`` does, in
    its format (``torch.save({"dataloader_state_dict": state})``, plain data only), atomically
    (temporary file, fsync, rename). ``train_iter`` is a `MegatronTrainIterator` or
    Megatron's ``RerunDataIterator`` around one (its ``.iterable``). Call it at an iteration
    boundary on the first pipeline stage's tensor-parallel rank 0 of every data-parallel rank.
    Returns the path."""
    source = getattr(train_iter, "iterable", train_iter)
    # plain data, or TypeError here rather than in torch.load
    state = json.loads(json.dumps(source.save_state()))
    path = state_file(dataloader_save, iteration, dp_rank, pipeline_parallel=pipeline_parallel)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"dataloader_state_dict": state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_dataloader_state(path: str | os.PathLike) -> dict:
    """The loader state in a state file
    ([`save_dataloader_state`][energon_platform.integrations.megatron.state_files.save_dataloader_state]'s,
    Megatron's torch.save of our ``save_state()``, or the same content as JSON). Reads torch files
    with ``weights_only=True`` only. ``FileNotFoundError`` naming the path when it does not exist;
    `StateMismatchError` naming it when it holds no state of ours."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"data loader state {path} does not exist; the data is not restarted from scratch "
            f"(resume from an iteration whose state was saved, or start a fresh run)"
        )
    raw = path.read_bytes()
    try:
        if raw.lstrip()[:1] == b"{":
            content = json.loads(raw)
        else:
            content = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:
        raise StateMismatchError(
            f"{path}: not a data loader state this build can read without executing code "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"Energon's own savable-loader states are not compatible"
        ) from None
    if isinstance(content, dict) and "dataloader_state_dict" in content:
        content = content["dataloader_state_dict"]
    if not isinstance(content, dict) or "fingerprint" not in content:
        raise StateMismatchError(
            f"{path}: holds no energon_platform loader state "
            f"(expected {{'dataloader_state_dict': {{'version', 'fingerprint', ...}}}})"
        )
    return content


def resolve_state_file(
    dataloader_save: str | os.PathLike,
    iteration: int,
    dp_rank: int,
    dp_size: int,
    pipeline_parallel: bool,
) -> Path:
    """This rank's state file; after a change of data-parallel size, a new rank without a file of its
    own continues from rank 0's (saved at an iteration boundary, the position is the global batch)."""
    own = state_file(dataloader_save, iteration, dp_rank, pipeline_parallel=pipeline_parallel)
    if own.is_file():
        return own
    first = state_file(dataloader_save, iteration, 0, pipeline_parallel=pipeline_parallel)
    if first.is_file():
        saved_world = load_dataloader_state(first).get("layout", {}).get("world_size")
        if saved_world is not None and saved_world != dp_size and dp_rank >= saved_world:
            return first
    present = (
        sorted(p.name for p in own.parent.glob("train_dataloader_dprank*.pt"))
        if own.parent.is_dir()
        else []
    )
    raise FileNotFoundError(
        f"data loader state {own} does not exist (found there: {present or 'nothing'}); "
        f"the data is not restarted from scratch"
    )
