"""Without balance a global batch is consecutive stream positions: the epoch boundary guard keeps a
sample from the end of one epoch and the start of the next out of one global batch.

* Each guarded epoch is still a bijection, and its first ``g`` positions hold none of the previous
  epoch's last ``g`` samples (both shuffle modes, tiny and odd sizes, many epochs).
* Random blends of small datasets (weights up to 100:1): no global batch holds a sample twice
  whenever each dataset's samples in it are at most a quarter of the dataset.
* A state saved before the guard existed resumes with the order it was saved with.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from energon_platform.loader.blend import Blend, Segment
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.permutation import derive_key
from energon_platform.loader.schedule import Schedule


@pytest.mark.parametrize(
    "n,guard,buffer",
    [
        (4, 1, None),
        (7, 3, None),
        (9, 100, None),
        (50, 12, None),
        (1000, 64, None),
        (1003, 40, 100),
        (257, 30, 16),
    ],
)
def test_a_guarded_epoch_is_a_bijection_whose_head_avoids_the_last_epochs_tail(n, guard, buffer):
    order = DatasetOrder(n, 77, buffer, guard=guard)
    g = order.boundary
    assert g == min(guard, n // 4)
    for epoch in range(12):
        idx = order.indices(epoch, np.arange(n))
        assert sorted(idx.tolist()) == list(range(n))
        assert (order.positions(epoch, idx) == np.arange(n)).all()
        if epoch and g:
            tail = order.indices(epoch - 1, np.arange(n - g, n)).tolist()
            assert not set(tail) & set(idx[:g].tolist()), epoch


def _checked_batches(seed: int) -> int:
    """Asserts the property on 120 global batches of a random blend; returns how many it covered."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    sizes = [int(n) for n in rng.choice([8, 13, 40, 64, 200], k)]
    weights = [str(int(w)) for w in rng.choice([1, 3, 100], k)]
    batch = int(rng.choice([2, 4, 8]))
    orders = tuple(DatasetOrder(n, derive_key(seed, d), guard=batch) for d, n in enumerate(sizes))
    schedule = Schedule(orders, batch, 1, Blend([Segment(0, tuple(weights))], k))
    checked = 0
    for b in range(120):
        d, _, i = schedule.samples(np.arange(b * batch, (b + 1) * batch))
        if any(c > sizes[dd] // 4 for dd, c in Counter(d.tolist()).items()):
            continue  # a dataset too small for its share of a batch: outside the guarantee
        checked += 1
        ids = list(zip(d.tolist(), i.tolist()))
        assert len(ids) == len(set(ids)), (seed, b, ids)
    return checked


@pytest.mark.parametrize("seed", range(30))
def test_no_sample_twice_in_an_unbalanced_global_batch(seed):
    _checked_batches(seed)


def test_the_unbalanced_property_covers_most_batches():
    assert sum(_checked_batches(seed) for seed in range(30)) >= 0.5 * 30 * 120


def test_a_state_saved_without_the_guard_resumes_with_its_own_order(coco):
    from energon_platform import TrainLoader, load_config
    from tests.helpers import REPO

    data = coco
    cfg = load_config(
        {
            "data": {"path": str(data), "val_split": None},
            "encoder": str(REPO / "configs/encoders/image_text_small.yaml"),
            "loader": {"global_batch_size": 8, "num_workers": 0},
        }
    )
    loader = TrainLoader(cfg, num_workers=0)
    assert loader.plan.orders[0].guard == 8 and loader.plan.fingerprint["shuffle"]["guard"] == 8
    state = loader.state_dict()
    del state["fingerprint"]["shuffle"]["guard"]  # as saved before epoch boundaries were guarded
    resumed = TrainLoader(cfg, num_workers=0)
    resumed.load_state_dict(state)
    assert resumed.plan.orders[0].guard == 0 and "guard" not in resumed.plan.fingerprint["shuffle"]
    assert resumed.plan.schedule.orders[0].guard == 0
