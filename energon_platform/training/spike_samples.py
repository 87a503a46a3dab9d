"""From a loss spike to its samples: ``energon-platform spikes`` (see docs/spikes.md).

The log gives the losses (`step_log_readers`'s formats); the
samples of a step come from `Tracer` (the run's config
and checkpoint), never from the log. The log's ``keys`` (when logged) are checked against them,
and its ``sample_losses`` (when logged) attached to them and ranked within the step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "LogRows",
    "step_samples",
    "exclude_rules",
    "format_spike",
]


class LogRows:
    """The step rows of log ``path`` in format ``fmt`` (a reader of
    `get_format`), each step once: where a
    resumed run logged steps again, the later rows replace the earlier (as ``read_steps``).
    Iterating streams the file twice (the first pass notes only where steps go back: O(resumes)
    memory); ``skipped``: lines that were no step (a torn or corrupt line), and ``rows``: the
    step rows read, both counted by the last iteration."""

    def __init__(self, path: str | Path, fmt: Any):
        self.path, self.fmt = Path(path), fmt
        self.skipped = self.rows = 0

    def _lines(self) -> Iterator[tuple[int, dict | None]]:
        """``(line number, row or None)`` of every non-empty complete line."""
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f):
                if not raw.endswith(b"\n"):
                    return  # a line a kill cut is not a step yet
                line = raw.decode("utf-8", errors="replace")
                if line.strip():
                    yield number, self.fmt.parse_line(line)

    def _superseded_from(self) -> list[tuple[int, int]]:
        """``[(line, first step)]`` for every line whose step is not after the step before it
        (a restart), with ``first step`` the smallest step logged at or after that line's
        restart (rows before ``line`` with a step at or above it were logged again later)."""
        restarts, last = [], None
        for number, row in self._lines():
            if row is None:
                continue
            if last is not None and row["step"] <= last:
                restarts.append((number, row["step"]))
            last = row["step"]
        out, low = [], math.inf
        for number, step in reversed(restarts):
            low = min(low, step)
            out.append((number, low))
        return out[::-1]

    def __iter__(self) -> Iterator[dict]:
        restarts = self._superseded_from()
        self.skipped = self.rows = 0
        at = 0
        for number, row in self._lines():
            if row is None:
                self.skipped += 1
                continue
            self.rows += 1
            while at < len(restarts) and restarts[at][0] <= number:
                at += 1
            if at < len(restarts) and row["step"] >= restarts[at][1]:
                continue  # logged again after a later restart
            yield row


def _loss_ranks(losses: list[float]) -> list[int | None]:
    """1 for the highest loss of a step, 2 for the next...; None for a NaN (no targets)."""
    order = sorted((i for i, v in enumerate(losses) if v == v), key=lambda i: -losses[i])
    ranks: list[int | None] = [None] * len(losses)
    for r, i in enumerate(order, 1):
        ranks[i] = r
    return ranks


def step_samples(trace: dict, row: dict | None) -> dict:
    """The samples of a traced step (``Tracer.step``) joined with its log ``row``:
    ``{"samples": [...], "keys_agree": bool | None, "losses_logged": bool}``; each sample gets
    ``loss`` and ``loss_rank`` (1: the highest of the step) when the row logs
    ``sample_losses``; samples are sorted by loss, highest first, when logged. ``keys_agree``:
    whether the row's ``keys`` are trace's (as multisets; None when the row has none)."""
    samples = [dict(s) for s in trace["samples"]]
    logged_keys = (row or {}).get("keys")
    agree = None if logged_keys is None else sorted(logged_keys) == sorted(trace["keys"])
    losses = (row or {}).get("sample_losses")
    if not (agree and losses is not None and len(losses) == len(logged_keys)):
        return {"samples": samples, "keys_agree": agree, "losses_logged": False}
    by_key: dict[str, list[tuple[float, int | None]]] = {}
    for key, loss, rank in zip(logged_keys, losses, _loss_ranks(losses)):
        by_key.setdefault(key, []).append((loss, rank))
    for s in samples:
        s["loss"], s["loss_rank"] = by_key[s["key"]].pop(0)
    samples.sort(key=lambda s: (s["loss_rank"] is None, s["loss_rank"] or 0))
    return {"samples": samples, "keys_agree": agree, "losses_logged": True}


def exclude_rules(step: int, samples: list[dict], top: int | None) -> list[dict]:
    """``loader.exclude`` rules that skip ``samples`` (the first ``top``) from logged step
    ``step`` on: a rule's ``step`` counts global batches before it (``step - 1``)."""
    keys = list(dict.fromkeys(s["key"] for s in samples[:top]))
    return [{"step": step - 1, "keys": keys}]


def format_spike(spike: dict, listing: dict, top: int | None) -> str:
    """A spike as text: a header line, then one line per sample (the first ``top``)."""
    what = (
        "loss is not finite"
        if spike["kind"] == "nan"
        else f"z {spike['z']:.1f} over the median {spike['median']:.4f}"
    )
    lines = [f"step {spike['step']}  loss {spike['loss']:.4f}  ({what})"]
    for s in listing["samples"][:top]:
        loss = (
            f"  loss {s['loss']:.4f} (#{s['loss_rank']})"
            if s.get("loss_rank") is not None
            else ("  loss nan" if "loss" in s else "")
        )
        lines.append(
            f"  {s['dataset']}  {s['key']}  {s['shard']}  epoch {s['epoch']}  rank {s['rank']}"
            + loss
        )
    return "\n".join(lines)
