"""The interface of a mixing method, and the registry ``loader.blend_adapt.method`` names.

A method is one small class: it gets the datasets' names and starting weights, then at every
update the mean loss of each dataset since the last one (None for a dataset with no sample in
that stretch), and answers new weights (non-negative, any scale). Its state is plain JSON data
(`state_dict`), saved in the loader state and given back at resume. It must be deterministic: the
same inputs give the same weights on every rank and after every resume. Add a method by writing
a module with a class decorated `register` and importing it in ``mixing/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

#: method name → class
METHODS: dict[str, type[MixingMethod]] = {}


class MixingMethod:
    """Base of the mixing methods (see the module doc)."""

    #: the name ``loader.blend_adapt.method`` gives
    name: ClassVar[str] = ""
    #: its options (``loader.blend_adapt.options``) with their defaults
    defaults: ClassVar[dict[str, float]] = {}

    def __init__(self, datasets: Sequence[str], weights: Sequence[float], options: dict):
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"method {self.name!r} has no option(s) {unknown} (its options: "
                f"{sorted(self.defaults) or 'none'})"
            )
        self.datasets = list(datasets)
        self.options = {**self.defaults, **{k: float(v) for k, v in options.items()}}
        total = sum(weights)
        self.weights = [w / total for w in weights]

    def update(self, losses: Sequence[float | None]) -> list[float]:
        """New weights from each dataset's mean loss since the last update."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What `update` depends on besides its inputs, as plain JSON data."""
        return {"weights": list(self.weights)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weights = [float(w) for w in state["weights"]]


def register(cls: type[MixingMethod]) -> type[MixingMethod]:
    """Class decorator: make ``cls`` a method ``loader.blend_adapt.method`` can name."""
    METHODS[cls.name] = cls
    return cls


def make_method(
    name: str, datasets: Sequence[str], weights: Sequence[float], options: dict
) -> MixingMethod:
    """The method ``name`` over ``datasets`` starting from ``weights``; ValueError naming the
    methods there are for an unknown name, and the options there are for an unknown option."""
    if name not in METHODS:
        raise ValueError(f"no mixing method {name!r} (methods: {sorted(METHODS)})")
    return METHODS[name](datasets, weights, options)
