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
the fitted parameters, the weights and the fit's rule, as plain JSON.

The rule is versioned in the state (``rule``). Rule 1 is what a state saved without ``rule``
decided with, and such a state resumes with rule 1: the ``points`` most recent points, a fit of 48
values of ``α`` and 40 golden-section steps with the residuals summed per ``α``, and the score
above. A method made anew uses rule 2, for what rule 1 did on real text (``scripts/bench/mixing.py``):

* *credit*: the score is also multiplied by the share of the stretch's samples the dataset had.
  A loss also falls from what the model learns on the other datasets; per own sample, that fall
  looks large for a dataset held at the floor (few samples of its own), and rule 1 gave a noise
  dataset at the floor its weight back late in a run. ``−dL/dn`` times the share is about the
  fall per step, which a dataset at the floor no longer wins by its few samples alone;
* *history*: past ``points`` points the older half keeps every other point, so a fit reaches back
  to the first stretches (a noise dataset's early fall and long flat tail) at the same cost;
* *fit*: 16 values of ``α``, 20 golden-section steps, running sums in one pass per ``α``: the same
  fit to about 1e-5, at a fifth of the time.

Options (`declared`): ``smoothing`` (``s``, default 0.5, in [0, 1): at 1 the weights never move),
``warmup`` (default 3, a whole number in [3, 1000]: fewer than three points do not determine three
parameters), ``points`` (default 32, a whole number in [3, 10000]: the points a fit uses, rule
2 thinning the older ones; below ``warmup``, ``warmup`` is used).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from energon_platform.loader.mixing.method import MixingMethod, Option, register

#: the range of the fitted exponent α
ALPHA_LOW, ALPHA_HIGH = 0.01, 3.0
#: the rule a method made anew fits with (a resumed state keeps the one it was saved with)
RULE = 2


def _linear(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Rule 1's ``(ε, β, squared error)`` of ``y ≈ ε + β·x`` by least squares with ``ε ≥ 0``,
    ``β ≥ 0``."""
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


def _sums(logs: Sequence[float], ys: Sequence[float]):
    """Rule 2's ``at(α) → (ε, β, squared error)`` over the points ``(log n, y)``: the same
    constrained least squares as `_linear`, from running sums in one pass per ``α`` (``y``
    centred on its mean, so a flat loss fits ``β = 0`` exactly; the error from the sums)."""
    m = len(ys)
    mean = sum(ys) / m
    centred = [y - mean for y in ys]
    syy = sum(y * y for y in centred)

    def at(alpha: float) -> tuple[float, float, float]:
        sx = sxx = sxy = 0.0
        for g, y in zip(logs, centred):
            x = math.exp(-alpha * g)
            sx += x
            sxx += x * x
            sxy += x * y
        vxx = sxx - sx * sx / m
        beta = sxy / vxx if vxx > 0 else 0.0
        eps = mean - beta * sx / m
        if beta < 0:  # a rising (or flat) curve: no fall to fit
            beta, eps = 0.0, mean
        if eps < 0:  # the curve through zero: β alone
            eps, beta = 0.0, max(0.0, (sxy + mean * sx) / sxx if sxx > 0 else 0.0)
        c = mean - eps
        error = syy - 2 * beta * sxy + m * c * c - 2 * c * beta * sx + beta * beta * sxx
        return eps, beta, max(0.0, error)

    return at


#: per rule: (log-spaced values of α tried first, golden-section steps around the best of them)
STEPS = {1: (48, 40), 2: (16, 20)}


def fit(ns: Sequence[float], losses: Sequence[float], rule: int = 2) -> tuple[float, float, float]:
    """``(ε, β, α)`` of ``L(n) = ε + β·n^(-α)`` fitted to the points by least squares, in a fixed
    number of steps: for each ``α`` the best ``ε``, ``β`` are linear (rule 1: `_linear`, rule 2:
    `_sums`); ``α`` is the best of the grid's log-spaced values in [`ALPHA_LOW`, `ALPHA_HIGH`],
    refined by golden-section steps between its neighbours (`STEPS` of the rule). ``ns``
    positive."""
    logs = [math.log(n) for n in ns]
    grid_size, golden_steps = STEPS[rule]
    if rule == 1:

        def at(alpha: float) -> tuple[float, float, float]:
            return _linear([math.exp(-alpha * g) for g in logs], losses)

    else:
        at = _sums(logs, losses)

    lo, hi = math.log(ALPHA_LOW), math.log(ALPHA_HIGH)
    grid = [math.exp(lo + (hi - lo) * i / (grid_size - 1)) for i in range(grid_size)]
    errors = [at(a)[2] for a in grid]
    best = min(range(grid_size), key=lambda i: (errors[i], i))
    a, b = grid[max(0, best - 1)], grid[min(grid_size - 1, best + 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = at(c)[2], at(d)[2]
    for _ in range(golden_steps):
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


def latest(points: list, keep: int) -> list:
    """Rule 1's history: the ``keep`` most recent points."""
    return points[-keep:]


def thinned(points: list, keep: int) -> list:
    """Rule 2's history: at most ``keep`` points reaching back to the first: when there are more,
    the older half keeps every other point (so older stretches grow sparser, never dropped)."""
    if len(points) <= keep:
        return points
    recent = keep // 2
    older = points[:-recent]
    return older[::2][-(keep - recent) :] + points[-recent:]


@register
class AdaptiveFit(MixingMethod):
    name = "ado"
    declared = {
        "smoothing": Option(0.5, 0, 1, "[)", "the part of its weight a dataset keeps per update"),
        "warmup": Option(
            3, 3, 1000, whole=True, means="the points a dataset needs before its curve is fitted"
        ),
        "points": Option(32, 3, 10000, whole=True, means="the points a fit uses"),
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
        self.rule = RULE

    def update(self, losses: Sequence[float | None], counts: Sequence[int] | None = None):
        """New weights from each dataset's mean loss since the last update; ``counts``: the
        samples each had in the stretch (None: its weight, in units of a stretch)."""
        had: Sequence[float] = self.weights if counts is None else counts
        warmup = int(self.options["warmup"])
        keep = max(int(self.options["points"]), warmup)
        drawn = sum(float(c) for c in had)
        for d, loss in enumerate(losses):
            before = self.seen[d]
            self.seen[d] += float(had[d])
            if loss is not None and self.seen[d] > 0:
                self.history[d] = [*self.history[d], [(before + self.seen[d]) / 2, loss]]
                self.history[d] = (thinned if self.rule >= 2 else latest)(self.history[d], keep)
            if len(self.history[d]) >= warmup:
                ns, ls = zip(*self.history[d])
                params = self.params[d] = list(fit(ns, ls, self.rule))
                self.trust[d] = trust(params, ns, ls)
        fitted = {d: p for d, p in enumerate(self.params) if p is not None}
        if fitted:
            # rule 2: times the share of the stretch's samples the dataset had (its credit)
            credit = [float(c) / drawn if drawn > 0 and self.rule >= 2 else 1.0 for c in had]
            score = {
                d: self.prior[d] * self.trust[d] * potential(p, self.seen[d]) * credit[d]
                for d, p in fitted.items()
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
            "rule": self.rule,
        }

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.prior = [float(w) for w in state["prior"]]
        self.seen = [float(n) for n in state["seen"]]
        self.history = [[[float(n), float(v)] for n, v in h] for h in state["history"]]
        self.params = [None if p is None else [float(x) for x in p] for p in state["params"]]
        self.trust = [float(t) for t in state["trust"]]
        self.rule = int(state.get("rule", 1))
