"""The cost models a measured run (``loader.balance: measured``) has planned with, by global batch.

A cost file may change at resume, as blend weights may: the global batches before the resume stay
planned with the cost model they were planned with, those from it on use the new one. The
`CostHistory` holds one entry per cost model (``batch``: the first global batch it plans,
its digest and coefficients); a measured run's loader state keeps it (``plan.costs``), so a later
resume, or a trace from a later checkpoint, replays every earlier global batch exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from energon_platform.loader.balance.cost_file import (
    CostModel,
    coefficient_ok,
    names_of,
    row_width_ok,
)
from energon_platform.loader.state import StateMismatchError
from task_encoders.features import FEATURES, MICRO_BATCH_FEATURES


@dataclass(frozen=True)
class CostEntry:
    """The cost model in force from global batch ``batch`` on, and the planner's cost with it."""

    batch: int
    model: CostModel
    cost: Any  #: ``cost(work)``: the planner's cost of a sample's work under ``model``

    def to_json(self) -> dict:
        out = {
            "batch": self.batch,
            "digest": self.model.digest,
            "coefficients": dict(self.model.coefficients),
        }
        if self.model.grouped:
            out["row_width"] = self.model.row_width
        return out


class CostHistory:
    """``at(batch)``: the planner's cost of global batch ``batch`` (the entry in force there).
    ``entries`` start at batch 0 and increase."""

    def __init__(self, entries: list[CostEntry]):
        self.entries = entries

    def at(self, batch: int) -> Any:
        """The cost ``cost(work)`` of global batch ``batch``."""
        return [e for e in self.entries if e.batch <= batch][-1].cost

    @property
    def latest(self) -> CostEntry:
        return self.entries[-1]

    def to_json(self) -> list[dict]:
        return [e.to_json() for e in self.entries]

    def continued(
        self, saved: list[dict], batch: int, cost_of: Callable[[CostModel], Any]
    ) -> tuple[CostHistory, list[str]]:
        """``(history, changes)``: the ``saved`` history (a loader state's ``plan.costs``) up to
        global batch ``batch``, then this history's current model from ``batch`` on if it is
        another one (``changes`` names the step and both digests). ``cost_of(model)``: the
        planner's cost with a saved model. `StateMismatchError` for a malformed entry."""
        kept = [_entry(item, i, cost_of) for i, item in enumerate(saved)]
        if (
            not kept
            or kept[0].batch != 0
            or any(b.batch <= a.batch for a, b in zip(kept, kept[1:]))
        ):
            raise StateMismatchError(
                "loader state is malformed: plan.costs must start at batch 0 and increase"
            )
        kept = [e for e in kept if e.batch <= batch]
        now = self.latest.model
        if kept[-1].model.digest == now.digest:
            return CostHistory(kept), []
        change = (
            f"from global batch {batch}: loader.balance.cost_model digest "
            f"{kept[-1].model.digest} -> {now.digest}"
        )
        kept = [e for e in kept if e.batch < batch]
        return CostHistory([*kept, CostEntry(batch, now, self.latest.cost)]), [change]


def _entry(item: Any, i: int, cost_of: Callable[[CostModel], Any]) -> CostEntry:
    """One saved entry ``{"batch", "digest", "coefficients"}`` (a grouped model's also
    ``row_width``), checked: coefficients of every feature of a cost file's version, finite
    numbers >= 0, whose digest is the saved one."""
    where = f"loader state is malformed: plan.costs[{i}]"
    keys = {"batch", "digest", "coefficients"}
    if not isinstance(item, dict) or not keys <= set(item) <= keys | {"row_width"}:
        raise StateMismatchError(f"{where} must be {{batch, digest, coefficients[, row_width]}}")
    batch, coefficients = item["batch"], item["coefficients"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise StateMismatchError(f"{where}.batch must be an integer >= 0, got {batch!r}")
    names = names_of(coefficients)
    if names is None:
        raise StateMismatchError(
            f"{where}.coefficients must name the features {list(FEATURES)} or "
            f"{list(MICRO_BATCH_FEATURES)}"
        )
    if not all(coefficient_ok(c) for c in coefficients.values()):
        raise StateMismatchError(f"{where}.coefficients must be finite numbers >= 0")
    width = item.get("row_width")
    if not row_width_ok(width):
        raise StateMismatchError(f"{where}.row_width must be null, 'longest' or an integer > 0")
    model = CostModel({n: float(coefficients[n]) for n in names}, "", "", width)
    if model.digest != item["digest"]:
        raise StateMismatchError(
            f"{where}.digest {item['digest']!r} is not its coefficients' ({model.digest!r})"
        )
    return CostEntry(batch, model, cost_of(model))
