"""``loader.balance: measured``: a calibrated cost model's predicted time of each sample's cost
features is the planner's cost.

Pure planner: the property checks of :mod:`tests.loader.test_plan_no_repeats` hold for the
measured cost (packed, unpacked, budgeted, straight and resumed, dealt to 1, 2 and 8 ranks), and
on samples whose vision work and tokens disagree, measured balances the predicted cost over ranks
better than attention. Loader: the fingerprint names the cost features, the balance stats
carry its per-module spread, another cost file at resume is recorded in the state's cost history
(earlier steps replay as planned), a bad cost file is one line through the CLI, and a measured
run resumes exactly after a SIGKILL on another layout.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from energon_platform.loader.balance.cost_file import CostModel
from energon_platform.loader.balance.costs import SampleCost
from energon_platform.loader.balance.dealing import deal_plan, rank_costs
from energon_platform.loader.balance.planner import Planner
from energon_platform.loader.balance.plans import PlanState
from task_encoders.features import FEATURES, MICRO_BATCH_FEATURES, MODULES, features
from tests.loader.test_plan_no_repeats import BATCHES, CAP, Case, _check, _plans

#: seconds per unit: the vision tower dominates (a tile costs as much as 64 positions)
VISION_HEAVY = {**dict.fromkeys(FEATURES, 0.0), "llm_tokens": 1e-5, "vision_tiles": 6.4e-4}


def _cost(coefficients: dict = VISION_HEAVY) -> SampleCost:
    return SampleCost("measured", None, 0.0, "run.yaml", CostModel(coefficients, "m", "e"))


def _work(row: int, tiles: int) -> tuple[float, ...]:
    values = features(samples=1, llm_tokens=row, llm_attention=row * row, vision_tiles=tiles)
    return tuple(values[name] for name in FEATURES)


class MeasuredCase(Case):
    """:class:`Case` whose samples also have vision tiles, planned with the measured cost."""

    costs_like_lengths = False  #: like lengths, costs that also count tiles

    def __init__(self, seed: int, mode: str):
        super().__init__(seed, mode)
        rng = np.random.default_rng(seed + 1000)
        self.tiles = [rng.integers(0, 9, n) for n in self.sizes]

    def lookup(self, positions):
        d, _, i = self.schedule.samples(positions)
        return [
            (int(self.lengths[a][b]), _work(int(self.lengths[a][b]), int(self.tiles[a][b])))
            for a, b in zip(d.tolist(), i.tolist())
        ]

    def planner(self, start: PlanState = PlanState()) -> Planner:
        cost = _cost()
        kw = dict(window=self.window, samples=self.copies, start=start)
        if self.mode == "packed":
            return Planner(self.lookup, cost, self.g, capacity=CAP, **kw)
        if self.mode == "budget":
            return Planner(self.lookup, cost, self.g, budget=self.g * 4 * cost(_work(12, 4)), **kw)
        return Planner(self.lookup, cost, self.g, like_lengths=True, **kw)  # as the loader plans


@pytest.mark.parametrize(
    "seed,mode", [(s, m) for m in ("unpacked", "packed", "budget") for s in range(8)]
)
def test_measured_plans_never_repeat_or_drop_a_sample_and_resume_exactly(seed, mode):
    from energon_platform.loader.balance.plans import PlanError

    case = MeasuredCase(seed, mode)
    straight = case.planner()
    try:
        plans = _plans(case, straight, range(BATCHES))
    except PlanError as e:  # a blend too small for its share: refused in one line, never repeated
        assert "\n" not in str(e)
        return
    assert {c for plan in plans for c in plan.costs} != {0.0}
    _check(case, plans, PlanState())
    middle = BATCHES // 3
    resumed = case.planner(PlanState.from_json(straight.state_at(middle).to_json()))
    again = _plans(case, resumed, range(middle, BATCHES))
    assert [p.items for p in again] == [p.items for p in plans[middle:]]
    _check(case, again, resumed.start)


def test_measured_balances_the_predicted_cost_better_than_attention_when_tiles_and_tokens_disagree():
    """Half the samples are long texts without images, half short captions of many tiles: by
    attention the captions are cheap, by the calibrated model they are the expensive ones."""
    rng = np.random.default_rng(3)
    n = 4096
    rows = np.where(np.arange(n) % 2 == 0, rng.integers(40, 64, n), rng.integers(4, 16, n))
    tiles = np.where(np.arange(n) % 2 == 0, 0, rng.integers(1, 16, n))
    works = [_work(int(r), int(t)) for r, t in zip(rows, tiles)]
    model = CostModel(VISION_HEAVY, "m", "e")
    seconds = [model.predict(dict(zip(FEATURES, w))) for w in works]  # the truth, not the planner's

    def lookup(positions):
        return [(int(rows[p]), works[p]) for p in positions]

    def attention(work: tuple) -> float:
        length = work[FEATURES.index("llm_tokens")]
        return length * length + 64 * length

    spreads = {}
    for name, cost in (("attention", attention), ("measured", _cost())):
        planner = Planner(lookup, cost, 32, window=1024)
        per_step = []
        for b in range(40):
            plan = planner.plan(b)
            dealt = deal_plan(plan, 8, 1, fixed=True)
            predicted = [sum(seconds[plan.items[i][0]] for m in rank for i in m) for rank in dealt]
            per_step.append(max(predicted) / (sum(predicted) / len(predicted)))
        spreads[name] = float(np.mean(per_step))
    assert spreads["measured"] < 1.05 < spreads["attention"], spreads


def test_unpacked_measured_takes_samples_of_like_length_since_a_micro_batch_is_padded():
    """Samples of 8-63 positions and 0-15 tiles: by predicted time many are alike whose lengths are
    not, and a micro-batch of two pays its longest sample's positions twice. Samples of like length
    (how ``measured`` plans unpacked) even the ranks' padded time out; samples of like cost do not.
    """
    rng = np.random.default_rng(5)
    n = 4096
    rows, tiles = rng.integers(8, 64, n), rng.integers(0, 16, n)
    coefficients = {**VISION_HEAVY, "llm_tokens": 3e-4}  # a tile costs as much as 2.1 positions
    works = [_work(int(r), int(t)) for r, t in zip(rows, tiles)]

    def padded(micro: list[int]) -> float:  # a micro-batch's time: every row as long as its longest
        longest = max(int(rows[p]) for p in micro)
        return coefficients["llm_tokens"] * len(micro) * longest + coefficients[
            "vision_tiles"
        ] * sum(int(tiles[p]) for p in micro)

    spreads = {}
    for like in (False, True):
        planner = Planner(
            lambda ps: [(int(rows[p]), works[p]) for p in ps],
            _cost(coefficients),
            16,
            window=1024,
            like_lengths=like,
        )
        per_step = []
        for b in range(40):
            plan = planner.plan(b)
            dealt = deal_plan(plan, 8, 1, fixed=True)
            seconds = [padded([plan.items[i][0] for m in rank for i in m]) for rank in dealt]
            per_step.append(max(seconds) / (sum(seconds) / len(seconds)))
        spreads[like] = float(np.mean(per_step))
    assert spreads[True] - 1 < 0.6 * (spreads[False] - 1), spreads  # half the excess, here


def test_the_modules_cover_every_feature_once():
    named = [f for names in MODULES.values() for f in names]
    assert sorted(named) == sorted(MICRO_BATCH_FEATURES)


def test_a_feature_tuple_is_predicted_to_the_same_float_as_its_mapping():
    """The planner's fast path (`CostModel.predict_work`) sums the same terms in the same order
    as `predict`, whatever order the file lists the coefficients in: plans stay bit-identical."""
    rng = np.random.default_rng(5)
    for trial in range(200):
        names = list(FEATURES)
        rng.shuffle(names)
        model = CostModel({n: float(rng.uniform(0, 1e-3)) for n in names}, "m", "e")
        work = tuple(float(x) for x in rng.integers(0, 5000, len(FEATURES)) * rng.random())
        assert model.predict_work(work) == model.predict(dict(zip(FEATURES, work))), trial


def test_rank_costs_of_a_measured_plan_are_the_models_predictions():
    works = [_work(10, 2), _work(20, 0), _work(5, 8), _work(30, 1)]
    planner = Planner(lambda ps: [(10, works[p % 4]) for p in ps], _cost(), 4, window=64)
    plan = planner.plan(0)
    model = CostModel(VISION_HEAVY, "m", "e")
    total = sum(
        model.predict(dict(zip(FEATURES, works[p % 4]))) for item in plan.items for p in item
    )
    assert sum(rank_costs(plan, deal_plan(plan, 2, 1, fixed=True))) == pytest.approx(total)


# ------------------------------------------------------------------ through the loader and the CLI

from tests.loader.test_balance import three_packed  # noqa: E402,F401  (the packed blend fixture)

ENCODER_YAML = "configs/encoders/multimodal_packed.yaml"


def _cost_file(path, encoder: str = ENCODER_YAML, **coefficients):
    """A cost file for ``encoder`` (default: the packed multimodal one) with these coefficients
    (others 0)."""
    from energon_platform.loader.fingerprint import encoder_digest
    from energon_platform.training.calibrate import write_report
    from task_encoders.registry import get_encoder
    from tests.helpers import REPO

    data = {
        "format_version": 1,
        "features": list(FEATURES),
        "coefficients": {**dict.fromkeys(FEATURES, 0.0), **coefficients},
        "model": "two_tower",
        "encoder_digest": encoder_digest(get_encoder(str(REPO / encoder))),
    }
    write_report(data, path)
    return path


def _measured_config(mds, cache, cost, **loader):
    from tests.loader.test_balance import _config

    return _config(mds, cache, balance="measured", cost_model=str(cost), **loader)


def test_a_measured_loader_fingerprints_its_cost_features_and_logs_each_modules_spread(
    three_packed, tmp_path
):
    from energon_platform.loader.train_loader import TrainLoader

    mds, cache = three_packed
    cost = _cost_file(tmp_path / "a.json", **TILES)
    loader = TrainLoader(_measured_config(mds, cache, cost), num_workers=0)
    balance = loader.plan.fingerprint["balance"]
    assert balance["mode"] == "measured" and balance["cost_model"] == {"features": list(FEATURES)}
    stats = loader.balance_stats(0)
    assert stats["rank_cost"] >= 1.0 and set(stats["rank_cost_by_module"]) == set(MODULES)
    assert all(v >= 1.0 for v in stats["rank_cost_by_module"].values())
    (entry,) = loader.state_at(loader.accumulation)["plan"]["costs"]
    assert entry["batch"] == 0 and entry["digest"] == _digest(loader)
    assert entry["coefficients"] == {**dict.fromkeys(FEATURES, 0.0), **TILES}
    loader.close()


def test_the_loader_plans_unpacked_measured_batches_of_like_length(coco, tmp_path, caplog):
    """Unpacked, ``measured`` takes a global batch's samples of like row length (a micro-batch is
    padded to its longest) and says so in its fingerprint; the other modes take samples of like
    cost. A checkpoint saved when ``measured`` took samples of like cost (an earlier format) is
    refused in one line."""
    from energon_platform import TrainLoader, load_config
    from tests.helpers import REPO

    vlm = "configs/encoders/image_text_vlm_small.yaml"
    cost = _cost_file(tmp_path / "cost.json", vlm, llm_tokens=1e-5, vision_tiles=1e-3)

    def loader(**balance) -> TrainLoader:
        section = {"global_batch_size": 4, "num_workers": 0, "seed": 3, **balance}
        section["length_cache"] = str(tmp_path / "lengths")
        data = {"path": str(coco), "val_split": None}
        config = {"data": data, "encoder": str(REPO / vlm), "loader": section}
        return TrainLoader(load_config(config), num_workers=0)

    measured = loader(balance="measured", cost_model=str(cost))
    assert measured.plan.batching.planner.like_lengths
    assert measured.plan.fingerprint["balance"]["samples"] == "like-length-same-towers"
    attention = loader(balance="attention")
    assert not attention.plan.batching.planner.like_lengths
    assert "samples" not in attention.plan.fingerprint["balance"]
    next(measured)
    state = measured.state_dict()
    from energon_platform.loader.state import StateMismatchError

    for earlier in (None, "like-length"):  # saved by builds that took like costs, or any towers
        if earlier is None:
            del state["fingerprint"]["balance"]["samples"]
        else:
            state["fingerprint"]["balance"]["samples"] = earlier
        with pytest.raises(StateMismatchError, match="samples") as e:
            loader(balance="measured", cost_model=str(cost)).load_state_dict(state)
        assert "\n" not in str(e.value)


#: two cost files that plan differently: vision and audio dominate, or attention alone
TILES = {"llm_tokens": 1e-5, "vision_tiles": 1e-3, "audio_frames": 1e-4}
ATTENTION = {"llm_attention": 1e-6, "samples": 1e-2}


def _measured_loader(three_packed, cost, state=None):
    """A measured loader of the packed blend with cost file ``cost``, restored from ``state``."""
    from energon_platform.loader.train_loader import TrainLoader

    mds, cache = three_packed
    loader = TrainLoader(_measured_config(mds, cache, cost), num_workers=0)
    if state is not None:
        loader.load_state_dict(state)
    return loader


def _digest(loader) -> str:
    """The digest of the cost model a loader's config names."""
    return loader.plan.batching.cost.cost_model.digest


