"""A step log any training loop can write, for ``energon-platform check-resume --cmd``.

    from energon_platform import StepLog

    log = StepLog(f"{out}/steps.jsonl")           # rank 0 writes; other ranks' calls do nothing
    for step in range(start + 1, steps + 1):
        batch = next(loader)
        loss = train_step(batch)
        log.write(step, loss.item(), keys=batch.keys, batch=[batch.tokens, batch.images])

Each call appends one JSON line and flushes and fsyncs it, so a SIGKILL loses at most the line
being written:

    {"step": 7, "loss": 5.91, "keys": ["000000000189", ...], "batch_sha256": "8fb7d776..."}

``keys`` (the sample keys of the step's global batch) and ``batch`` (its tensors: a tensor, or a
dict, list or tuple of them, nested; or digests already computed, see
[`batch_digest`][energon_platform.training.step_log_writer.batch_digest]) are optional. With both,
``check-resume`` judges exactly (same keys, same digests, loss identical); without them, by the loss
only (|Δloss| <= 0.01). Opening a log that a kill left with an unterminated last line cuts that line
first, so the next row starts on a line of its own; the readers skip such a torn line as well.

``sample_losses`` (each key's own loss, aligned with ``keys``) is optional too: ``energon-platform
spikes`` ranks a loss spike's samples by it; check-resume does not compare it.

Under ``torch.distributed`` only rank 0 writes (``rank=`` overrides; without an initialised
process group, the ``RANK`` environment variable torchrun sets). Rank 0 sees its own part of the
batch only: to log the global batch, gather each rank's keys and
[`batch_digest`][energon_platform.training.step_log_writer.batch_digest] first (see
``scripts/examples/torchtitan_style_loop.py``).

Only the standard library is imported (and ``torch``'s tensors used when the loop has imported
torch): the helper drops into any loop.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from energon_platform.training.digests import batch_digest

__all__ = ["StepLog", "batch_digest", "checked_sample_losses", "open_for_append"]


def checked_sample_losses(values: Any, keys: list[str] | None) -> list[float]:
    """``values`` (floats, or a 1-D tensor) as a list of floats aligned with ``keys``;
    ``ValueError`` (one line) without keys, for another length, or for a value that is not a
    number or is infinite (NaN is allowed: a sample without targets)."""
    if keys is None:
        raise ValueError("StepLog.write: sample_losses needs keys (one loss per key)")
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    if len(values) != len(keys):
        raise ValueError(
            f"StepLog.write: {len(values)} sample_losses for {len(keys)} keys; give one per key"
        )
    out = []
    for key, v in zip(keys, values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isinf(v):
            raise ValueError(
                f"StepLog.write: sample_losses of key {key!r} is {v!r}; expected a finite float "
                f"(or NaN)"
            )
        out.append(float(v))
    return out


def open_for_append(path: str | os.PathLike):
    """``path`` opened for appending (text), after cutting a last line a kill left unterminated."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        with open(path, "rb+") as f:
            end = f.seek(0, os.SEEK_END)
            if end and (f.seek(end - 1), f.read(1))[1] != b"\n":
                while True:  # back to the last newline, a block at a time
                    start = max(0, end - 65536)
                    f.seek(start)
                    block = f.read(end - start)
                    if b"\n" in block or start == 0:
                        f.truncate(start + block.rfind(b"\n") + 1)
                        break
                    end = start
    return open(path, "a", encoding="utf-8")


def _this_rank(rank: int | None) -> int:
    if rank is not None:
        return rank
    # a process group exists only if the loop imported it
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


class StepLog:
    """``StepLog(path, rank=None)``: append one JSON line per step (module doc). Opened lazily at
    the first `write`, so building it costs nothing; a context manager; `close` when done."""

    def __init__(self, path: str | os.PathLike, rank: int | None = None):
        self.path = Path(path)
        self.enabled = _this_rank(rank) == 0
        self._file = None

    def write(
        self,
        step: int,
        loss: float,
        keys: list[str] | None = None,
        batch: Any = None,
        sample_losses: Any = None,
        **extra: Any,
    ) -> None:
        """Log ``step`` (an int, the count of optimizer steps done, 1 for the first) and its
        ``loss`` (a float or a one-element tensor); ``keys``: sample keys of the step's batch;
        ``batch``: tensors to digest
        ([`batch_digest`][energon_platform.training.step_log_writer.batch_digest]);
        ``sample_losses``: each key's loss (aligned with ``keys``: a list of floats or a 1-D tensor;
        finite, or NaN for a sample without targets; ``energon-platform spikes`` ranks a step's
        samples by them); ``extra``: more JSON fields (e.g. ``resumed_from=step`` on the first row
        after a restore, which check-resume then verifies). ``ValueError`` for a ``sample_losses``
        that does not fit ``keys``."""
        if not self.enabled:
            return
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"StepLog.write: step must be an integer >= 0, got {step!r}")
        loss = float(loss.item() if hasattr(loss, "item") else loss)
        # NaN/Infinity as Python's json writes them
        row: dict[str, Any] = {
            "step": step,
            "loss": loss,
        }
        if keys is not None:
            row["keys"] = [str(k) for k in keys]
        if sample_losses is not None:
            row["sample_losses"] = checked_sample_losses(sample_losses, row.get("keys"))
        if batch is not None:
            row["batch_sha256"] = batch_digest(batch)
        row.update(extra)
        if self._file is None:
            self._file = open_for_append(self.path)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
