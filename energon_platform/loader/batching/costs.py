"""Cost models of a planned run (``loader.balance``): a sample's cost from its work length.

A registry (:data:`COST_MODELS`): ``tokens`` (``L``), ``attention`` (``L² + linear·L``, from
:func:`~energon_platform.loader.packer.sample_cost`) and ``encoder`` (the encoder's own
``balance_cost(L)``). :class:`SampleCost` checks every cost it returns.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from energon_platform.loader.packer import sample_cost


def _formula(mode: str) -> Callable[[int, Any, float], tuple[Any, str]]:
    """The cost model ``mode`` of :func:`~energon_platform.loader.packer.sample_cost`."""

    def cost(work_length: int, encoder: Any, linear: float) -> tuple[Any, str]:
        where = f"balance {mode!r} with balance.linear={linear!r}"
        return sample_cost(work_length, mode, linear), where

    return cost


def _encoder_cost(work_length: int, encoder: Any, linear: float) -> tuple[Any, str]:
    """The encoder's ``balance_cost(work_length)``."""
    return encoder.balance_cost(
        work_length
    ), f"{type(encoder).__name__}.balance_cost({work_length})"


#: ``loader.balance`` mode → ``model(work_length, encoder, linear) -> (cost, where it came from)``
COST_MODELS: dict[str, Callable[[int, Any, float], tuple[Any, str]]] = {
    "tokens": _formula("tokens"),
    "attention": _formula("attention"),
    "encoder": _encoder_cost,
}


class SampleCost:
    """``cost(work_length)``: the cost model ``mode``'s cost, a finite number >= 0, as a float;
    anything else is a :class:`ConfigError` (file ``source``, key ``loader.balance``) naming where
    it came from. The encoder is asked at each call (its ``balance_cost`` may be replaced)."""

    def __init__(self, mode: str, encoder: Any, linear: float, source: str):
        self.mode, self.encoder, self.linear, self.source = mode, encoder, linear, source
        self._model = COST_MODELS[mode]

    def __call__(self, work_length: int) -> float:
        cost, where = self._model(work_length, self.encoder, self.linear)
        if (
            isinstance(cost, bool)
            or not isinstance(cost, numbers.Real)
            or not math.isfinite(cost)
            or cost < 0
        ):
            from task_encoders.config import ConfigError

            raise ConfigError(
                self.source,
                "loader.balance",
                f"{where} returned {cost!r}; a cost must be a finite number >= 0",
            )
        return float(cost)