def _items(planner, batches) -> list:
    return [planner.plan(b).items for b in batches]


def test_another_cost_file_at_resume_continues_and_is_recorded_with_its_step(
    three_packed, tmp_path, caplog
):
    import logging

    tiles = _cost_file(tmp_path / "tiles.json", **TILES)
    attention = _cost_file(tmp_path / "attention.json", **ATTENTION)
    first = _measured_loader(three_packed, tiles)
    old, new = _digest(first), None
    with caplog.at_level(logging.WARNING, logger="energon_platform.loader.run_plan"):
        resumed = _measured_loader(three_packed, attention, first.state_at(3 * first.accumulation))
    new = _digest(resumed)
    change = f"from global batch 3: loader.balance.cost_model digest {old} -> {new}"
    assert resumed.plan.blend_changes == [change]
    logged = [r.getMessage() for r in caplog.records if "cost model changed" in r.getMessage()]
    assert logged == [f"cost model changed at resume: {change}"]
    later = resumed.state_at(5 * resumed.accumulation)
    assert [(e["batch"], e["digest"]) for e in later["plan"]["costs"]] == [(0, old), (3, new)]
    # from the resume on, the new coefficients: the plans of the attention file from there
    alone = _measured_loader(three_packed, attention).plan.planner
    alone.restart(first.plan.planner.state_at(3))
    assert _items(resumed.plan.planner, range(3, 5)) == _items(alone, range(3, 5))
    assert resumed.plan.planner.plan(3).costs != first.plan.planner.plan(3).costs
    # a resume from the later state with the same file changes nothing
    again = _measured_loader(three_packed, attention, later)
    assert (
        not again.plan.blend_changes
        and again.state_dict()["plan"]["costs"] == later["plan"]["costs"]
    )
    for loader in (first, resumed, alone, again):
        getattr(loader, "close", lambda: None)()


