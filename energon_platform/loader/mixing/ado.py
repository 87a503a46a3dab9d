"""``ado``: weight to the datasets whose fitted loss curve still falls, in the spirit of Adaptive
Data Optimization (Jiang et al., 2024: a scaling law per domain).

Each dataset keeps the points ``(n, L)`` of its recent updates: ``n`` the samples of it seen so far
(the middle of the stretch; the adapter passes the counts, all-reduced over the ranks), ``L`` its
mean loss in the stretch. At every update each dataset with at least ``warmup`` points gets its
curve fitted, ``L(n) = ε + β·n^(-α)`` (`fit`: least squares, ``ε ≥ 0``, ``β ≥ 0``,
``α`` in [`ALPHA_LOW`, `ALPHA_HIGH`]), and its *learning potential* is the rate at which that
curve still falls where the dataset stands, ``-dL/dn = α·β·n^(-α-1)``, times the fit's `trust`
(0 when the fitted fall is within twice the points' scatter about the curve: a fit that leans on
noise). The target weights are the trusted potentials times the prior (the metadataset's
weights), normalised; a dataset not yet fitted
keeps its current share of the blend. The weights move toward the target:
``w ← s·w + (1-s)·target`` (``s``: ``smoothing``); when no fitted dataset falls at all the target
is the prior. A flat loss, noisy or not, fits ``β ≈ 0`` and earns almost nothing; a curve that
still falls earns in proportion to how fast.

Deterministic by construction: float64 arithmetic on the adapter's rounded losses and integer
counts, a fixed number of steps in the fit (a grid over ``α``, then a fixed number of
golden-section steps), no random numbers. The state (`state_dict`) holds the points, the counts,
the fitted parameters and the weights, as plain JSON.

Options (`declared`): ``smoothing`` (``s``, default 0.5, in [0, 1): at 1 the weights never move),
``warmup`` (default 3, a whole number in [3, 1000]: fewer than three points do not determine three
parameters), ``points`` (default 32, a whole number in [3, 10000]: the most recent points a fit
uses; below ``warmup``, ``warmup`` is used).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from energon_platform.loader.mixing.method import MixingMethod, Option, register

#: the range of the fitted exponent α
ALPHA_LOW, ALPHA_HIGH = 0.01, 3.0
#: log-spaced values of α tried first, then golden-section steps around the best of them
ALPHA_GRID, GOLDEN_STEPS = 48, 40


def _linear(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """``(ε, β, squared error)`` of ``y ≈ ε + β·x`` by least squares with ``ε ≥ 0``, ``β ≥ 0``."""
    m = len(xs)
    mx, my = sum(xs) / m, sum(ys) / m
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    beta = sxy / sxx if sxx > 0 else 0.0
    eps = my - beta * mx
    if beta < 0:  # a rising (or flat) curve: no fall to fit
        beta, eps = 0.0, my
    if eps < 0:  # the curve through zero: β alone
        xx = sum(x * x for x in xs)
        eps, beta = 0.0, max(0.0, sum(x * y for x, y in zip(xs, ys)) / xx if xx > 0 else 0.0)
    error = sum((y - eps - beta * x) ** 2 for x, y in zip(xs, ys))
    return eps, beta, error


def fit(ns: Sequence[float], losses: Sequence[float]) -> tuple[float, float, float]:
    """``(ε, β, α)`` of ``L(n) = ε + β·n^(-α)`` fitted to the points by least squares, in a fixed
    number of steps: for each ``α`` the best ``ε``, ``β`` are linear (`_linear`); ``α`` is the best of
    `ALPHA_GRID` log-spaced values in [`ALPHA_LOW`, `ALPHA_HIGH`], refined by `GOLDEN_STEPS`
    golden-section steps between its neighbours. ``ns`` positive."""
    logs = [math.log(n) for n in ns]

    def at(alpha: float) -> tuple[float, float, float]:
        return _linear([math.exp(-alpha * g) for g in logs], losses)

    lo, hi = math.log(ALPHA_LOW), math.log(ALPHA_HIGH)
    grid = [math.exp(lo + (hi - lo) * i / (ALPHA_GRID - 1)) for i in range(ALPHA_GRID)]
    errors = [at(a)[2] for a in grid]
    best = min(range(ALPHA_GRID), key=lambda i: (errors[i], i))
    a, b = grid[max(0, best - 1)], grid[min(ALPHA_GRID - 1, best + 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = at(c)[2], at(d)[2]
    for _ in range(GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = at(c)[2]
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = at(d)[2]
    alpha = min([(errors[best], grid[best]), (fc, c), (fd, d)])[1]
    eps, beta, _ = at(alpha)
    return eps, beta, alpha


def trust(params: Sequence[float], ns: Sequence[float], losses: Sequence[float]) -> float:
    """How far the fitted fall stands above the scatter of the points about the curve, in [0, 1]:
    ``max(0, 1 - 2σ/F)`` with ``F`` the fall of the curve from the first point to the last and
    ``σ`` the points' root-mean-square distance from it (over ``m - 3`` degrees of freedom, at
    least 1). A flat noisy loss whose fit leans on its noise gets 0; a clean fall gets nearly 1."""
    eps, beta, alpha = params
    fall = beta * (min(ns) ** -alpha - max(ns) ** -alpha)
    error = sum((v - eps - beta * n**-alpha) ** 2 for n, v in zip(ns, losses))
    spread = math.sqrt(error / max(1, len(ns) - 3))
    return max(0.0, 1.0 - 2.0 * spread / fall) if fall > 0 else 0.0


def potential(params: Sequence[float], n: float) -> float:
    """``-dL/dn`` of the fitted curve ``(ε, β, α)`` at ``n`` samples: ``α·β·n^(-α-1)``."""
    _, beta, alpha = params
    return alpha * beta * n ** (-alpha - 1)


@register
class AdaptiveFit(MixingMethod):
    name = "ado"
    declared = {
        "smoothing": Option(0.5, 0, 1, "[)", "the part of its weight a dataset keeps per update"),
        "warmup": Option(
            3, 3, 1000, whole=True, means="the points a dataset needs before its curve is fitted"
        ),
        "points": Option(32, 3, 10000, whole=True, means="the most recent points a fit uses"),
    }
    counted = True

    def __init__(self, datasets, weights, options):
        super().__init__(datasets, weights, options)
        k = len(self.datasets)
        self.prior = list(self.weights)
        self.seen = [0.0] * k
        self.history: list[list[list[float]]] = [[] for _ in range(k)]
        self.params: list[list[float] | None] = [None] * k
        self.trust = [0.0] * k

    def update(self, losses: Sequence[float | None], counts: Sequence[int] | None = None):
        """New weights from each dataset's mean loss since the last update; ``counts``: the
        samples each had in the stretch (None: its weight, in units of a stretch)."""
        counts = self.weights if counts is None else counts
        warmup = int(self.options["warmup"])
        keep = max(int(self.options["points"]), warmup)
        for d, loss in enumerate(losses):
            before = self.seen[d]
            self.seen[d] += float(counts[d])
            if loss is not None and self.seen[d] > 0:
                self.history[d] = [*self.history[d], [(before + self.seen[d]) / 2, loss]][-keep:]
            if len(self.history[d]) >= warmup:
                ns, ls = zip(*self.history[d])
                self.params[d] = list(fit(ns, ls))
                self.trust[d] = trust(self.params[d], ns, ls)
        fitted = [d for d, p in enumerate(self.params) if p is not None]
        if fitted:
            score = {
                d: self.prior[d] * self.trust[d] * potential(self.params[d], self.seen[d])
                for d in fitted
            }
            share = sum(self.weights[d] for d in fitted)  # what the fitted datasets hold now
            total = sum(score.values())
            if total <= 0:  # nothing fitted still falls: back to the prior among them
                score = {d: self.prior[d] for d in fitted}
                total = sum(score.values())
            target = list(self.weights)
            for d in fitted:
                target[d] = share * score[d] / total
            s = self.options["smoothing"]
            self.weights = [s * w + (1 - s) * t for w, t in zip(self.weights, target)]
        return list(self.weights)

    def state_dict(self):
        return {
            "weights": self.weights,
            "prior": self.prior,
            "seen": self.seen,
            "history": self.history,
            "params": self.params,
            "trust": self.trust,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.prior = [float(w) for w in state["prior"]]
        self.seen = [float(n) for n in state["seen"]]
        self.history = [[[float(n), float(v)] for n, v in h] for h in state["history"]]
        self.params = [None if p is None else [float(x) for x in p] for p in state["params"]]
        self.trust = [float(t) for t in state["trust"]]
