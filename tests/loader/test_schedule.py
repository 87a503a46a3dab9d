"""The O(1) schedule: keyed permutations, locality windows, exact blends, weights that change."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from energon_platform.loader.blend import (
    Blend,
    Interleave,
    Segment,
    chairman_period,
    integer_counts,
)
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.permutation import KeyedPermutation
from energon_platform.loader.schedule import Schedule
from tests.helpers.cli import run_python


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 1000, 4099])
def test_keyed_permutation_is_a_bijection_for_every_size(n):
    for key in (0, 1, 2**63 + 5):
        assert sorted(KeyedPermutation(n, key)(np.arange(n)).tolist()) == list(range(n))


def test_keyed_permutation_pinned_values_and_same_in_another_process():
    # pinned: a change of the mixer or round count changes every run's data order
    here = KeyedPermutation(10**9, 7)(np.arange(5)).tolist()
    code = (
        "import numpy as np; from energon_platform.loader.permutation import KeyedPermutation;"
        "print(KeyedPermutation(10**9, 7)(np.arange(5)).tolist())"
    )
    there = run_python(code, cwd=None, check=True).stdout.strip()
    assert str(here) == there
    assert KeyedPermutation(10, 3)(np.arange(10)).tolist() == PINNED_10_3


PINNED_10_3 = [5, 9, 8, 2, 0, 1, 4, 3, 7, 6]


def test_keyed_permutation_differs_by_key_and_is_not_the_identity():
    a, b = KeyedPermutation(1000, 1)(np.arange(1000)), KeyedPermutation(1000, 2)(np.arange(1000))
    assert (a != b).mean() > 0.9 and (a != np.arange(1000)).mean() > 0.9
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.1  # neighbours uncorrelated


@pytest.mark.parametrize("shuffle_buffer", [None, 1, 7, 64, 300])
@pytest.mark.parametrize("n", [1, 63, 64, 1000])
def test_every_epoch_visits_every_sample_once_and_epochs_differ(n, shuffle_buffer):
    order = DatasetOrder(n, key=99, shuffle_buffer=shuffle_buffer)
    e0, e1 = order.indices(0, np.arange(n)), order.indices(1, np.arange(n))
    assert sorted(e0.tolist()) == list(range(n)) and sorted(e1.tolist()) == list(range(n))
    if n >= 64 and shuffle_buffer != 1:
        assert (e0 != e1).any()


@pytest.mark.parametrize("run", [2, 4, 8])
def test_locality_runs_keep_consecutive_samples_together_and_visit_each_once(run):
    order = DatasetOrder(1000, key=4, shuffle_buffer=128, run=run)
    e0 = order.indices(0, np.arange(1000))
    assert sorted(e0.tolist()) == list(range(1000))
    body = e0[: (1000 // order.block_size) * order.block_size]
    runs = body.reshape(-1, run)
    assert (np.diff(runs, axis=1) == 1).all(), "a run is consecutive samples"
    assert order.describe()["run"] == run and order.block_size % run == 0
    with pytest.raises(ValueError, match="locality"):
        DatasetOrder(10, 1, run=2)


def test_locality_window_reads_few_blocks_and_permutation_reads_many():
    n, k = 100_000, 1024
    loc, full = DatasetOrder(n, 5, shuffle_buffer=k), DatasetOrder(n, 5)
    window = np.arange(10 * k, 11 * k)
    assert len(np.unique(loc.indices(0, window) // loc.block_size)) <= loc.window_blocks + 1
    assert len(np.unique(full.indices(0, window) // 64)) > 500


def test_chairman_interleave_is_within_one_in_every_prefix_and_two_in_every_window():
    rng = np.random.default_rng(0)
    for _ in range(100):
        counts = rng.integers(0, 30, size=rng.integers(2, 7)).tolist()
        if sum(counts) == 0:
            continue
        table = np.tile(chairman_period(counts), 3)
        w = np.array(counts) / sum(counts)
        onehot = np.eye(len(counts))[table]
        prefix = np.cumsum(onehot, axis=0)
        n = np.arange(1, len(table) + 1)[:, None]
        assert np.abs(prefix - w * n).max() < 1, counts
        for length in (1, 5, 8, 33):
            if length >= len(table):
                continue
            windows = prefix[length:] - prefix[:-length]
            assert np.abs(windows - w * length).max() < 2


def test_integer_counts_exact_for_decimals_and_rounded_beyond_the_period():
    assert integer_counts([0.25, 0.75]) == (1, 3)
    assert integer_counts(["0.3", 0.5, 0.2]) == (3, 5, 2)
    assert integer_counts([Fraction(1, 3), Fraction(2, 3)]) == (1, 2)
    big = integer_counts([1, 10**7 + 1], max_period=1000)
    assert sum(big) == 1000
    with pytest.raises(ValueError):
        integer_counts([0, 0])


def test_blend_weights_that_change_continue_every_stream_without_repeats():
    blend = Blend([Segment(0, ("1", "3")), Segment(40, ("1", "1")), Segment(100, ("0", "1"))], 2)
    d, j = blend.locate(np.arange(200))
    for dd in (0, 1):
        # each stream once, in order
        assert sorted(j[d == dd].tolist()) == list(range((d == dd).sum()))
    assert (d[:40] == 0).sum() == 10 and (d[40:100] == 0).sum() == 30 and (d[100:] == 0).sum() == 0
    assert blend.consumed(200).tolist() == [40, 160]


def test_blended_schedule_keeps_each_dataset_once_per_its_own_epoch():
    orders = (DatasetOrder(7, 1), DatasetOrder(50, 2, shuffle_buffer=16), DatasetOrder(7, 3))
    blend = Blend([Segment(0, ("1", "2", "1"))], 3)
    s = Schedule(orders, items_per_batch=4, blend=blend)
    d, e, i = s.samples(np.arange(400))
    for dd, order in enumerate(orders):
        for ep in range(int(e[d == dd].max())):  # every complete epoch of every dataset
            sel = (d == dd) & (e == ep)
            assert sorted(i[sel].tolist()) == list(range(order.num_samples))
    # the two 7-sample datasets are the same size but independent streams
    assert i[d == 0][:7].tolist() != i[d == 2][:7].tolist()
    assert s.consumed(100)[1]["samples"] == 200


def test_batch_unit_blend_takes_whole_micro_batches_from_one_dataset():
    orders = (DatasetOrder(30, 1), DatasetOrder(30, 2))
    s = Schedule(orders, items_per_batch=8, blend=Blend([Segment(0, ("1", "1"))], 2), unit=4)
    d, _, _ = s.samples(np.arange(64))
    assert all(len(set(d[k : k + 4].tolist())) == 1 for k in range(0, 64, 4))
    assert (d == 0).sum() == 32


def test_interleave_lookup_is_constant_time_at_huge_positions():
    inter = Interleave((1, 2, 5))
    d, j = inter.locate(np.array([10**15, 10**15 + 1]))
    assert j.max() > 10**14