def test_a_trace_from_a_checkpoint_after_a_cost_change_replays_the_steps_before_it(
    three_packed, tmp_path
):
    from energon_platform.loader.trace import Tracer

    tiles = _cost_file(tmp_path / "tiles.json", **TILES)
    attention = _cost_file(tmp_path / "attention.json", **ATTENTION)
    first = _measured_loader(three_packed, tiles)
    resumed = _measured_loader(three_packed, attention, first.state_at(3 * first.accumulation))
    latest = resumed.state_at(5 * resumed.accumulation)
    planned = _items(first.plan.planner, range(3)) + _items(resumed.plan.planner, range(3, 5))
    assert _items(_measured_loader(three_packed, tiles).plan.planner, range(3)) == planned[:3]
    attention_only = _items(_measured_loader(three_packed, attention).plan.planner, range(3))
    assert attention_only != planned[:3], "the two cost files plan the first steps alike"
    tracer = Tracer(_measured_loader(three_packed, attention, latest).plan)
    assert [tracer.batch_plan(b).items for b in range(5)] == planned
    assert [tracer.step(s)["keys"] for s in (1, 4)] == [
        sorted(Tracer(first.plan).step(1)["keys"]),
        sorted(Tracer(resumed.plan).step(4)["keys"]),
    ]


