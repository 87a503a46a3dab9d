"""Cost models of a planned run (``loader.balance``): a sample's cost from its work.

A registry (`COST_MODELS`) of `CostFunction`s, one interface for every mode: ``tokens`` (``L``),
``attention`` (``L² + linear·L``, from `sample_cost`) and ``encoder`` (the encoder's own
``balance_cost(L)``), each of the sample's work length ``L``; ``measured``, a calibrated
`CostModel`'s predicted seconds of the sample's cost features, its coefficients read from the
file ``loader.balance.cost_model``. Each function says what it reads of the encoder (an ability of
`task_encoders.abilities`, checked when the run is built), which work the planner hands it, and
how the planner and the config treat its costs; `SampleCost` checks every cost it returns.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from energon_platform.loader.balance.packer import sample_cost
from task_encoders.abilities import CostsItself, StatesFeatures
from task_encoders.config_parser import ConfigError
from task_encoders.features import EMPTY, FEATURES, with_lengths

if TYPE_CHECKING:
    from energon_platform.loader.balance.cost_file import CostModel


@dataclass(frozen=True)
class CostFunction:
    """One cost model, ``loader.balance: NAME`` (`COST_MODELS`).

    ``cost(work, of)``: ``(cost, where it came from)`` of one sample's work (`SampleCost` checks
    the cost and names the place in a refusal). ``work``: what the planner hands it for a sample:
    ``length`` (its work length) or ``features`` (its cost features, `feature_work`).
    ``needs``: what it reads of the encoder beyond lengths (a protocol of
    `task_encoders.abilities`; None: nothing), and ``reads``, how a refusal says what for.
    ``calibrated``: its costs are the predicted seconds of a cost file (``loader.balance.cost_model``,
    required), so a ``global_batch_tokens`` budget is seconds, and the run's state keeps which file
    planned which global batch (`cost_history`). ``memoised``: a pure function of the work,
    remembered per work value (the planner asks again for every live sample of each global
    batch). ``like_lengths``: with a fixed number of samples per global batch, take samples of like
    row length together, not of like cost (a micro-batch is padded to its longest sample, which
    no per-sample cost of this function sees)."""

    cost: Callable[[Any, SampleCost], tuple[Any, str]]
    work: Literal["length", "features"] = "length"
    needs: type | None = None
    reads: str = ""
    calibrated: bool = False
    memoised: bool = False
    like_lengths: bool = False


def _formula(mode: str) -> Callable[[Any, SampleCost], tuple[Any, str]]:
    """The cost model ``mode`` of `sample_cost`."""

    def cost(work_length: int, of: SampleCost) -> tuple[Any, str]:
        where = f"balance {mode!r} with balance.linear={of.linear!r}"
        return sample_cost(work_length, mode, of.linear), where

    return cost


def _encoder_cost(work_length: int, of: SampleCost) -> tuple[Any, str]:
    """The encoder's ``balance_cost(work_length)``, asked at each call (it may be replaced);
    `energon_platform.config_checks` has refused an encoder without one."""
    encoder = cast(CostsItself, of.encoder)
    return encoder.balance_cost(
        work_length
    ), f"{type(encoder).__name__}.balance_cost({work_length})"


def _measured_cost(features: tuple[float, ...], of: SampleCost) -> tuple[Any, str]:
    """The cost model's predicted seconds of a sample's features (in FEATURES order)."""
    if of.cost_model is None:
        raise ConfigError(of.source, "loader.balance.cost_model", f"null with mode {of.mode!r}")
    return of.cost_model.predict_work(features), "the cost model of loader.balance.cost_model"


#: ``loader.balance`` mode → its `CostFunction` (a function registered here is a mode)
COST_MODELS: dict[str, CostFunction] = {
    "tokens": CostFunction(_formula("tokens")),
    "attention": CostFunction(_formula("attention")),
    "encoder": CostFunction(
        _encoder_cost, needs=CostsItself, reads="calls the encoder's balance_cost"
    ),
    "measured": CostFunction(
        _measured_cost,
        work="features",
        needs=StatesFeatures,
        reads="reads each sample's cost features",
        calibrated=True,
        memoised=True,
        like_lengths=True,
    ),
}

#: The most work values remembered (least recently used forgotten first).
MEMO_SIZE = 1 << 16


def feature_work(
    encoder: StatesFeatures,
) -> tuple[Callable[[tuple, str, int, tuple], tuple[float, ...]], tuple[float, ...]]:
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
    """``cost(work)``: the cost model ``mode``'s cost (`COST_MODELS`), a finite number >= 0, as a
    float; anything else is a `ConfigError` (file ``source``, key ``loader.balance``) naming where
    it came from. ``encoder``: the run's encoder, asked at each call (its ``balance_cost`` may
    be replaced). ``cost_model``: the `CostModel` of a calibrated function (None otherwise).
    ``grouped``: with a cost model of the micro-batch as it runs (`CostModel.grouped`), ``(empty
    shape, shape_cost)`` for costing a micro-batch as a whole (`planner.MicroBatchCost`); None
    otherwise."""

    def __init__(
        self,
        mode: str,
        encoder: object,
        linear: float,
        source: str,
        cost_model: CostModel | None = None,
    ):
        self.mode, self.encoder, self.linear, self.source = mode, encoder, linear, source
        self.cost_model = cost_model
        self.function = COST_MODELS[mode]
        self.grouped = None
        if cost_model is not None and cost_model.grouped:
            self.grouped = (EMPTY, cost_model.shape_cost)
        if self.function.memoised:
            self._checked = functools.lru_cache(maxsize=MEMO_SIZE)(self._checked)

    def __call__(self, work: Any) -> float:
        return self._checked(work)

    def _checked(self, work: Any) -> float:
        cost, where = self.function.cost(work, self)
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
