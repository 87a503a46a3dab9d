"""A cost model of the micro-batch as it runs (cost file version 2): the planner deals an
unpacked ``measured`` global batch by each micro-batch's cost as a whole.

A micro-batch's time is not the sum of its samples': rows are padded to one width, clips to the
longest, and each tower runs once per micro-batch that has any of its media. `Shape` states a
micro-batch that way, `deal_shapes` deals by it. Checked here: the shape's features against a
hand count; `deal_shapes` is `deal` when the cost adds up (property, tiny odd inputs); a case
where the summed cost deals the vision tower's call twice onto one rank and the grouped deal
does not; the planner's property checks (never a sample twice, every item dealt once, exact
resume) with a grouped cost; cost files and saved cost histories of both versions.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from energon_platform.loader.balance.cost_file import CostModel
from energon_platform.loader.balance.costs import SampleCost
from energon_platform.loader.balance.dealing import deal_plan, rank_costs
from energon_platform.loader.balance.packer import deal, deal_shapes
from energon_platform.loader.balance.plans import BatchPlan, MicroBatchCost, PlanState
from task_encoders.features import (
    EMPTY,
    FEATURES,
    LONGEST,
    MICRO_BATCH_FEATURES,
    features,
    micro_batch_features,
    towers,
)
from tests.loader.test_balance_measured import MeasuredCase
from tests.loader.test_plan_no_repeats import BATCHES, _check, _plans

#: a vision tower whose call costs ten tiles, on top of each tile and each position
CALLS = {
    **dict.fromkeys(MICRO_BATCH_FEATURES, 0.0),
    "llm_tokens": 1e-5,
    "vision_tiles": 1e-3,
    "vision_calls": 1e-2,
    "audio_calls": 5e-3,
    "audio_frames": 1e-5,
}


def _work(**values) -> tuple[float, ...]:
    full = features(samples=1, **values)
    return tuple(full[name] for name in FEATURES)


def _grouped(coefficients: dict = CALLS, width=LONGEST) -> CostModel:
    return CostModel(coefficients, "m", "e", width)


def test_a_micro_batch_is_stated_as_it_runs():
    a = features(samples=1, llm_tokens=10, llm_attention=100, vision_tiles=3)
    b = features(samples=1, llm_tokens=4, llm_attention=16, audio_frames=30)
    c = features(samples=1, llm_tokens=6, llm_attention=36, audio_frames=7, points=5)
    longest = micro_batch_features([a, b, c], LONGEST)
    assert longest == {
        "samples": 3,
        "llm_tokens": 3 * 10,
        "llm_attention": 3 * 100,
        "vision_tiles": 3,
        "audio_frames": 2 * 30,  # two clips padded to the longest
        "points": 5,
        "vision_calls": 1,
        "audio_calls": 1,
    }
    fixed = micro_batch_features([a, b, c], 64)
    assert (fixed["llm_tokens"], fixed["llm_attention"]) == (3 * 64, 3 * 64 * 64)
    own = micro_batch_features([a, b, c])  # packed: the documents' own positions
    assert (own["llm_tokens"], own["llm_attention"], own["audio_frames"]) == (20, 152, 37)
    text = micro_batch_features([features(samples=1, llm_tokens=5, llm_attention=25)] * 2)
    assert (text["vision_calls"], text["audio_calls"]) == (0, 0)
    # the order samples join in does not matter
    assert micro_batch_features([c, a, b], LONGEST) == longest


def test_a_grouped_model_costs_a_micro_batch_and_a_summed_one_its_samples():
    model = _grouped()
    works = [_work(llm_tokens=10, vision_tiles=2), _work(llm_tokens=4, vision_tiles=1)]
    shape = EMPTY.grow(works[0]).grow(works[1])
    vector = micro_batch_features([dict(zip(FEATURES, w)) for w in works], LONGEST)
    assert model.grouped and model.shape_cost(shape) == pytest.approx(model.predict(vector))
    assert model.shape_cost(shape) == pytest.approx(2 * 10 * 1e-5 + 3 * 1e-3 + 1e-2)
    # a sample alone is costed by its own features: a call is a micro-batch's
    assert model.predict_work(works[0]) == pytest.approx(10 * 1e-5 + 2 * 1e-3)
    cost = SampleCost("measured", None, 0.0, "run.yaml", model)
    assert cost.grouped == (EMPTY, model.shape_cost)
    summed = CostModel({n: CALLS[n] for n in FEATURES}, "m", "e")
    assert not summed.grouped
    assert SampleCost("measured", None, 0.0, "run.yaml", summed).grouped is None


class Additive(tuple):
    """A shape whose cost is the sum of its items': `deal_shapes` must then be `deal`."""

    def grow(self, work):
        return Additive((self[0] + work,))