def test_a_state_saved_without_a_cost_history_is_refused_in_one_line(three_packed, tmp_path):
    """An earlier format (the cost model's digest in the fingerprint, no history) is not read."""
    from energon_platform.loader.state import StateMismatchError

    tiles = _cost_file(tmp_path / "tiles.json", **TILES)
    first = _measured_loader(three_packed, tiles)
    state = json.loads(json.dumps(first.state_at(2 * first.accumulation)))
    state["plan"].pop("costs")
    state["fingerprint"]["balance"]["cost_model"] = {"digest": _digest(first), "model": "two_tower"}
    with pytest.raises(StateMismatchError) as e:
        _measured_loader(three_packed, tiles, state)
    assert "\n" not in str(e.value) and "cost" in str(e.value), e.value


def test_a_cost_history_whose_digest_is_not_its_coefficients_is_refused(three_packed, tmp_path):
    from energon_platform.loader.state import StateMismatchError

    tiles = _cost_file(tmp_path / "tiles.json", **TILES)
    state = _measured_loader(three_packed, tiles).state_at(2)
    state["plan"]["costs"][0]["coefficients"]["samples"] = 1.0
    with pytest.raises(StateMismatchError, match=r"plan.costs\[0\].digest"):
        _measured_loader(three_packed, tiles, state)


