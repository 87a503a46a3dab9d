"""What a plan is: the planner's state at a global batch (`PlanState`), one planned global batch
(`BatchPlan`, with `MicroBatchCost` for micro-batches costed as a whole) and the one-line refusal
of a global batch that cannot be made without repeating a sample (`PlanError`). Plain data: the
state is saved with a checkpoint as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from storage import DatasetError


class Copy(NamedTuple):
    """Which sample a stream position is: ``index`` of ``dataset``, in that dataset's ``epoch``
    (the same sample in two epochs is two copies of it)."""

    dataset: int
    epoch: int
    index: int


class Lengths(NamedTuple):
    """What a sample weighs in a plan: ``row``, the positions it takes in a row (padded to the
    encoder's segment multiple), and ``work``, what its cost is computed from (its work length,
    or its cost features for ``measured``)."""

    row: int
    work: Any


@dataclass(frozen=True)
class PlanState:
    """Where planning of global batch ``batch`` starts: the next unread stream ``position`` and
    the ``carried`` stream positions (read earlier, not yet placed), in stream order."""

    batch: int = 0
    position: int = 0
    carried: tuple[int, ...] = ()

    def to_json(self) -> dict:
        return {"batch": self.batch, "position": self.position, "carried": list(self.carried)}

    @classmethod
    def from_json(cls, data: dict) -> PlanState:
        return cls(
            int(data["batch"]), int(data["position"]), tuple(int(p) for p in data["carried"])
        )


@dataclass(frozen=True)
class BatchPlan:
    """One global batch: ``items`` (rows: lists of stream positions; unpacked: one position each),
    their ``costs`` and ``positions`` used (row positions), and the state after it."""

    items: list[list[int]]
    costs: list[float]
    used: list[int]
    next_state: PlanState
    capacity: int = 0  #: positions per row (packed), 0 unpacked
    #: how a micro-batch of these items costs as a whole (unpacked ``measured`` with a grouped
    #: cost model); None: a micro-batch costs the sum of its items' ``costs``
    grouped: MicroBatchCost | None = None

    @property
    def padding(self) -> float:
        """Fraction of the rows' positions left empty (0 unpacked)."""
        return 1.0 - sum(self.used) / (len(self.items) * self.capacity) if self.capacity else 0.0


@dataclass(frozen=True)
class MicroBatchCost:
    """A micro-batch of a plan's items costed as a whole: ``works``, each item's work (its
    features), grown from ``empty`` into a shape (``empty.grow(work)``) that ``cost(shape)``
    prices (`CostModel.shape_cost`)."""

    works: list
    empty: Any
    cost: Any

    def shape(self, items: Sequence[int]) -> Any:
        """The shape of a micro-batch of these item indices."""
        shape = self.empty
        for i in items:
            shape = shape.grow(self.works[i])
        return shape

    def of(self, items: Sequence[int]) -> float:
        """The cost of a micro-batch of these item indices."""
        return self.cost(self.shape(items))


class PlanError(DatasetError):
    """A global batch cannot be made without putting one sample in it twice (one line).
    ``smallest``: the samples of the dataset too small for its share, where one is known."""

    def __init__(self, message: str, smallest: int | None = None):
        super().__init__(message)
        self.smallest = smallest