@pytest.mark.parametrize("seed", range(40))
def test_deal_shapes_of_a_cost_that_adds_up_is_deal(seed):
    rng = np.random.default_rng(seed)
    parts, per_part = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    costs = [int(c) for c in rng.integers(0, 4 if seed % 2 else 50, parts * per_part)]
    order = [int(x) for x in rng.permutation(100)[: len(costs)]]
    dealt = deal_shapes(costs, order, parts, per_part, Additive((0,)), lambda s: s[0])
    assert dealt == deal(costs, order, parts, per_part)


def test_the_summed_cost_puts_both_vision_calls_on_one_rank_and_the_grouped_deal_does_not():
    """Two images (3 tiles, 1 tile) and two texts as dear as them alone: summed, each rank takes
    one dear and one cheap sample, and one rank gets both images (two tower passes in one call,
    the other rank none); the grouped deal gives each rank one image."""
    model = _grouped(
        {
            **dict.fromkeys(MICRO_BATCH_FEATURES, 0.0),
            **{"llm_tokens": 1e-3, "vision_tiles": 1e-3, "vision_calls": 1e-2},
        },
        width=None,
    )
    works = [
        _work(llm_tokens=1, vision_tiles=3),
        _work(llm_tokens=4),
        _work(llm_tokens=1, vision_tiles=1),
        _work(llm_tokens=2),
    ]
    grouped = MicroBatchCost(works, EMPTY, model.shape_cost)
    costs = [model.predict_work(w) for w in works]
    plan = BatchPlan([[p] for p in range(4)], costs, [1] * 4, PlanState(1, 4), 0, grouped)
    summed = BatchPlan([[p] for p in range(4)], costs, [1] * 4, PlanState(1, 4))

    def as_run(dealt):
        return [sum(grouped.of(m) for m in rank) for rank in dealt]

    before = as_run(deal_plan(summed, 2, 1, fixed=True))
    after = deal_plan(plan, 2, 1, fixed=True)
    assert max(before) / np.mean(before) > 1.4
    assert max(as_run(after)) / np.mean(as_run(after)) < 1.05
    assert rank_costs(plan, after) == pytest.approx(as_run(after))
    images = [sum(works[i][3] > 0 for m in rank for i in m) for rank in after]
    assert images == [1, 1]


def test_a_sample_goes_where_it_adds_least_not_to_the_cheapest_micro_batch():
    """A small image joins the micro-batch that already runs the vision tower (1 tile more), not
    the cheaper text-only one (a whole tower call more)."""
    model = _grouped(
        {
            **dict.fromkeys(MICRO_BATCH_FEATURES, 0.0),
            **{"llm_tokens": 1e-3, "vision_tiles": 1e-3, "vision_calls": 1e-2},
        },
        width=None,
    )
    works = [
        _work(vision_tiles=5),
        _work(llm_tokens=14),
        _work(vision_tiles=1),
        _work(llm_tokens=1),
    ]
    dealt = deal_shapes(works, range(4), 2, 2, EMPTY, model.shape_cost)
    assert dealt == [[0, 2], [1, 3]]
    costs = [MicroBatchCost(works, EMPTY, model.shape_cost).of(m) for m in dealt]
    assert costs == pytest.approx([16e-3, 15e-3])


def test_towers_are_the_calls_of_a_sample_alone():
    rng = np.random.default_rng(0)
    for _ in range(50):
        work = tuple(float(x) for x in rng.integers(0, 3, len(FEATURES)))
        calls = EMPTY.grow(work).as_run(None)[len(FEATURES) :]
        assert towers(work) == tuple(c > 0 for c in calls)


def _tower_stream(positions):
    """Texts of 8-10 tokens; every fourth sample an image of one tile and as many tokens."""
    out = []
    for p in positions:
        tokens = 8 + p % 3
        work = _work(llm_tokens=tokens, vision_tiles=1 if p % 4 == 3 else 0)
        out.append((tokens, work))
    return out


def _tower_plans(planner, batches: int) -> list:
    return [planner.plan(b) for b in range(batches)]


