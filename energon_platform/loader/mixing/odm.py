"""``odm``: the datasets as arms of an adversarial bandit, in the spirit of Online Data Mixing
(Albalak et al., 2023: EXP3 with the training loss as the reward).

Each dataset keeps a reward estimate: at every update, ``R_d ← α·R_d + (1-α)·loss_d / π_d`` for a
dataset that had samples (``loss_d / π_d``: the loss weighted by how rarely the dataset was drawn,
EXP3's importance weighting). Weights are ``π_d = (1 - K·ε_t)·softmax(ε_t·R)_d + ε_t`` with the
exploration rate ``ε_t = min(1/K, sqrt(ln K / (K·t)))`` at update ``t``. High loss draws weight: the
method favours what the model has not fit yet, noise included (the paper's caveat).

Options (`declared`): ``smoothing`` (``α``, default 0.9, in [0, 1): below 0 the estimate flips
sign at every update, at 1 it never moves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from energon_platform.loader.mixing.method import MixingMethod, Option, register


@register
class OnlineBandit(MixingMethod):
    name = "odm"
    declared = {
        "smoothing": Option(0.9, 0, 1, "[)", "the part of its reward estimate a dataset keeps"),
    }

    def __init__(self, datasets, weights, options):
        super().__init__(datasets, weights, options)
        self.rewards = [0.0] * len(self.datasets)
        self.updates = 0

    def update(self, losses: Sequence[float | None]) -> list[float]:
        k, alpha = len(self.datasets), self.options["smoothing"]
        self.updates += 1
        for d, loss in enumerate(losses):
            if loss is not None and self.weights[d] > 0:
                self.rewards[d] = alpha * self.rewards[d] + (1 - alpha) * loss / self.weights[d]
        explore = min(1 / k, math.sqrt(math.log(k) / (k * self.updates)))
        top = max(self.rewards)
        scores = [math.exp(explore * (r - top)) for r in self.rewards]
        total = sum(scores)
        self.weights = [(1 - k * explore) * s / total + explore for s in scores]
        return list(self.weights)

    def state_dict(self):
        return {"weights": self.weights, "rewards": self.rewards, "updates": self.updates}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.rewards = [float(r) for r in state["rewards"]]
        self.updates = int(state["updates"])
