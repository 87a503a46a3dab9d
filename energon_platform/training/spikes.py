"""Loss spikes in a run's step log: pure and streaming (one pass, O(``window``) memory).

A step is a spike when its loss is NaN or infinite, or when its robust z-score against the
previous ``window`` finite losses reaches ``z``:

    z = (loss - median) / (1.4826 * MAD)

``median`` and ``MAD`` (median absolute deviation) are those of the previous ``window`` finite
losses; a step is scored once ``min(window, MIN_HISTORY)`` of them exist. A window flatter than
`FLAT` of its median (a MAD of 0 included) is scored against that spread, so a flat loss gives
finite z-scores. Spikes do not enter the window, so a long bad stretch
keeps being flagged against the losses before it.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Iterable, Iterator

__all__ = ["MIN_HISTORY", "RollingMedian", "find_spikes", "spike_rows"]

#: Finite losses a step needs before it (up to ``window``) to be scored.
MIN_HISTORY = 10

#: MAD → standard deviation of a normal distribution.
MAD_SCALE = 1.4826

#: The least spread a window is scored with, relative to its median: a loss flat to 0.1% (a MAD
#: of 0 included) scores a rise of 1% at z 10, not infinity.
FLAT = 1e-3
#: The least spread in absolute terms (a flat window with a median of 0).
TINY = 1e-12


class RollingMedian:
    """The last ``window`` values, sorted as well, for their median and MAD: O(window) per push
    (a sorted list's insert and remove), O(window) memory."""

    def __init__(self, window: int):
        self.window = window
        self.order: deque[float] = deque()
        self.sorted: list[float] = []

    def __len__(self) -> int:
        return len(self.order)

    def push(self, value: float) -> None:
        if len(self.order) == self.window:
            old = self.order.popleft()
            del self.sorted[bisect_left(self.sorted, old)]
        self.order.append(value)
        insort(self.sorted, value)

    def median(self) -> float:
        return _median(self.sorted)

    def mad_may_be_within(self, median: float, d: float) -> bool:
        """False only when the MAD around ``median`` is surely above ``d`` (fewer than half of the
        values lie within ``d`` of it, with a margin for rounding): two bisections, so that the
        exact `mad` is computed only for steps that may be spikes."""
        d = d * (1 + 1e-9) + 1e-300
        within = bisect_right(self.sorted, median + d) - bisect_left(self.sorted, median - d)
        return within >= (len(self.sorted) + 1) // 2

    def mad(self, median: float) -> float:
        """Median of ``|v - median|``: the deviations below and above ``median`` are each sorted
        already (outwards from it), so a merge of the two finds it in O(window)."""
        values, n = self.sorted, len(self.sorted)
        lo, hi = bisect_left(values, median) - 1, bisect_left(values, median)
        picked = []
        for _ in range(n // 2 + 1):  # the smallest n // 2 + 1 deviations, in order
            down = median - values[lo] if lo >= 0 else math.inf
            up = values[hi] - median if hi < n else math.inf
            if down <= up:
                picked.append(down)
                lo -= 1
            else:
                picked.append(up)
                hi += 1
        return picked[n // 2] if n % 2 else (picked[n // 2 - 1] + picked[n // 2]) / 2


def _median(values: list[float]) -> float:
    """Median of sorted ``values`` (not empty)."""
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def _z(loss: float, median: float, mad: float) -> float:
    """The robust z-score; a window flatter than `FLAT` of its median scores against that
    instead (a MAD of 0 made any rise an infinite z, which ranks nothing)."""
    return (loss - median) / max(MAD_SCALE * mad, FLAT * abs(median), TINY)


def _spike(row: dict, loss: float, z: float | None, median: float | None) -> dict:
    kind = "nan" if z is None else "z"
    return {"step": row["step"], "loss": loss, "z": z, "median": median, "kind": kind, "row": row}


def find_spikes(rows: Iterable[dict], z: float = 4.0, window: int = 50) -> Iterator[dict]:
    """The spikes among ``rows`` (``{"step", "loss", ...}``, in logged order), as they stream:
    ``{"step", "loss", "z", "median", "kind", "row"}`` with ``kind`` ``"nan"`` (NaN or infinite
    loss, ``z`` and ``median`` None) or ``"z"`` (``z`` >= the threshold ``z``), and ``row`` the
    spike's own row (its keys and sample losses, when logged). ``ValueError`` for ``z <= 0`` or
    ``window < 1``."""
    if not z > 0:
        raise ValueError(f"--z {z}: expected a threshold > 0")
    if window < 1:
        raise ValueError(f"--window {window}: expected at least 1 step")
    history = RollingMedian(window)
    needed = min(window, MIN_HISTORY)
    for row in rows:
        loss = float(row["loss"])
        if not math.isfinite(loss):
            yield _spike(row, loss, None, None)
            continue
        if (
            len(history) >= needed
            and loss > (median := history.median())
            and history.mad_may_be_within(median, (loss - median) / (MAD_SCALE * z))
        ):
            score = _z(loss, median, history.mad(median))
            if score >= z:
                yield _spike(row, loss, score, median)
                continue
        history.push(loss)


def spike_rows(spikes: Iterable[dict], top: int | None = None) -> list[dict]:
    """``spikes`` worst first (NaN/inf steps, then by z), at most ``top`` of them."""
    ranked = sorted(spikes, key=lambda s: (s["z"] is not None, -(s["z"] or 0.0), s["step"]))
    return ranked if top is None else ranked[:top]
