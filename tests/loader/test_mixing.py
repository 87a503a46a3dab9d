"""Online data mixing (``loader.blend_adapt``): the methods are deterministic, weights stay on
their grid above the floor, the loader draws the decided weights from their batch on with or
without workers, a resume at any step (between an update and its lag included) continues exactly,
every dataset still walks its own epochs, and what cannot continue is refused in one line."""

from __future__ import annotations

import json
import random
import shutil
from fractions import Fraction
from pathlib import Path

import pytest

from energon_platform.loader.mixing import METHODS, make_method
from energon_platform.loader.mixing.adapter import GRID, AdaptError, on_grid
from scripts.bench.data import three_modality_blend
from tests.helpers.layouts import loaders_at

#: a loss per dataset that the methods can tell apart
LOSS = {"coco_mini": 1.0, "librispeech_mini": 5.0, "text_mini": 2.5}


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    return three_modality_blend(tmp_path_factory.mktemp("mixing"))


def cfg(blend, workers=0, fixed=False, **adapt):
    """The run config over ``blend``; ``fixed``: ``loader.blend_adapt`` null."""
    from energon_platform.config import load_config

    adapt = None if fixed else {"method": "loss_ratio", "every": 2, "lag": 2, **adapt}
    return load_config(
        {
            "data": {"path": str(blend), "val_split": None},
            "encoder": "configs/encoders/multimodal.yaml",
            "loader": {
                "global_batch_size": 8,
                "num_workers": workers,
                "seed": 3,
                "blend_adapt": adapt,
            },
        }
    )


def loss_of(key: str, step: int) -> float:
    """A loss that falls for coco and librispeech, stays flat for text (as noise would)."""
    name = key.split(":")[0]
    return LOSS[name] * (0.9**step if name != "text_mini" else 1.0)


def steps(loader, first: int, last: int, report=True) -> list[list[str]]:
    """Global batches ``first`` to ``last - 1`` (keys), each reported as the trainer does."""
    out = []
    for step in range(first, last):
        keys = [k for _ in range(loader.accumulation) for k in next(loader).__key__]
        out.append(keys)
        if report:
            loader.report_losses(step, keys, [loss_of(k, step) for k in keys])
    return out


def make(blend, workers=0, fixed=False, **adapt):
    from energon_platform.loader.train_loader import TrainLoader

    return TrainLoader(cfg(blend, workers, fixed, **adapt), num_workers=workers)


# --- the methods ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_method_is_deterministic_and_continues_from_its_state(method):
    rng = random.Random(7)
    # noisy losses that fall at a rate of their own per dataset (pure noise moves no ado weight)
    inputs = [
        [rng.choice([None, rng.uniform(0.5, 9) / (1 + i) ** d]) for d in range(3)]
        for i in range(20)
    ]
    a = make_method(method, ["x", "y", "z"], [2, 1, 1], {})
    b = make_method(method, ["x", "y", "z"], [2, 1, 1], {})
    out_a = [a.update(x) for x in inputs]
    out_b = []
    for i, x in enumerate(inputs):
        if i == 9:  # b restarts from its state, as after a resume
            saved = b.state_dict()
            b = make_method(method, ["x", "y", "z"], [2, 1, 1], {})
            b.load_state_dict(saved)
        out_b.append(b.update(x))
    assert out_a == out_b
    assert all(w >= 0 for ws in out_a for w in ws) and len({tuple(w) for w in out_a}) > 1


def test_a_method_says_which_options_it_has():
    with pytest.raises(
        ValueError, match=r"has no option\(s\) \['eta'\] \(its options: \['smoothing'\]"
    ):
        make_method("odm", ["x", "y"], [1, 1], {"eta": 1})
    with pytest.raises(
        ValueError, match=r"no mixing method 'doremi' \(methods: \['ado', 'loss_ratio', 'odm'\]"
    ):
        make_method("doremi", ["x", "y"], [1, 1], {})


