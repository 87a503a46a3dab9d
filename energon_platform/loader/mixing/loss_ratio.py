"""``loss_ratio``: weight to the datasets whose loss still falls (a loss-trend rule).

At every update each dataset's mean loss is set against the one of its previous update: its
*progress* is how much the loss fell, ``max(0, previous - loss)`` (in the loss's own units: a
loss near zero that halves has hardly moved, so a fitted dataset does not look like progress).
The weights move toward each dataset's share of the progress: ``w ← (1-β)·w + β·(p + δ) / Σ(p + δ)``
(``β``: ``step``, ``δ``: ``base``, a little progress every dataset is credited with). A dataset whose
loss stays flat, because the model has fit it or because it is noise, loses weight; one that is
still being learned (early, or slowly) gains it. A dataset without samples in a stretch keeps its
previous loss.

Options (`declared`): ``step`` (``β``, default 0.5, in (0, 1]: beyond 1 the weights overshoot the
shares and swing between updates), ``base`` (``δ``, default 0.01, above 0: with none, a stretch in
which no loss fell would divide by zero).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from energon_platform.loader.mixing.method import MixingMethod, Option, register


@register
class LossRatio(MixingMethod):
    name = "loss_ratio"
    declared = {
        "step": Option(
            0.5, 0, 1, "(]", "the part of the way to the shares of progress the weights go"
        ),
        "base": Option(0.01, 0, math.inf, "()", "the progress every dataset is credited with"),
    }

    def __init__(self, datasets, weights, options):
        super().__init__(datasets, weights, options)
        self.previous: list[float | None] = [None] * len(self.datasets)

    def update(self, losses: Sequence[float | None]) -> list[float]:
        step, base = self.options["step"], self.options["base"]
        progress = []
        for d, loss in enumerate(losses):
            before = self.previous[d]
            fell = 0.0 if loss is None or before is None else max(0.0, before - loss)
            progress.append(fell + base)
            if loss is not None:
                self.previous[d] = loss
        total = sum(progress)
        self.weights = [(1 - step) * w + step * p / total for w, p in zip(self.weights, progress)]
        return list(self.weights)

    def state_dict(self):
        return {"weights": self.weights, "previous": self.previous}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.previous = [None if p is None else float(p) for p in state["previous"]]
