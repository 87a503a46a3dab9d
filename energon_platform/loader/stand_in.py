"""The stand-in rule: which sample replaces a scheduled sample that failed or is excluded.

A stand-in is a keyed draw of the same dataset and epoch
(`replacement`), so it is a pure function of
the sample it replaces: the loader (`batches`) and the trace
(`trace`) apply this one rule and name the same sample. Attempts
``1 .. MAX_REPLACEMENTS`` are tried in order; in a planned packed row a candidate longer than the
room the row keeps for the sample is passed over (it would overflow the row); the first candidate
the caller accepts (it loads; it is not excluded) is the stand-in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

#: Stand-ins tried for one failed sample before the micro-batch fails.
MAX_REPLACEMENTS = 16


def candidates(order: Any, epoch: int, index: int) -> Iterator[int]:
    """Every stand-in sample ``index`` of ``epoch`` may have, in the order they are tried."""
    for attempt in range(1, MAX_REPLACEMENTS + 1):
        yield order.replacement(epoch, index, attempt)


def row_fits(planner: Any, dataset: int, epoch: int, room: int | None) -> Callable[[int], bool]:
    """Whether a candidate of ``dataset``/``epoch`` fits a planned row's ``room`` positions (by the
    planner's length index); every candidate fits when ``room`` is None (no packed row)."""
    if room is None:
        return lambda candidate: True
    return lambda candidate: planner.length_of(dataset, epoch, candidate)[0] <= room


def stand_in(
    order: Any,
    epoch: int,
    index: int,
    accepts: Callable[[int], bool],
    fits: Callable[[int], bool] | None = None,
) -> int | None:
    """The first candidate (`candidates`) that ``fits`` and ``accepts`` take, or None when
    none of the ``MAX_REPLACEMENTS`` does. ``accepts`` is called once per fitting candidate, in
    order, until one is taken (the loader loads each there)."""
    for candidate in candidates(order, epoch, index):
        if (fits is None or fits(candidate)) and accepts(candidate):
            return candidate
    return None