def test_a_grouped_global_batch_takes_samples_that_run_the_oldest_ones_towers(monkeypatch):
    """Like lengths alone put one or two images among texts of the same length: one micro-batch
    pays the vision tower's call that the others do not, and no dealing evens it out. With a
    grouped cost, a global batch takes samples of the oldest one's towers (all texts or all
    images here) and every micro-batch costs the same; no sample is placed twice (the planner's
    property checks with this rule: `test_grouped_plans_never_repeat_or_drop_a_sample_and_resume_exactly`).
    Without the rule (patched out) the same stream deals batches 30% apart."""
    from energon_platform.loader.balance.planner import Planner

    cost = SampleCost("measured", None, 0.0, "run.yaml", _grouped())

    def ratios(plans):
        out = []
        for plan in plans:
            per_rank = rank_costs(plan, deal_plan(plan, 4, 1, fixed=True))
            out.append(max(per_rank) / np.mean(per_rank))
        return out

    plans = _tower_plans(Planner(_tower_stream, cost, 8, window=256, like_lengths=True), 40)
    for plan in plans:
        patterns = {towers(_tower_stream(item)[0][1]) for item in plan.items}
        assert len(patterns) == 1, plan.items
    placed = [p for plan in plans for item in plan.items for p in item]
    assert len(placed) == len(set(placed)) and max(placed) < 40 * 8 + 256
    assert max(ratios(plans)) < 1.05

    monkeypatch.setattr(Planner, "_same_towers", staticmethod(lambda live, pool, g: live))
    mixed = _tower_plans(Planner(_tower_stream, cost, 8, window=256, like_lengths=True), 40)
    assert max(ratios(mixed)) > 1.3


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("accumulation", [1, 2])
def test_grouped_plans_never_repeat_or_drop_a_sample_and_resume_exactly(seed, accumulation):
    from energon_platform.loader.balance.plans import PlanError

    case = MeasuredCase(seed, "unpacked")
    cost = SampleCost("measured", None, 0.0, "run.yaml", _grouped())
    case_planner = case.planner

    def planner(start=PlanState()):
        made = case_planner(start)
        made.cost = cost
        return made

    straight = planner()
    try:
        plans = _plans(case, straight, range(BATCHES))
    except PlanError as e:
        assert "\n" not in str(e)
        return
    assert all(plan.grouped is not None for plan in plans)
    _check(case, plans, PlanState())
    for plan in plans:
        for world in (1, 2, 4):
            if len(plan.items) % (world * accumulation):
                continue
            dealt = deal_plan(plan, world, accumulation, fixed=True)
            assert [len(rank) for rank in dealt] == [accumulation] * world
            sizes = {len(m) for rank in dealt for m in rank}
            assert sizes == {len(plan.items) // (world * accumulation)}
            assert sorted(i for rank in dealt for m in rank for i in m) == list(
                range(len(plan.items))
            )
            assert dealt == deal_plan(plan, world, accumulation, fixed=True)  # deterministic
    middle = BATCHES // 3
    resumed = planner(PlanState.from_json(straight.state_at(middle).to_json()))
    again = _plans(case, resumed, range(middle, BATCHES))
    for a, b in zip(plans[middle:], again):
        assert a.items == b.items
        assert deal_plan(a, 2, 1, fixed=True) == deal_plan(b, 2, 1, fixed=True)


def _v1_digest(coefficients: dict) -> str:
    """The digest version 1 cost models always had (saved checkpoints compare it)."""
    text = json.dumps({"features": list(FEATURES), "coefficients": coefficients})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_a_version_1_model_keeps_its_digest_and_a_grouped_ones_names_its_row_width():
    v1 = {n: 1e-4 * (i + 1) for i, n in enumerate(FEATURES)}
    assert CostModel(v1, "m", "e").digest == _v1_digest(v1)
    assert _grouped().digest != _grouped(width=4096).digest != _grouped(width=None).digest


@pytest.fixture
def encoder():
    from task_encoders.registry import get_encoder
    from tests.helpers import REPO

    return get_encoder(str(REPO / "configs/encoders/image_text_small.yaml"))


def _file(tmp_path, encoder, **changes):
    from energon_platform.loader.fingerprint import encoder_digest

    data = {
        "format_version": 2,
        "features": list(MICRO_BATCH_FEATURES),
        "coefficients": dict(CALLS),
        "row_width": LONGEST,
        "model": "two_tower",
        "encoder_digest": encoder_digest(encoder),
        **changes,
    }
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(data))
    return path


