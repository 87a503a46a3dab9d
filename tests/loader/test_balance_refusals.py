"""What a planned (or any fixed-size) run cannot honour is refused in one line, not trained wrong.

* A dataset smaller than its share of a global batch (the 3-shape dataset of global batch 8).
* ``global_batch_tokens`` with a packing encoder, or beyond what distinct samples can fill.
* ``balance.window`` / ``balance.lookahead`` past their bounds.
* A sample cost that is NaN, infinite, negative or not a number.
* Documents as long as a row cannot share rows: the carried pool stays small, not the window.
* Logged padding counts the positions the rows trained left empty.
"""

from __future__ import annotations

import math

import pytest
import torch

from energon_platform.loader.balance.planner import Planner
from energon_platform.loader.balance.plans import PlanError
from scripts.bench.data import coco_dataset
from storage import DatasetError
from task_encoders.config_parser import ConfigError
from tests.helpers import REPO

SMALL = str(REPO / "configs/encoders/image_text_small.yaml")
PACKED = str(REPO / "configs/encoders/image_text_small_packed.yaml")


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    base = tmp_path_factory.mktemp("refusals")
    return base, coco_dataset(base)


def _loader(coco, encoder=SMALL, **loader):
    from energon_platform import TrainLoader, load_config

    base, data = coco
    cfg = load_config(
        {
            "data": {"path": str(data), "val_split": None},
            "encoder": encoder,
            "loader": {
                "global_batch_size": 8,
                "num_workers": 0,
                "length_cache": str(base / "lengths"),
                **loader,
            },
        }
    )
    return TrainLoader(cfg, num_workers=0)


@pytest.mark.parametrize("balance", ["none", "tokens"])
def test_a_dataset_smaller_than_a_global_batch_is_refused(coco, balance):
    with pytest.raises(
        PlanError, match=r"has 286 samples, but its share of a global batch of 512 samples is 512"
    ):
        _loader(coco, global_batch_size=512, balance=balance)
    assert issubclass(PlanError, DatasetError)  # the CLI prints it as one line, exit 2


def test_global_batch_tokens_with_a_packing_encoder_is_refused(coco):
    with pytest.raises(ConfigError, match="global_batch_tokens: 4096 with a packing encoder"):
        _loader(coco, PACKED, balance={"mode": "tokens", "global_batch_tokens": 4096})


def test_a_token_budget_distinct_samples_cannot_fill_stops_naming_it(coco):
    loader = _loader(coco, balance={"mode": "tokens", "global_batch_tokens": 10**6})
    with pytest.raises(
        PlanError, match="global_batch_tokens=1e\\+06 cannot be reached without repeating a sample"
    ):
        loader.plan.planner.plan(0)


@pytest.mark.parametrize("key,value", [("window", 100_000), ("lookahead", 17.0)])
def test_pool_bounds_are_refused_at_load(coco, key, value):
    with pytest.raises(ConfigError, match=f"loader.balance.{key}"):
        _loader(coco, balance={"mode": "tokens", key: value})


@pytest.mark.parametrize("cost", [math.nan, math.inf, -1.0, "12", None])
def test_a_cost_that_is_not_a_finite_number_is_refused_naming_the_encoder(coco, cost):
    from energon_platform.loader.balance.costs import SampleCost

    loader = _loader(coco, balance="tokens")
    encoder_cost = SampleCost("encoder", loader.encoder, loader.plan.batching.linear, "run.yaml")
    loader.encoder.balance_cost = lambda length: cost
    with pytest.raises(ConfigError, match=r"ImageTextTaskEncoder.balance_cost\(7\) returned"):
        encoder_cost(7)
    loader.encoder.balance_cost = lambda length: 2 * length
    assert encoder_cost(7) == 14.0
    assert loader.plan.batching.cost(7) == 7.0  # the run's own model: tokens


def test_documents_as_long_as_a_row_keep_the_carried_pool_small():
    planner = Planner(lambda ps: [(128, 128)] * len(ps), float, 8, capacity=128)
    carried = [len(planner.plan(b).next_state.carried) for b in range(60)]
    # a few batches of leads, not the 4096-sample window
    assert max(carried) <= 4 * 3 * 8, max(carried)


def test_logged_padding_counts_positions_the_rows_left_empty():
    from types import SimpleNamespace

    from energon_platform.training.train import _filled

    loader = SimpleNamespace(plan=SimpleNamespace(batching=SimpleNamespace(packed_rows=True)))
    full = SimpleNamespace(doc_lengths=torch.tensor([60, 68]), tokens=torch.zeros(1, 128))
    # an excluded document
    emptied = SimpleNamespace(doc_lengths=torch.tensor([32]), tokens=torch.zeros(1, 128))
    assert _filled([full, emptied], loader, 1, "cpu") == {"padding": round(1 - 160 / 256, 4)}
    unpacked = SimpleNamespace(plan=SimpleNamespace(batching=SimpleNamespace(packed_rows=False)))
    assert _filled([full], unpacked, 1, "cpu") == {}


def test_a_budget_the_window_limits_fills_what_the_window_holds():
    """No repeats in reach: a budget beyond the window's samples is no error, the batch takes them all."""
    planner = Planner(lambda ps: [(10, 10)] * len(ps), float, 2, budget=10**6, window=64)
    assert len(planner.plan(0).items) == 64 and len(planner.plan(1).items) == 64


def test_an_encoders_cost_is_asked_again_when_its_balance_cost_is_replaced():
    """``balance: encoder`` is never remembered (only a fixed cost file's is): a replaced
    ``balance_cost`` gives its own cost at the next call."""
    from types import SimpleNamespace

    from energon_platform.loader.balance.costs import SampleCost

    encoder = SimpleNamespace(balance_cost=lambda length: 2.0 * length)
    cost = SampleCost("encoder", encoder, 0.0, "run.yaml")
    assert cost(7) == 14.0
    encoder.balance_cost = lambda length: 3.0 * length
    assert cost(7) == 21.0
