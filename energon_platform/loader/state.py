"""The saved loader state: plain JSON data, versioned, with a fingerprint of what must match.

A state loads with ``json.loads`` (no pickle, no code). It is tiny and the same shape at any
position: the schedule makes the position one number (see `energon_platform.loader.schedule`).

``fingerprint`` holds everything that changes *which* data a position means: dataset identity
(Energon index uuid, split, shard list digest), the task encoder's config, the seed, the global
batch size, pack group size and shuffle setting. Any difference is refused with a message naming
it. ``layout`` (world size, workers, micro-batch size) is recorded but may change between save and
restore, as long as the new layout can split the same global batches (the schedule checks that).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from energon_platform.loader.exclusions import Exclusion

#: Version 2: a rank's next micro-batch, micro-batches per global batch, fingerprint, layout, the
#: blend history (segments of weights over the named datasets) and per-dataset accounting.
#: Version 1 (epoch-array schedule) positions mean other samples and are refused.
STATE_VERSION = 2


class StateMismatchError(ValueError):
    """A saved loader state belongs to other data or another config; names what differs."""


@dataclass(frozen=True)
class LoaderState:
    version: int
    fingerprint: dict
    next_microbatch: int  #: this rank's micro-batches consumed so far
    accumulation: int  #: micro-batches per global batch on this rank when saved
    layout: dict  #: {"rank", "world_size", "num_workers", "micro_items"} when saved
    datasets: list  #: dataset names in schedule order
    blend: list  #: segments ``[{"start": unit, "weights": ["1/4", ...]}, ...]`` (one weight per dataset)
    consumed: (
        list  #: per dataset ``{"samples", "epochs"}`` before the next global batch (informational)
    )
    #: with ``loader.balance``: where planning of the next global batch starts,
    #: ``{"batch", "position", "carried": [stream positions]}`` (`PlanState`);
    #: ``measured`` adds ``"costs"``, the cost history (`cost_history`)
    plan: dict | None = None
    #: ``loader.exclude``'s history: ``[{"start", "end", "keys", "shards", "datasets"}, ...]``
    #: (`Exclusion`); None: nothing ever excluded
    exclude: list | None = None
    #: ``loader.blend_adapt``'s mixer (`BlendAdapter.state_dict`: its settings, datasets, the
    #: losses summed since its last update, the method's state); None: fixed weights. The weights
    #: it decided are segments of ``blend``, those not yet in force included
    blend_adapt: dict | None = None

    @property
    def next_global_batch(self) -> int:
        """The global batch the run continues with (the one in progress if saved mid-step)."""
        return self.next_microbatch // self.accumulation

    @property
    def mid_step(self) -> bool:
        return self.next_microbatch % self.accumulation != 0

    def to_dict(self) -> dict:
        """The state as plain data; ``blend_adapt`` only when set (a run with fixed weights saves
        the bytes it saved before online mixing existed)."""
        data = asdict(self)
        if data["blend_adapt"] is None:
            del data["blend_adapt"]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> LoaderState:
        """Validate a state read from a checkpoint: exact keys, exact types (no ``"5"`` for 5, no
        floats, no bools), positions in range. Anything else is a
        [`StateMismatchError`][energon_platform.loader.state.StateMismatchError] naming the field: a
        tampered or hand-edited state never restarts the data silently."""
        if not isinstance(data, dict):
            raise StateMismatchError(f"loader state must be a mapping, got {type(data).__name__}")
        version = data.get("version")
        if version != STATE_VERSION or isinstance(version, bool):
            raise StateMismatchError(
                f"loader state version {version!r} is not supported (this build reads {STATE_VERSION})"
            )
        unknown, missing = sorted(set(data) - _FIELDS), sorted(_REQUIRED - set(data))
        if unknown or missing:
            raise StateMismatchError(
                "loader state is malformed: "
                + "; ".join(
                    ([f"unknown field(s) {unknown}"] if unknown else [])
                    + ([f"missing field(s) {missing}"] if missing else [])
                )
            )
        _require(data, "fingerprint", dict)
        _require(data, "layout", dict)
        _require(data, "datasets", list)
        _require(data, "blend", list)
        _position(data, "next_microbatch", low=0)
        _position(data, "accumulation", low=1)
        if not data["datasets"] or not all(isinstance(n, str) for n in data["datasets"]):
            raise StateMismatchError(
                "loader state is malformed: datasets must be a non-empty list of names"
            )
        blend = []
        for i, seg in enumerate(data["blend"]):
            if not isinstance(seg, dict) or set(seg) != {"start", "weights"}:
                raise StateMismatchError(
                    f"loader state is malformed: blend[{i}] must be {{start, weights}}"
                )
            _position(seg, "start", low=0, where=f"blend[{i}].")
            weights = seg["weights"]
            if (
                not isinstance(weights, list)
                or len(weights) != len(data["datasets"])
                or not all(isinstance(w, str) and _is_weight(w) for w in weights)
            ):
                raise StateMismatchError(
                    f"loader state is malformed: blend[{i}].weights must be "
                    f"{len(data['datasets'])} non-negative fractions as strings"
                )
            blend.append({"start": seg["start"], "weights": list(weights)})
        if (
            not blend
            or blend[0]["start"] != 0
            or any(b["start"] <= a["start"] for a, b in zip(blend, blend[1:]))
        ):
            raise StateMismatchError(
                "loader state is malformed: blend segments must start at 0 and increase"
            )
        consumed = data.get("consumed", [])
        return cls(
            version=version,
            fingerprint=data["fingerprint"],
            next_microbatch=data["next_microbatch"],
            accumulation=data["accumulation"],
            layout=data["layout"],
            datasets=list(data["datasets"]),
            blend=blend,
            consumed=consumed if isinstance(consumed, list) else [],
            plan=_plan(data.get("plan")),
            exclude=_exclude(data.get("exclude")),
            blend_adapt=_blend_adapt(data.get("blend_adapt")),
        )

    @classmethod
    def from_json(cls, text: str) -> LoaderState:
        return cls.from_dict(json.loads(text))


_REQUIRED = {
    "version",
    "fingerprint",
    "next_microbatch",
    "accumulation",
    "layout",
    "datasets",
    "blend",
}
_FIELDS = _REQUIRED | {"consumed", "plan", "exclude", "blend_adapt"}
#: No real run reaches this many micro-batches; a larger position is a corrupted or edited state.
MAX_POSITION = 2**53


def _require(data: dict, key: str, kind: type, where: str = "") -> None:
    if not isinstance(data[key], kind):
        raise StateMismatchError(
            f"loader state is malformed: {where}{key} must be a {kind.__name__}, "
            f"got {type(data[key]).__name__} {data[key]!r}"
        )


def _position(data: dict, key: str, low: int, where: str = "") -> None:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_POSITION:
        raise StateMismatchError(
            f"loader state is malformed: {where}{key} must be an integer in "
            f"[{low}, 2**53], got {value!r}"
        )


def _blend_adapt(saved: Any) -> dict | None:
    """A saved mixer: None, or a mapping (its fields are checked by the run's `BlendAdapter`)."""
    if saved is not None and not isinstance(saved, dict):
        raise StateMismatchError(
            f"loader state is malformed: blend_adapt must be a mapping or null, got {saved!r}"
        )
    return saved


def _plan(plan: Any) -> dict | None:
    """A saved plan state, checked: ``{"batch", "position", "carried"}`` of integers in range,
    and with ``loader.balance: measured`` its cost history ``costs`` (a list, whose entries the
    batching mode checks)."""
    if plan is None:
        return None
    keys = {"batch", "position", "carried"}
    if not isinstance(plan, dict) or not keys <= set(plan) <= keys | {"costs"}:
        raise StateMismatchError(
            "loader state is malformed: plan must be {batch, position, carried[, costs]}"
        )
    if not isinstance(plan.get("costs", []), list):
        raise StateMismatchError("loader state is malformed: plan.costs must be a list")
    _position(plan, "batch", low=0, where="plan.")
    _position(plan, "position", low=0, where="plan.")
    carried = plan["carried"]
    if not isinstance(carried, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and 0 <= p < plan["position"]
        for p in carried
    ):
        raise StateMismatchError(
            "loader state is malformed: plan.carried must list stream positions below plan.position"
        )
    if any(b <= a for a, b in zip(carried, carried[1:])):  # a position twice would be trained twice
        raise StateMismatchError(
            "loader state is malformed: plan.carried must list each stream position once, "
            "in increasing order"
        )
    checked = {"batch": plan["batch"], "position": plan["position"], "carried": list(carried)}
    return {**checked, "costs": list(plan["costs"])} if "costs" in plan else checked


def _exclude(rules: Any) -> list | None:
    """A saved exclusion history, checked rule by rule."""
    if rules is None:
        return None
    if not isinstance(rules, list):
        raise StateMismatchError("loader state is malformed: exclude must be a list of rules")
    try:
        return [Exclusion.from_json(r).to_json() for r in rules]
    except ValueError as e:
        raise StateMismatchError(f"loader state is malformed: exclude: {e}") from None


def _is_weight(text: str) -> bool:

    try:
        return Fraction(text) >= 0
    except (ValueError, ZeroDivisionError):
        return False


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
    return [
        f"{k}: saved {a.get(k, '<absent>')!r}, now {b.get(k, '<absent>')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]


def check_fingerprint(saved: dict, current: dict) -> None:
    diff = fingerprint_differences(saved, current)
    if diff:
        shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
        raise StateMismatchError(
            f"the checkpoint's data loader state does not match this run ({shown}). "
            f"Resume with the dataset and config it was saved with; the data is never restarted silently"
        )
