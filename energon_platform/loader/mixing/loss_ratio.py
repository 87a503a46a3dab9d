"""``loss_ratio``: weight to the datasets whose loss still falls beyond its noise (a loss-trend
rule).

At every update each dataset's mean loss joins its recent ones (the last ``window``); its
*progress* is how far its loss falls per update beyond the noise of that fall: with ``f`` the falls
between successive losses of the window, ``max(0, mean(f) - std(f))`` (in the loss's own units: a
loss near zero that halves has hardly moved, so a fitted dataset does not look like progress). A
flat loss, noisy or not, earns nothing: its falls average zero and scatter by its noise; a loss
that falls steadily earns its fall. Before a dataset has two falls in its window its progress is
zero. The weights move toward each dataset's share of the progress:
``w ← (1-β)·w + β·(p + δ) / Σ(p + δ)`` (``β``: ``step``, ``δ``: ``base``, a little progress every
dataset is credited with). A dataset whose loss stays flat, because the model has fit it or
because it is noise, loses weight; one that is still being learned (early, or slowly) gains it. A
dataset without samples in a stretch keeps its recent losses.

The rule is versioned in the state (``rule``): rule 1, the fall of the loss since the previous
update alone (``max(0, previous - loss)``, so a noisy flat loss earned its downward swings), is
what a state saved without ``rule`` was deciding with, and such a state resumes with rule 1; a
method made anew uses rule 2 (the one above).

Options (`declared`): ``step`` (``β``, default 0.5, in (0, 1]: beyond 1 the weights overshoot the
shares and swing between updates), ``base`` (``δ``, default 0.01, above 0: with none, a stretch in
which no loss fell would divide by zero), ``window`` (default 3, a whole number in [3, 100]: the
recent losses whose falls are judged; fewer than three give one fall, whose noise is unknown).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from energon_platform.loader.mixing.method import MixingMethod, Option, register

#: the rule a method made anew decides with (a resumed state keeps the one it was saved with)
RULE = 2


def progress(recent: Sequence[float]) -> float:
    """Rule 2's progress of a dataset with the recent losses ``recent`` (oldest first): the mean
    fall between successive losses less its standard deviation, at least 0; 0 with fewer than
    two falls."""
    falls = [a - b for a, b in zip(recent, recent[1:])]
    if len(falls) < 2:
        return 0.0
    mean = sum(falls) / len(falls)
    spread = math.sqrt(sum((f - mean) ** 2 for f in falls) / (len(falls) - 1))
    return max(0.0, mean - spread)


@register
class LossRatio(MixingMethod):
    name = "loss_ratio"
    declared = {
        "step": Option(
            0.5, 0, 1, "(]", "the part of the way to the shares of progress the weights go"
        ),
        "base": Option(0.01, 0, math.inf, "()", "the progress every dataset is credited with"),
        "window": Option(3, 3, 100, whole=True, means="the recent losses whose falls are judged"),
    }

    def __init__(self, datasets, weights, options):
        super().__init__(datasets, weights, options)
        self.rule = RULE
        self.recent: list[list[float]] = [[] for _ in self.datasets]

    def update(self, losses: Sequence[float | None]) -> list[float]:
        step, base = self.options["step"], self.options["base"]
        window = int(self.options["window"]) if self.rule == RULE else 2
        gains = []
        for d, loss in enumerate(losses):
            if loss is not None:
                self.recent[d] = [*self.recent[d], loss][-window:]
            if self.rule == RULE:
                gains.append(progress(self.recent[d]) + base)
            else:  # rule 1: the fall since the previous update, when both had samples
                fell = (
                    self.recent[d][0] - loss if loss is not None and len(self.recent[d]) == 2 else 0
                )
                gains.append(max(0.0, fell) + base)
        total = sum(gains)
        self.weights = [(1 - step) * w + step * p / total for w, p in zip(self.weights, gains)]
        return list(self.weights)

    def state_dict(self):
        return {"weights": self.weights, "rule": self.rule, "recent": self.recent}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.rule = int(state.get("rule", 1))
        if "recent" in state:
            self.recent = [[float(v) for v in r] for r in state["recent"]]
        else:  # a state of rule 1: the previous loss of each dataset
            self.recent = [[] if p is None else [float(p)] for p in state["previous"]]
