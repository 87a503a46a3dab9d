"""The interface of a mixing method, and the registry ``loader.blend_adapt.method`` names.

A method is one small class: it gets the datasets' names and starting weights, then at every
update the mean loss of each dataset since the last one (None for a dataset with no sample in
that stretch), and answers new weights (non-negative, any scale). Its state is plain JSON data
(`state_dict`), saved in the loader state and given back at resume. It must be deterministic: the
same inputs give the same weights on every rank and after every resume. Add a method by writing
a module with a class decorated `register` and importing it in ``mixing/__init__.py``.

Each method declares its options (``loader.blend_adapt.options``) beside its code, in
``declared``: a default and the range the value must lie in (`Option`). `options_problem` reads
that declaration: a run refuses an option out of range at its start, before any data is opened
(``energon_platform.config_checks.check_mixing``, naming the file and the key), and a method made
in code (`make_method`) refuses it as a ValueError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

#: method name → class
METHODS: dict[str, type[MixingMethod]] = {}


@dataclass(frozen=True)
class Option:
    """One option of a mixing method: its default, and the finite range its value must lie in,
    ``low`` to ``high`` with the ends ``ends`` says are included (``"[]"``, ``"(]"``, ``"[)"`` or
    ``"()"``; ``high`` infinite: no upper bound); ``whole``: only whole numbers (a count).
    ``means``: what it does, for the error."""

    default: float
    low: float
    high: float
    ends: str = "[]"
    means: str = ""
    whole: bool = False

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is a finite number in the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value) or (self.whole and value != int(value)):
            return False
        above = value > self.low if self.ends[0] == "(" else value >= self.low
        below = value < self.high if self.ends[1] == ")" else value <= self.high
        return above and below

    def expected(self) -> str:
        """The range in words, e.g. ``a finite number in (0, 1]: the part of ...``."""
        high = "inf" if math.isinf(self.high) else f"{self.high:g}"
        span = f"{self.ends[0]}{self.low:g}, {high}{self.ends[1]}"
        kind = "a whole number" if self.whole else "a finite number"
        return f"{kind} in {span}" + (f": {self.means}" if self.means else "")


class MixingMethod:
    """Base of the mixing methods (see the module doc)."""

    #: the name ``loader.blend_adapt.method`` gives
    name: ClassVar[str] = ""
    #: its options (``loader.blend_adapt.options``): name → default and range
    declared: ClassVar[dict[str, Option]] = {}
    #: True: `update` takes the samples each dataset had in the stretch as well, ``update(losses,
    #: counts)`` (all-reduced over the ranks, so the same on every rank)
    counted: ClassVar[bool] = False

    def __init__(self, datasets: Sequence[str], weights: Sequence[float], options: dict):
        problem = self.options_problem(options)
        if problem is not None:
            key, what, expected = problem
            raise ValueError(f"{key}: {what} (expected {expected})" if key else what)
        self.datasets = list(datasets)
        self.options = {
            name: float(options.get(name, option.default)) for name, option in self.declared.items()
        }
        total = sum(weights)
        self.weights = [w / total for w in weights]

    @classmethod
    def options_problem(cls, options: dict) -> tuple[str, str, str] | None:
        """What is wrong with ``options`` for this method, as ``(option, problem, expected)``: an
        option it does not declare (``option`` empty: the problem names them), or a value out of
        its declared range; None when they are fine."""
        unknown = sorted(set(options) - set(cls.declared))
        if unknown:
            return (
                "",
                f"method {cls.name!r} has no option(s) {unknown} (its options: "
                f"{sorted(cls.declared) or 'none'})",
                "",
            )
        for name, value in options.items():
            if not cls.declared[name].holds(value):
                return name, f"got {value!r}", cls.declared[name].expected()
        return None

    def update(
        self, losses: Sequence[float | None], counts: Sequence[int] | None = None
    ) -> list[float]:
        """New weights from each dataset's mean loss since the last update; ``counts``: the samples
        each dataset had since, given to a ``counted`` method only."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What `update` depends on besides its inputs, as plain JSON data."""
        return {"weights": list(self.weights)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = [float(w) for w in state["weights"]]


def register(cls: type[MixingMethod]) -> type[MixingMethod]:
    """Class decorator: make ``cls`` a method ``loader.blend_adapt.method`` can name (its
    declared defaults must lie in their own ranges)."""
    for name, option in cls.declared.items():
        if not option.holds(option.default):
            raise TypeError(
                f"{cls.__name__}: option {name!r}: default {option.default} out of range"
            )
    METHODS[cls.name] = cls
    return cls


def options_problem(method: str, options: dict) -> tuple[str, str, str] | None:
    """`MixingMethod.options_problem` of the method named ``method``; None for an unknown name
    (`make_method` says which there are)."""
    return METHODS[method].options_problem(options) if method in METHODS else None


def make_method(
    name: str, datasets: Sequence[str], weights: Sequence[float], options: dict
) -> MixingMethod:
    """The method ``name`` over ``datasets`` starting from ``weights``; ValueError naming the
    methods there are for an unknown name, the options there are for an unknown option, and the
    range for an option out of it."""
    if name not in METHODS:
        raise ValueError(f"no mixing method {name!r} (methods: {sorted(METHODS)})")
    return METHODS[name](datasets, weights, options)