def test_a_version_2_cost_file_loads_grouped_with_its_row_width(tmp_path, encoder):
    from energon_platform.loader.balance.cost_file import load_cost_model

    model = load_cost_model(_file(tmp_path, encoder), encoder)
    assert model.grouped and model.row_width == LONGEST and model.coefficients == CALLS
    assert load_cost_model(_file(tmp_path, encoder, row_width=512), encoder).row_width == 512


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"row_width": 0}, "row_width"),
        ({"row_width": "widest"}, "row_width"),
        ({"row_width": True}, "row_width"),
        ({"features": list(FEATURES)}, "features"),
        ({"coefficients": {**CALLS, "vision_calls": -1.0}}, "coefficients.vision_calls"),
        ({"coefficients": {n: CALLS[n] for n in FEATURES}}, "coefficients.vision_calls"),
        ({"format_version": [2]}, "format_version"),
    ],
)
def test_a_bad_version_2_cost_file_is_one_line_naming_the_field(tmp_path, encoder, changes, field):
    from energon_platform.loader.balance.cost_file import CostFileError, load_cost_model

    path = _file(tmp_path, encoder, **changes)
    with pytest.raises(CostFileError, match=field) as e:
        load_cost_model(path, encoder)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_a_saved_history_of_both_versions_continues_and_a_bad_row_width_is_refused():
    from energon_platform.loader.balance.cost_history import CostEntry, CostHistory
    from energon_platform.loader.state import StateMismatchError

    v1 = CostModel({n: CALLS[n] for n in FEATURES}, "m", "e")
    v2 = _grouped()
    saved = CostHistory([CostEntry(0, v1, None), CostEntry(3, v2, None)]).to_json()
    assert "row_width" not in saved[0] and saved[1]["row_width"] == LONGEST
    now = CostHistory([CostEntry(0, v2, "now")])
    history, changes = now.continued(json.loads(json.dumps(saved)), 5, lambda m: m)
    assert changes == [] and [e.model.digest for e in history.entries] == [v1.digest, v2.digest]
    assert history.at(4).row_width == LONGEST and not history.at(1).grouped
    bad = [dict(saved[1], batch=0, row_width=-2)]
    with pytest.raises(StateMismatchError, match="row_width"):
        now.continued(bad, 5, lambda m: m)


def test_the_loader_deals_unpacked_micro_batches_by_a_grouped_cost_and_resumes_them(coco, tmp_path):
    """Through the loader (one rank, two micro-batches per global batch): each micro-batch holds
    the samples the grouped deal gave it (their planned tokens and tiles are what it encodes),
    the balance stats cost micro-batches as wholes, and a loader restored mid-batch goes on with
    the same micro-batches."""
    import torch

    from energon_platform import TrainLoader, load_config
    from task_encoders.registry import get_encoder
    from tests.helpers import REPO

    vlm = str(REPO / "configs/encoders/image_text_vlm_small.yaml")
    width = get_encoder(vlm).seq_len
    cost = _file(tmp_path, get_encoder(vlm), row_width=width)

    def loader() -> TrainLoader:
        section = {"global_batch_size": 8, "micro_batch_size": 2, "num_workers": 0, "seed": 3}
        section.update(balance="measured", cost_model=str(cost))
        section["length_cache"] = str(tmp_path / "lengths")
        data = {"path": str(coco), "val_split": None}
        return TrainLoader(load_config({"data": data, "encoder": vlm, "loader": section}), 0)

    first = loader()
    planner = first.plan.batching.planner
    assert first.accumulation == 4 and planner.cost_at(0).cost_model.row_width == width
    for step in range(2):
        plan = planner.plan(step)
        assert plan.grouped is not None
        dealt = deal_plan(plan, 1, first.accumulation, fixed=True)
        for part in dealt[0]:
            batch = first.encoder.batch_features(next(first))
            works = [plan.grouped.works[i] for i in part]
            assert batch["samples"] == len(part) == 2
            assert batch["llm_tokens"] == sum(w[1] for w in works)
            assert batch["vision_tiles"] == sum(w[3] for w in works)
    stats = first.balance_stats(0)
    assert set(stats["rank_cost_by_module"]) == {"llm", "vision", "audio", "points"}
    state = first.state_dict()
    expected = [next(first) for _ in range(3)]
    again = loader()
    again.load_state_dict(state)
    for want in expected:
        got = next(again)
        assert torch.equal(got.tokens, want.tokens)
    first.close()
    again.close()
