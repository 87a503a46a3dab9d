"""Which dataset fills each position of a blended stream: exact ratios, any position in O(1).

Energon's ``blend`` draws a dataset independently for every sample from a per-worker RNG: ratios
hold only on average (a batch of 8 at weight 1/4 holds 0 to 5 such samples) and the order depends
on the worker layout. Here the blend is part of the schedule:

* **Exact in every prefix.** Weights are rationalised to integer counts ``c_d`` per *period* of
  ``Q = sum(c)`` units, and one period is laid out by Tijdeman's solution of the chairman
  assignment problem (R. Tijdeman, "The chairman assignment problem", Discrete Math. 32, 1980):
  at unit ``t`` choose, among the datasets whose deficit ``w_d t - n_d`` is at least
  ``σ = 1/(2k-2)``, the one whose deadline ``(n_d + 1 - σ) / w_d`` comes first. Then
  ``|n_d(t) - w_d t| <= 1 - σ < 1`` for every prefix and every dataset, so any window of
  consecutive units holds each dataset within 2 of its share. Since ``c_d`` are integers the
  deficits return to 0 after ``Q`` units and the layout repeats with period ``Q``.
* **O(1) lookup.** A period is stored as two arrays of ``Q`` entries (dataset id, and the rank
  of the unit among its dataset's units); unit ``u`` is dataset ``table[u % Q]``, and is that
  dataset's unit number ``(u // Q) * c_d + rank[u % Q]``.
* **Weights that change.** A `Blend` is a list of segments, each with a start position and
  weights; a segment continues every dataset's stream where the previous segments left it, so a
  weight change (a curriculum, or new weights at resume) never repeats or skips a sample.

``MAX_PERIOD`` bounds ``Q``: weights whose exact common denominator is larger (for example
``blend_epochized`` over very large datasets) are rounded to ``MAX_PERIOD`` units by largest
remainder, and the realised ratios are exact for the rounded weights.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

MAX_PERIOD = 1 << 18


def integer_counts(
    weights: Sequence[float | int | str | Fraction], max_period: int = MAX_PERIOD
) -> tuple[int, ...]:
    """Integer units per period, proportional to ``weights`` (exact when the common denominator
    of the weights as decimals is at most ``max_period``, else rounded by largest remainder)."""
    fracs = [Fraction(str(w)) if isinstance(w, float) else Fraction(w) for w in weights]
    if any(f < 0 for f in fracs) or sum(fracs) <= 0:
        raise ValueError(f"blend weights must be >= 0 with a positive sum, got {list(weights)}")
    total = sum(fracs)
    shares = [f / total for f in fracs]
    q = 1
    for s in shares:
        q = q * s.denominator // math.gcd(q, s.denominator)  # Python ints: no overflow
        if q > max_period:
            break
    if q <= max_period:
        return tuple(int(s * q) for s in shares)
    raw = [s * max_period for s in shares]
    counts = [int(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in by_remainder[: max_period - sum(counts)]:
        counts[i] += 1
    return tuple(counts)


def chairman_period(counts: Sequence[int]) -> np.ndarray:
    """One period of Tijdeman's sequence for integer ``counts``: ``int32`` dataset ids, length ``sum(counts)``.

    Integer arithmetic throughout (weights ``c_d / Q``, ``σ = 1/(2k-2)`` scaled by ``2k-2``)."""
    q = int(sum(counts))
    active = [d for d, c in enumerate(counts) if c > 0]
    out = np.empty(q, dtype=np.int32)
    if len(active) == 1:
        out[:] = active[0]
        return out
    k2 = 2 * len(active) - 2  # 1/σ
    taken = {d: 0 for d in active}
    for t in range(1, q + 1):
        best, best_num, best_den = -1, 0, 1
        for d in active:
            c, n = counts[d], taken[d]
            if k2 * (c * t - q * n) < q:  # deficit below σ: not a candidate
                continue
            num = k2 * n + k2 - 1  # deadline ∝ (n + 1 - σ) / w_d, compared as num/den
            if best < 0 or num * best_den < best_num * c:
                best, best_num, best_den = d, num, c
        out[t - 1] = best
        taken[best] += 1
    return out


class Interleave:
    """Units ``0, 1, 2, ...`` assigned to datasets in the exact ratio of ``counts`` (period ``Q``)."""

    def __init__(self, counts: Sequence[int]):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.period = int(self.counts.sum())
        self.table = chairman_period(counts)
        rank = np.empty(self.period, dtype=np.int64)
        for d in range(len(counts)):
            where = np.flatnonzero(self.table == d)
            rank[where] = np.arange(where.size)
        self.rank = rank

    def locate(self, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(dataset, that dataset's unit number)`` of each unit (``int64`` arrays)."""
        u = np.asarray(units, dtype=np.int64)
        cycle, r = np.divmod(u, self.period)
        d = self.table[r].astype(np.int64)
        return d, cycle * self.counts[d] + self.rank[r]

    def unit_of(self, dataset: int, numbers) -> np.ndarray:
        """The inverse of `locate`: the units at which ``dataset`` takes its unit ``numbers``."""
        k = np.asarray(numbers, dtype=np.int64)
        cycle, r = np.divmod(k, self.counts[dataset])
        return cycle * self.period + np.flatnonzero(self.table == dataset)[r]

    def consumed(self, n_units: int) -> np.ndarray:
        """Units of each dataset among the first ``n_units``."""
        cycle, r = divmod(int(n_units), self.period)
        return cycle * self.counts + np.bincount(self.table[:r], minlength=len(self.counts))