def test_weights_land_on_the_grid_never_below_the_floor():
    rng = random.Random(3)
    cases = [([1e9, 1e-9], 0.3), ([0, 0, 0], 0.0), ([100, 1], 0.02), ([0.5, 0.5], 0.5)]
    cases += [
        ([rng.random() ** 6 for _ in range(rng.randint(2, 9))], rng.random() / 9)
        for _ in range(300)
    ]
    for weights, floor in cases:
        got = [Fraction(w) for w in on_grid(weights, floor)]
        assert sum(got) == 1, (weights, floor)
        assert all(w >= floor - Fraction(1, 10**9) and (w * GRID).denominator == 1 for w in got)
        if sum(weights) and floor == 0:  # largest remainder: within one grid step of the share
            assert all(abs(float(g) - w / sum(weights)) <= 1 / GRID for g, w in zip(got, weights))


# --- the loader ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def straight(blend):
    """16 global batches of an uninterrupted run, with workers, and the weights it used."""
    loader = make(blend, workers=2)
    keys = steps(loader, 0, 16)
    weights = [loader.blend_weights(b) for b in range(16)]
    loader.close()
    return keys, weights, loader.plan


def test_weights_follow_the_losses_from_their_batch_on_with_or_without_workers(blend, straight):
    keys, weights, _ = straight
    assert steps(make(blend, workers=0), 0, 16) == keys  # workers learn the weights by file
    first = weights[0]
    assert weights[:4] == [first] * 4  # update after step 1 applies from batch 1 + 1 + lag = 4
    assert weights[4] != first and weights[4] == weights[5]
    # text's loss stays flat: it loses weight; librispeech's falls most: it gains
    assert weights[-1]["text_mini"] < first["text_mini"] / 2
    assert weights[-1]["librispeech_mini"] > first["librispeech_mini"]
    drawn = {n: sum(k.startswith(n + ":") for k in keys[-1] + keys[-2]) for n in LOSS}
    assert drawn["text_mini"] <= 2  # what the weights say is what the batches hold


def layout_steps(blend, method, ranks, workers, first, last, state=None):
    """Global batches ``first`` to ``last - 1`` of a ``ranks``-rank run (keys, ranks in order) and
    the weights they were drawn with, then rank 0's state. Each rank reports the whole global
    batch's losses: the sums the all-reduce gives every rank of a real run."""
    loaders = loaders_at(cfg(blend, workers, method=method), ranks, state, workers)
    out, weights = [], []
    for step in range(first, last):
        keys = [k for lo in loaders for _ in range(lo.accumulation) for k in next(lo).__key__]
        for lo in loaders:
            lo.report_losses(step, keys, [loss_of(k, step) for k in keys])
        out.append(keys)
        weights.append(loaders[0].blend_weights(step))
    saved = json.loads(json.dumps(loaders[0].state_dict()))
    for lo in loaders:
        lo.close()
    return out, weights, saved


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_method_resumes_exactly_from_2_ranks_to_1_and_from_1_worker_to_3(blend, method):
    """Killed at step 9 (after the update of step 7, before the batch its weights apply from)."""
    straight, weights, _ = layout_steps(blend, method, 2, 0, 0, 16)
    assert len({json.dumps(w) for w in weights}) >= 3  # the method moved the weights
    head, _, state = layout_steps(blend, method, 2, 0, 0, 9)
    tail, after, _ = layout_steps(blend, method, 1, 0, 9, 16, state)
    assert head + tail == straight and after == weights[9:]
    one, weights_one, _ = layout_steps(blend, method, 1, 1, 0, 16)
    head, _, state = layout_steps(blend, method, 1, 1, 0, 9)
    tail, after, _ = layout_steps(blend, method, 1, 3, 9, 16, state)
    assert head + tail == one and after == weights_one[9:]


@pytest.mark.parametrize("at", [3, 4, 5, 6, 9])
def test_a_resume_at_any_step_continues_the_same_weights_and_samples(blend, straight, at):
    """Updates after steps 1, 3, 5, ...; each applies two batches later: a resume at 3..6 falls
    between an update and the batch it applies from."""
    first = make(blend)
    head = steps(first, 0, at)
    state = first.state_dict()
    resumed = make(blend, workers=2 if at % 2 else 0)
    resumed.load_state_dict(state)
    assert head + steps(resumed, at, 16) == straight[0]
    resumed.close()


