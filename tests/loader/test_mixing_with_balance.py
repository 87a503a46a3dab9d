"""Online mixing (``loader.blend_adapt``) with ``loader.balance: attention``, packed and unpacked.

A weight decided after step ``s`` applies from global batch ``s + 1 + lag``: with balance, from the
stream position where the planner's pool starts reading for that batch (`RunPlan.weights_from`), so
the batches planned before keep their samples whatever ``lag`` is, even one far shorter than the
pool (unpacked: 32 global batches). The planner keeps planning batches of like cost as the weights
move (per-rank cost max/mean of the samples actually drawn, against the same data with fixed
weights), and a run resumed on another world size or worker count draws the same rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from energon_platform.loader.balance.dealing import deal_plan, rank_costs
from tests.helpers.layouts import loaders_at

#: a loss per dataset that falls for image-text and audio, stays flat for text (as noise would)
LOSS = {"coco_mini": 1.0, "librispeech_mini": 5.0, "text_mini": 2.5}


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """The embedded image-text, audio-text and text corpora as a 2:1:1 metadataset, and a length cache."""
    from scripts.bench.data import three_modality_blend

    base = tmp_path_factory.mktemp("mixing_balance")
    return three_modality_blend(base), base / "lengths"


def cfg(blend, layout, workers=0, lag=2, fixed=False):
    from energon_platform.config import load_config
    from tests.helpers import REPO

    mds, cache = blend
    packed = layout == "packed"
    encoder = "multimodal_packed.yaml" if packed else "multimodal.yaml"
    return load_config(
        {
            "data": {"path": str(mds), "val_split": None},
            "encoder": str(REPO / "configs/encoders" / encoder),
            "loader": {
                "global_batch_size": 8,
                "micro_batch_size": 2 if packed else None,
                "num_workers": workers,
                "seed": 5,
                "balance": "attention",
                "length_cache": str(cache),
                "blend_adapt": None if fixed else {"method": "loss_ratio", "every": 2, "lag": lag},
            },
        }
    )


def loss_of(key: str, step: int) -> float:
    name = key.split(":")[0]
    return LOSS[name] * (0.9**step if name != "text_mini" else 1.0)


def rows_of(batch) -> list[str]:
    """A micro-batch's rows as digests: packed, each row's document keys and its tokens (the
    same bytes on every layout); unpacked, each sample's key (its padding depends on the layout)."""
    if not hasattr(batch, "num_docs"):
        return list(batch.__key__)
    rows, start = [], 0
    for i, n in enumerate(batch.num_docs.tolist()):
        keys = "|".join(batch.keys[start : start + n])
        start += n
        rows.append(keys + ":" + hashlib.sha256(batch.tokens[i].numpy().tobytes()).hexdigest())
    return rows


def keys_of(batch) -> list[str]:
    return list(batch.keys) if hasattr(batch, "num_docs") else list(batch.__key__)


def run(config, ranks, workers, first, last, state=None):
    """Global batches ``first`` to ``last - 1`` of a ``ranks``-rank run: per batch a digest of its
    rows (sorted: which rank holds a row depends on the world size), the weights it was drawn
    with, then rank 0's state. Each rank reports the whole global batch's losses (what the
    all-reduce gives every rank)."""
    loaders = loaders_at(config, ranks, state, workers)
    digests, weights = [], []
    for step in range(first, last):
        parts = [next(lo) for lo in loaders for _ in range(lo.accumulation)]
        keys = [k for p in parts for k in keys_of(p)]
        for lo in loaders:
            lo.report_losses(step, keys, [loss_of(k, step) for k in keys])
        rows = sorted(r for p in parts for r in rows_of(p))
        digests.append(hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16])
        weights.append(loaders[0].blend_weights(step))
    saved = json.loads(json.dumps(loaders[0].state_dict()))
    for lo in loaders:
        lo.close()
    return digests, weights, saved


# --- balance ----------------------------------------------------------------------------------


def spreads(config, steps, worlds=(2, 4)):
    """Per world size, the per-rank cost max/mean of each of ``steps`` global batches, of the
    samples each batch actually draws: its planned positions costed through the run's final
    stream (every segment the mixer decided), dealt as the loader deals them. Also the weights
    of the last batch and the plans' positions."""
    from energon_platform.loader.train_loader import TrainLoader

    loader = TrainLoader(config, num_workers=0)
    plans = []
    for step in range(steps):
        keys = [k for _ in range(loader.accumulation) for k in keys_of(next(loader))]
        loader.report_losses(step, keys, [loss_of(k, step) for k in keys])
        plans.append(loader.plan.planner.plan(step))
    planner = loader.plan.planner
    out = {w: [] for w in worlds}
    for b, plan in enumerate(plans):
        cost = planner.cost_at(b)
        true = [sum(cost(w) for _, w in planner.lengths(item)) for item in plan.items]
        for w in worlds:
            dealt = deal_plan(plan, w, 1, fixed=planner.fixed_counts)
            costs = rank_costs(dataclasses.replace(plan, costs=true), dealt)
            out[w].append(max(costs) / (sum(costs) / len(costs)))
    weights = loader.blend_weights(steps - 1)
    loader.close()
    return out, weights, [plan.items for plan in plans]