def test_other_modes_keep_their_fingerprint_and_stats(three_packed):
    from energon_platform.loader.train_loader import TrainLoader
    from tests.loader.test_balance import _config

    mds, cache = three_packed
    loader = TrainLoader(_config(mds, cache), num_workers=0)
    assert "cost_model" not in loader.plan.fingerprint["balance"]
    assert "rank_cost_by_module" not in loader.balance_stats(0)
    loader.close()


def test_a_bad_cost_file_is_one_line_exit_2_through_the_cli(three_packed, tmp_path, capsys):
    import yaml

    from energon_platform import cli
    from tests.helpers import REPO

    mds, cache = three_packed
    cost = _cost_file(tmp_path / "cost.json", llm_tokens=-1.0)
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(mds), "val_split": None},
                "encoder": str(REPO / ENCODER_YAML),
                "loader": {
                    "global_batch_size": 8,
                    "num_workers": 0,
                    "balance": "measured",
                    "cost_model": "cost.json",  # relative to the config file
                    "length_cache": str(cache),
                },
            }
        )
    )
    assert cli.main(["trace", "--config", str(config), "--step", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(cost) in err[0] and "coefficients.llm_tokens" in err[0], err


@pytest.mark.slow
def test_check_resume_with_balance_measured_sigkill_and_elastic(three_packed, tmp_path):
    """Our trainer on the packed blend with ``balance: measured``: 2 ranks x 2 workers, SIGKILL
    during step 5, resumed on 1 rank x 1 worker: the same keys and tensors; the log rows carry the
    per-module rank cost."""
    import yaml

    from energon_platform.training.resume_check import RunSpec, check_resume
    from tests.helpers import REPO

    mds, cache = three_packed
    _cost_file(tmp_path / "cost.json", llm_tokens=1e-5, vision_tiles=1e-3, audio_frames=1e-4)
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(mds), "val_split": None},
                "encoder": str(REPO / ENCODER_YAML),
                "loader": {
                    "global_batch_size": 4,
                    "micro_batch_size": 1,
                    "num_workers": 2,
                    "seed": 11,
                    "balance": "measured",
                    "cost_model": "cost.json",
                    "length_cache": str(cache),
                },
                "model": {"dim": 32, "layers": 1, "heads": 2, "patch": 16},
                "train": {"steps": 6, "checkpoint_every": 3, "warmup": 2},
            }
        )
    )
    result = check_resume(
        RunSpec(str(config), 6, nproc=2),
        kill_at=5,
        out=tmp_path / "check",
        resume_nproc=1,
        resume_workers=1,
        tolerance=1e-5,
        log=lambda *_: None,
    )
    assert result["passed"] and result["keys_identical"] and result["tensors_identical"], result
    rows = [
        json.loads(line)
        for log in (tmp_path / "check").rglob("log.jsonl")
        for line in log.read_text().splitlines()
    ]
    modules = [r["rank_cost_by_module"] for r in rows if "rank_cost_by_module" in r]
    assert modules and all(set(m) == set(MODULES) for m in modules), rows[:2]