def test_every_dataset_walks_its_own_epochs_once_each(straight):
    """Whatever the weights, a dataset's draws are its own order: no sample twice in an epoch,
    and an epoch is whole before the next one starts."""
    plan = straight[2]
    seen: dict[int, list[tuple[int, int]]] = {}
    for b in range(16):
        for item in plan.schedule.items(b, range(8)):
            for d, epoch, index in item:
                seen.setdefault(d, []).append((epoch, index))
    for d, drawn in seen.items():
        size = len(plan.datasets.entries[d].source)
        assert len(set(drawn)) == len(drawn), d
        assert [e for e, _ in drawn] == sorted(e for e, _ in drawn)
        assert all(sum(e == k for e, _ in drawn) == size for k in range(drawn[-1][0])), d
    assert max(e for drawn in seen.values() for e, _ in drawn) >= 1  # some dataset wrapped


def test_a_missing_report_stops_the_run_naming_the_step(blend):
    loader = make(blend, workers=2)
    steps(loader, 0, 2)
    steps(loader, 2, 6, report=False)  # batches up to 5: decided by step 1's update at the latest
    with pytest.raises(
        AdaptError,
        match="global batch 6 needs the weights decided after step 3, but the losses "
        "of step 2 were not reported",
    ):
        next(loader)
    loader.close()
    with pytest.raises(AdaptError, match="losses reported for step 5, but step 0 is due"):
        make(blend).report_losses(5, [], [])


def test_a_saved_mixer_of_another_method_or_blend_is_refused_in_one_line(blend, tmp_path):
    import yaml

    from energon_platform.loader.state import StateMismatchError

    loader = make(blend)
    steps(loader, 0, 3)
    state = loader.state_dict()
    with pytest.raises(
        StateMismatchError,
        match=r"^loader.blend_adapt.method: the saved mixer has 'loss_ratio', the config 'odm'",
    ) as e:
        make(blend, method="odm").load_state_dict(state)
    assert "\n" not in str(e.value)
    with pytest.raises(StateMismatchError, match="loader.blend_adapt.every: the saved mixer has 2"):
        make(blend, every=3).load_state_dict(state)
    # a dataset added at resume: fine for fixed weights, not for a mixer over the saved three
    shutil.copytree(blend.parent / "text_mini", tmp_path / "text_two")
    four = tmp_path / "four.yaml"
    mds = yaml.safe_load(blend.read_text())
    mds["splits"]["train"]["blend"].append({"weight": 1, "path": str(tmp_path / "text_two")})
    four.write_text(yaml.safe_dump(mds))
    with pytest.raises(StateMismatchError, match=r"the saved run blends \['coco_mini', "):
        make(four).load_state_dict(state)
    fixed = make(four, fixed=True)
    fixed.load_state_dict(state)  # loader.blend_adapt null: the blend may change at resume
    assert fixed.adapter is None and fixed.blend_weights(3)["text_two"] > 0


def test_the_spelling_of_the_issue_works_as_written(blend, tmp_path):
    """``loader.blend_adapt: {method: odm, every: 4, lag: 2}`` in a run config file."""
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    path = tmp_path / "run.yaml"
    path.write_text(
        f"data: {{path: {blend}, val_split: null}}\n"
        f"encoder: {Path('configs/encoders/multimodal.yaml').resolve()}\n"
        "loader:\n  global_batch_size: 8\n  num_workers: 0\n"
        "  blend_adapt: {method: odm, every: 4, lag: 2}\n"
    )
    loader = TrainLoader(load_config(path), num_workers=0)
    steps(loader, 0, 12)
    weights = [loader.blend_weights(b) for b in range(12)]
    assert weights[:6] == [weights[0]] * 6 and weights[6] != weights[0]  # after step 3, lag 2
    assert loader.state_dict()["blend_adapt"]["method"] == "odm"


def test_a_sample_without_targets_nan_is_left_out_of_the_means():
    from types import SimpleNamespace

    from energon_platform.loader.mixing import BlendAdapter

    config = SimpleNamespace(
        method="loss_ratio", every=1, lag=1, floor=0.0, resolution=0.01, options={}
    )
    adapter = BlendAdapter(config, ["a", "b"], ["1/2", "1/2"], 0, 8)
    adapter.report(0, [0, 1, 1], [2.0, 4.0, float("nan")])
    segment = adapter.report(1, [0, 1, 1], [1.0, float("nan"), 3.0])
    assert [r[-1] for r in adapter.method.recent] == [1.0, 3.0] and segment is not None