@dataclass(frozen=True)
class Segment:
    """From unit ``start`` on (until the next segment), the blend uses ``weights`` (one per dataset)."""

    start: int
    weights: tuple[str, ...]  #: exact decimal strings, so the state and fingerprint are plain JSON

    def to_json(self) -> dict:
        return {"start": self.start, "weights": list(self.weights)}


class Blend:
    """A blended stream of units over ``num_datasets`` datasets, as segments of fixed weights.

    ``locate(units)`` gives ``(dataset, per-dataset unit)``: a pure function of the segments.
    """

    def __init__(
        self, segments: Sequence[Segment], num_datasets: int, max_period: int = MAX_PERIOD
    ):
        if not segments or segments[0].start != 0:
            raise ValueError("a blend starts with a segment at unit 0")
        if any(b.start <= a.start for a, b in zip(segments, segments[1:])):
            raise ValueError("blend segments must start at increasing units")
        if any(len(s.weights) != num_datasets for s in segments):
            raise ValueError(f"every blend segment needs {num_datasets} weights")
        self.segments = tuple(segments)
        self.num_datasets, self._max_period = num_datasets, max_period
        self._interleaves = [Interleave(integer_counts(s.weights, max_period)) for s in segments]
        self._starts = np.array([s.start for s in segments], dtype=np.int64)
        bases = [np.zeros(num_datasets, dtype=np.int64)]
        for i in range(1, len(segments)):
            bases.append(
                bases[-1]
                + self._interleaves[i - 1].consumed(segments[i].start - segments[i - 1].start)
            )
        self._bases = bases

    def extended(self, segments: Sequence[Segment]) -> Blend:
        """This blend followed by ``segments`` (starting after its last, in increasing order):
        the same as a `Blend` of all of them, without laying out again the segments it has."""
        if not segments:
            return self
        last = self.segments[-1]
        if segments[0].start <= last.start or any(
            b.start <= a.start for a, b in zip(segments, segments[1:])
        ):
            raise ValueError("blend segments must start at increasing units")
        if any(len(s.weights) != self.num_datasets for s in segments):
            raise ValueError(f"every blend segment needs {self.num_datasets} weights")
        out = copy.copy(self)
        out.segments = self.segments + tuple(segments)
        added = [Interleave(integer_counts(s.weights, self._max_period)) for s in segments]
        out._interleaves = self._interleaves + added
        out._starts = np.array([s.start for s in out.segments], dtype=np.int64)
        out._bases = list(self._bases)
        before, inter = last, self._interleaves[-1]
        for seg, nxt in zip(segments, added):
            out._bases.append(out._bases[-1] + inter.consumed(seg.start - before.start))
            before, inter = seg, nxt
        return out

    @classmethod
    def single(cls) -> Blend:
        return cls([Segment(0, ("1",))], 1)

    def locate(self, units) -> tuple[np.ndarray, np.ndarray]:
        u = np.asarray(units, dtype=np.int64)
        d = np.empty_like(u)
        j = np.empty_like(u)
        seg = np.searchsorted(self._starts, u, side="right") - 1
        for s in np.unique(seg):
            sel = seg == s
            ds, js = self._interleaves[s].locate(u[sel] - self._starts[s])
            d[sel], j[sel] = ds, js + self._bases[s][ds]
        return d, j

    def unit_of(self, dataset: int, numbers) -> np.ndarray:
        """The inverse of `locate`: the units at which ``dataset`` takes its unit ``numbers``
        (``int64``; -1 for numbers it never reaches: its weight is 0 from then on)."""
        j = np.asarray(numbers, dtype=np.int64)
        bases = np.array([b[dataset] for b in self._bases], dtype=np.int64)
        # the last segment that starts at or before j
        seg = np.searchsorted(bases, j, side="right") - 1
        out = np.full_like(j, -1)
        for s in np.unique(seg):
            inter = self._interleaves[s]
            if inter.counts[dataset] == 0:
                continue
            sel = seg == s
            out[sel] = self._starts[s] + inter.unit_of(dataset, j[sel] - bases[s])
        return out

    def consumed(self, n_units: int) -> np.ndarray:
        """Units of each dataset among the first ``n_units`` (for accounting and logs)."""
        s = int(np.searchsorted(self._starts, n_units, side="right") - 1)
        return self._bases[s] + self._interleaves[s].consumed(n_units - int(self._starts[s]))

    def to_json(self) -> list[dict]:
        return [s.to_json() for s in self.segments]
