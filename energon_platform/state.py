"""The saved loader state: plain JSON data, versioned, with a fingerprint of what must match.

A state loads with ``json.loads`` (no pickle, no code). It is tiny and the same shape at any
position: the schedule makes the position one number (see :mod:`energon_platform.schedule`).

``fingerprint`` holds everything that changes *which* data a position means: dataset identity
(Energon index uuid, split, shard list digest), the task encoder's config, the seed, the global
batch size, pack group size and shuffle setting. Any difference is refused with a message naming
it. ``layout`` (world size, workers, micro-batch size) is recorded but may change between save and
restore, as long as the new layout can split the same global batches (the schedule checks that).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

#: Version 1: a rank's next micro-batch, micro-batches per global batch, fingerprint, layout.
STATE_VERSION = 1


class StateMismatchError(ValueError):
    """A saved loader state belongs to other data or another config; names what differs."""


@dataclass(frozen=True)
class LoaderState:
    version: int
    fingerprint: dict
    next_microbatch: int  #: this rank's micro-batches consumed so far
    accumulation: int  #: micro-batches per global batch on this rank when saved
    layout: dict  #: {"rank", "world_size", "num_workers", "micro_items"} when saved

    @property
    def next_global_batch(self) -> int:
        """The global batch the run continues with (the one in progress if saved mid-step)."""
        return self.next_microbatch // self.accumulation

    @property
    def mid_step(self) -> bool:
        return self.next_microbatch % self.accumulation != 0

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> "LoaderState":
        if not isinstance(data, dict):
            raise StateMismatchError(f"loader state must be a mapping, got {type(data).__name__}")
        version = data.get("version")
        if version != STATE_VERSION:
            raise StateMismatchError(f"loader state version {version!r} is not supported (this build reads {STATE_VERSION})")
        try:
            state = cls(version=version, fingerprint=dict(data["fingerprint"]),
                        next_microbatch=int(data["next_microbatch"]), accumulation=int(data["accumulation"]),
                        layout=dict(data["layout"]))
        except (KeyError, TypeError, ValueError) as e:
            raise StateMismatchError(f"loader state is malformed: {type(e).__name__}: {e}") from None
        if state.next_microbatch < 0 or state.accumulation < 1:
            raise StateMismatchError("loader state is malformed: negative position or accumulation")
        return state

    @classmethod
    def from_json(cls, text: str) -> "LoaderState":
        return cls.from_dict(json.loads(text))


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def fingerprint_differences(saved: dict, current: dict) -> list[str]:
    """``["dataset.num_samples: saved 286, now 300", ...]`` for every leaf that differs."""
    a, b = _flatten(saved), _flatten(current)
    return [f"{k}: saved {a.get(k, '<absent>')!r}, now {b.get(k, '<absent>')!r}"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_fingerprint(saved: dict, current: dict) -> None:
    diff = fingerprint_differences(saved, current)
    if diff:
        shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
        raise StateMismatchError(f"the checkpoint's data loader state does not match this run ({shown}). "
                                 f"Resume with the dataset and config it was saved with; the data is never restarted silently")