def with_weights(blend, weights: dict[str, float]):
    """``blend`` with a metadataset of fixed ``weights`` (dataset name -> share) beside it."""
    import yaml

    mds, cache = blend
    data = yaml.safe_load(mds.read_text())
    for entry in data["splits"]["train"]["blend"]:
        entry["weight"] = weights[entry["path"].rsplit("/", 1)[-1]]
    path = mds.parent / "fixed_weights.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, cache


@pytest.mark.parametrize("layout", ["packed", "unpacked"])
def test_adaptive_weights_keep_balance(blend, layout):
    """The weights move (text, whose loss stays flat, loses most of its share), the batches before
    the first change are those of fixed weights, and the ranks' costs stay as even as balance
    makes them with fixed weights on the same data: the starting weights and the final ones
    (30 global batches; 2 ranks and 4)."""
    mixed, weights, items = spreads(cfg(blend, layout), 30)
    start, start_weights, start_items = spreads(cfg(blend, layout, fixed=True), 30)
    final, _, _ = spreads(cfg(with_weights(blend, weights), layout, fixed=True), 30)
    assert weights["text_mini"] < start_weights["text_mini"] / 2
    # the update after step 1 applies from batch 1 + 1 + lag = 4: the batches before are planned
    # from the starting weights only, and the same as without mixing
    assert items[:4] == start_items[:4] and items[4:] != start_items[4:]
    for world in mixed:
        ours = np.array(mixed[world])
        mean = max(np.mean(start[world]), np.mean(final[world]))
        p90 = max(np.percentile(start[world], 90), np.percentile(final[world], 90))
        assert ours.mean() <= mean + 0.03, (world, ours.mean(), mean)
        assert np.percentile(ours, 90) <= p90 + 0.05, (world, np.percentile(ours, 90), p90)


# --- exactness --------------------------------------------------------------------------------


@pytest.mark.parametrize(("layout", "lag"), [("packed", 2), ("unpacked", 1)])
def test_resume_from_2_ranks_to_1_and_from_1_worker_to_3_draws_the_same_rows(blend, layout, lag):
    """Killed at step 7 (after the update of step 5, before the batch its weights apply from);
    unpacked with ``lag: 1``, far shorter than its pool of 32 global batches."""
    straight, weights, _ = run(cfg(blend, layout, lag=lag), 2, 0, 0, 14)
    assert len({json.dumps(w) for w in weights}) >= 3  # the mixer moved the weights
    head, _, state = run(cfg(blend, layout, lag=lag), 2, 0, 0, 7)
    tail, after, _ = run(cfg(blend, layout, lag=lag), 1, 0, 7, 14, state)
    assert head + tail == straight and after == weights[7:]
    # the workers learn the weights as the training process decides them
    head, _, state = run(cfg(blend, layout, workers=1, lag=lag), 1, 1, 0, 7)
    tail, after, _ = run(cfg(blend, layout, workers=3, lag=lag), 1, 3, 7, 14, state)
    assert head + tail == straight and after == weights[7:]


def test_a_weight_change_with_nothing_read_since_the_last_starts_one_unit_later(blend):
    """A planned batch may read no new stream position (its pool holds enough documents): weights
    for the batch after it then start one unit after the last segment, so segments keep
    increasing starts, and the plans before stay."""
    from energon_platform.loader.blend import Segment
    from energon_platform.loader.train_loader import TrainLoader

    loader = TrainLoader(cfg(blend, "packed"), num_workers=0)
    plan = loader.plan
    batch = next(b for b in range(1, 60) if plan.unit_at(b) == plan.unit_at(b + 1))
    kept = plan.planner.plan(batch - 1)
    plan.planner.plan(batch + 3)  # planned past the new segment (state_at of a later position)
    plan.extend_blend([Segment(plan.weights_from(batch), ("1/4", "1/2", "1/4"))])
    assert not plan.planner.kept(batch + 3)  # its pool read the new segment's units: planned again
    assert plan.blend.segments[-1].start == plan.unit_at(batch + 1)
    assert plan.weights_from(batch + 1) == plan.unit_at(batch + 1) + 1
    plan.extend_blend([Segment(plan.weights_from(batch + 1), ("1/4", "1/4", "1/2"))])
    assert plan.planner.plan(batch - 1) is kept  # read only units before the first new one
    loader.close()
