"""Cost models of a planned run (``loader.balance``): a sample's cost from its work.

A registry (`COST_MODELS`): ``tokens`` (``L``), ``attention`` (``L² + linear·L``, from
`sample_cost`) and ``encoder`` (the encoder's own
``balance_cost(L)``), each of the sample's work length ``L``; ``measured`` (a calibrated
`CostModel`'s predicted seconds), of the
sample's cost features. `WORK` says which work a model asks the planner for;
`SampleCost` checks every cost it returns.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from energon_platform.loader.balance.packer import sample_cost
from task_encoders.config_parser import ConfigError
from task_encoders.features import EMPTY, FEATURES, with_lengths

if TYPE_CHECKING:
    from task_encoders.base import SeededTaskEncoder


def _formula(mode: str) -> Callable[[Any, SampleCost], tuple[Any, str]]:
    """The cost model ``mode`` of `sample_cost`."""

    def cost(work_length: int, of: SampleCost) -> tuple[Any, str]:
        where = f"balance {mode!r} with balance.linear={of.linear!r}"
        return sample_cost(work_length, mode, of.linear), where

    return cost


def _encoder_cost(work_length: int, of: SampleCost) -> tuple[Any, str]:
    """The encoder's ``balance_cost(work_length)``."""
    return of.encoder.balance_cost(
        work_length
    ), f"{type(of.encoder).__name__}.balance_cost({work_length})"


def _measured_cost(features: tuple[float, ...], of: SampleCost) -> tuple[Any, str]:
    """The cost model's predicted seconds of a sample's features (in FEATURES order)."""
    return of.cost_model.predict_work(features), "the cost model of loader.balance.cost_model"


#: ``loader.balance`` mode → ``model(work, sample_cost) -> (cost, where it came from)``
COST_MODELS: dict[str, Callable[[Any, SampleCost], tuple[Any, str]]] = {
    "tokens": _formula("tokens"),
    "attention": _formula("attention"),
    "encoder": _encoder_cost,
    "measured": _measured_cost,
}

#: Modes whose cost is a pure function of the work (a fixed cost file), remembered per work
#: value: the planner asks again for every live sample of each global batch. (``encoder`` is
#: asked at each call: its ``balance_cost`` may be replaced.)
MEMOISED = frozenset({"measured"})
#: The most work values remembered (least recently used forgotten first).
MEMO_SIZE = 1 << 16

#: The work a cost model reads, where it is not the sample's work length (``length``):
#: ``features``, its cost features (`feature_work`).
WORK: dict[str, str] = {"measured": "features"}


def feature_work(
    encoder: SeededTaskEncoder,
) -> tuple[Callable[[tuple, str, int, tuple], tuple], tuple]:
    """``(work(facts, key, epoch, lengths), no work)`` of a cost model that reads cost features:
    the encoder's ``sample_features`` as a tuple in FEATURES order, and the all-zero tuple (a
    sample whose facts could not be read). ``lengths`` (the sample's `sample_length`, which the
    lookup has already derived) is handed on to a ``sample_features`` that takes it, so the
    encoder does not derive it again (`with_lengths`: one that does not take it is called
    without)."""

    def work(facts: tuple, key: str, epoch: int, lengths: tuple) -> tuple[float, ...]:
        values = with_lengths(encoder.sample_features, facts, key, epoch, lengths)
        return tuple(float(values.get(name, 0.0)) for name in FEATURES)

    return work, (0.0,) * len(FEATURES)


class SampleCost:
    """``cost(work)``: the cost model ``mode``'s cost, a finite number >= 0, as a float;
    anything else is a `ConfigError` (file ``source``, key ``loader.balance``) naming where
    it came from. The encoder is asked at each call (its ``balance_cost`` may be replaced).
    ``cost_model``: the `CostModel` of
    ``measured`` (None otherwise). ``grouped``: with a cost model of the micro-batch as it runs
    (`CostModel.grouped`), ``(empty shape, shape_cost)`` for costing a micro-batch as a whole
    (`planner.MicroBatchCost`); None otherwise."""

    def __init__(
        self,
        mode: str,
        encoder: SeededTaskEncoder,
        linear: float,
        source: str,
        cost_model: Any = None,
    ):
        self.mode, self.encoder, self.linear, self.source = mode, encoder, linear, source
        self.cost_model = cost_model
        self.grouped = None
        if mode == "measured" and cost_model is not None and cost_model.grouped:
            self.grouped = (EMPTY, cost_model.shape_cost)
        self._model = COST_MODELS[mode]
        if mode in MEMOISED:
            self._checked = functools.lru_cache(maxsize=MEMO_SIZE)(self._checked)

    def __call__(self, work: Any) -> float:
        return self._checked(work)

    def _checked(self, work: Any) -> float:
        cost, where = self._model(work, self)
        if (
            isinstance(cost, bool)
            or not isinstance(cost, numbers.Real)
            or not math.isfinite(cost)
            or cost < 0
        ):
            raise ConfigError(
                self.source,
                "loader.balance",
                f"{where} returned {cost!r}; a cost must be a finite number >= 0",
            )
        return float(cost)
