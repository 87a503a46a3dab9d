"""The stand-in rule, one module for the loader and the trace: the first of ``MAX_REPLACEMENTS``
keyed draws of the same dataset and epoch that fits the planned row and is accepted."""

from __future__ import annotations

from types import SimpleNamespace

from energon_platform.loader import batches, trace
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.stand_in import (
    MAX_REPLACEMENTS,
    candidates,
    row_fits,
    stand_in,
)

ORDER = DatasetOrder(1000, 12345)


def test_candidates_are_the_keyed_draws_of_the_same_epoch_in_attempt_order():
    drawn = list(candidates(ORDER, 3, 17))
    assert drawn == [ORDER.replacement(3, 17, a) for a in range(1, MAX_REPLACEMENTS + 1)]
    assert drawn != list(candidates(ORDER, 4, 17))  # another epoch draws others


def test_the_stand_in_is_the_first_candidate_that_fits_the_row_and_is_accepted():
    drawn = list(candidates(ORDER, 0, 5))
    length = {c: (10 if k % 2 else 40) for k, c in enumerate(drawn)}  # odd attempts fit in 10
    planner = SimpleNamespace(length_of=lambda d, e, i: (length[i], length[i]))
    refused = {drawn[1]}
    chosen = stand_in(ORDER, 0, 5, lambda c: c not in refused, row_fits(planner, 0, 0, 10))
    assert chosen == drawn[3]  # drawn[0], drawn[2] overflow; drawn[1] is refused
    assert stand_in(ORDER, 0, 5, lambda c: True, row_fits(planner, 0, 0, 40)) == drawn[0]
    assert stand_in(ORDER, 0, 5, lambda c: True, row_fits(planner, 0, 0, 9)) is None
    assert stand_in(ORDER, 0, 5, lambda c: c not in drawn) is None


def test_accepts_is_asked_only_about_fitting_candidates_in_order_until_one_is_taken():
    drawn = list(candidates(ORDER, 2, 9))
    asked = []
    fits = row_fits(None, 0, 2, None)  # no packed row: every candidate fits
    assert stand_in(ORDER, 2, 9, lambda c: asked.append(c) or len(asked) == 3, fits) == drawn[2]
    assert asked == drawn[:3]


def test_the_loader_and_the_trace_apply_the_one_rule():
    assert batches.stand_in is stand_in and trace.stand_in is stand_in
    assert batches.row_fits is row_fits and trace.row_fits is row_fits
