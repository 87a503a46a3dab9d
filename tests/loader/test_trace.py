"""Provenance and exclusions: ``trace`` gives the keys the loader (and the trainer's log) gives, a
key's steps come from the inverse permutation and equal a scan, and ``loader.exclude`` skips
samples from a step on, exactly, across resumes, world sizes and SIGKILL."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import yaml

from scripts.bench.data import coco_dataset, three_modality_blend
from tests.helpers import REPO, layouts
from tests.helpers.cli import one_line_error_in_process, run_cli


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The embedded corpora, converted; ``blend``: a metadataset of the three at 2:1:1."""
    base = tmp_path_factory.mktemp("trace")
    mds = three_modality_blend(base)
    return {"coco": coco_dataset(base), "blend": mds}


def config(path, encoder="multimodal.yaml", **loader):
    from energon_platform.config import load_config

    return load_config(
        {
            "data": {"path": str(path), "val_split": None},
            "encoder": str(REPO / "configs/encoders" / encoder),
            "loader": {
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "num_workers": 0,
                "seed": 5,
                **loader,
            },
        }
    )


def run(cfg, steps, ranks=1, state=None):
    """``[(keys, digests)]`` of ``steps`` global batches over ``ranks`` in-process loaders, the
    state after them and the loaders' per-rank keys of the first batch."""
    from energon_platform.training.train import batch_digest

    loaders = layouts.loaders_at(cfg, ranks, state)
    out = []
    for _ in range(steps):
        parts = [[next(ld) for _ in range(ld.accumulation)] for ld in loaders]
        out.append(
            (
                [k for rank in parts for p in rank for k in p.keys],
                [d for rank in parts for p in rank for d in batch_digest(p)],
                [[list(p.keys) for p in rank] for rank in parts],
            )
        )
    return out, loaders[0].state_dict()


def tracer(cfg, ranks=1, state=None):
    from energon_platform.loader.trace import Tracer
    from energon_platform.loader.train_loader import TrainLoader

    loader = TrainLoader(cfg, rank=0, world_size=ranks, num_workers=0)
    if state is not None:
        loader.load_state_dict(state)
    return Tracer(loader.plan)


# --- the inverse maps, without data ------------------------------------------------------------


def test_inverses_undo_the_forward_maps():
    from energon_platform.loader.blend import Blend, Segment
    from energon_platform.loader.orders import DatasetOrder
    from energon_platform.loader.permutation import KeyedPermutation

    for n in (1, 2, 3, 1000, 10**9):
        p, x = KeyedPermutation(n, 99), np.arange(min(n, 3000))
        assert (p.inverse(p(x)) == x).all() and (p(p.inverse(x)) == x).all()
    for order in (
        DatasetOrder(1000, 7),
        DatasetOrder(1003, 7, 100),
        DatasetOrder(1003, 7, 100, run=4),
    ):
        x = np.arange(order.num_samples)
        assert (order.positions(3, order.indices(3, x)) == x).all()
    blend = Blend(
        [Segment(0, ("2", "1", "1")), Segment(40, ("0", "1", "3")), Segment(90, ("1", "1", "0"))], 3
    )
    units = np.arange(500)
    d, j = blend.locate(units)
    for dd in range(3):
        assert (blend.unit_of(dd, j[d == dd]) == units[d == dd]).all()
    assert blend.unit_of(2, [10**6])[0] == -1, (
        "a dataset at weight 0 for good never takes that unit"
    )


@pytest.mark.parametrize("unit,shuffle", [(1, None), (2, None), (1, 16)])
def test_key_search_equals_a_brute_force_scan(unit, shuffle):
    from energon_platform.loader.blend import Blend, Segment
    from energon_platform.loader.orders import DatasetOrder
    from energon_platform.loader.schedule import Schedule
    from energon_platform.loader.trace import step_layout, uses

    orders = (
        DatasetOrder(37, 11, shuffle),
        DatasetOrder(13, 12, shuffle),
        DatasetOrder(50, 13, shuffle),
    )
    blend = Blend([Segment(0, ("2", "1", "1")), Segment(30 // unit * unit, ("1", "3", "0"))], 3)
    schedule = Schedule(orders, 8, 1, blend, unit)
    batches = 40  # several epochs of every dataset
    seen: dict = {}
    for b in range(batches):
        lay = step_layout(schedule, b, 2, 2)
        for k, (d, e, i) in enumerate(
            zip(lay["dataset"].tolist(), lay["epoch"].tolist(), lay["index"].tolist())
        ):
            seen.setdefault((d, i), []).append((b, e, b * 8 + k))  # batch, epoch, stream position
    for d, order in enumerate(orders):
        for i in range(order.num_samples):
            assert uses(schedule, d, i, batches) == seen.get((d, i), []), (d, i)
    assert max(len(v) for v in seen.values()) >= 5


# --- trace equals what the loader makes ----------------------------------------------------------


@pytest.mark.parametrize("ranks", [1, 2])
def test_trace_equals_the_loaders_keys_ranks_and_micro_batches(data, ranks):
    cfg = config(data["coco"], "image_text_small.yaml")
    batches, _ = run(cfg, 3, ranks)
    t = tracer(cfg, ranks)
    for step, (keys, _, per_rank) in enumerate(batches, start=1):
        trace = t.step(step)
        assert trace["keys"] == keys
        for s in trace["samples"]:
            assert s["key"] in per_rank[s["rank"]][s["micro_batch"]]
        for s in trace["samples"][:2]:
            assert step in t.find(s["key"], 3)["steps"]


def test_trace_of_a_blend_after_weights_changed_at_resume(data):
    cfg = config(data["blend"])
    before, state = run(cfg, 3)
    changed = config(
        data["blend"], blend_schedule=[{"step": 0, "weights": {"coco_mini": 1, "text_mini": 3}}]
    )
    after, state2 = run(changed, 3, 2, state=state)
    assert not any(k.startswith("librispeech_mini:") for keys, _, _ in after for k in keys), (
        "the new weights apply"
    )
    t = tracer(changed, 2, state=state2)
    assert [t.step(s)["keys"] for s in range(1, 7)] == [keys for keys, _, _ in before + after]


# --- exclusions ----------------------------------------------------------------------------------


def test_an_exclusion_from_step_s_leaves_the_past_and_removes_its_samples_after(data):
    cfg = config(data["coco"], "image_text_small.yaml")
    reference, _ = run(cfg, 6)
    later = [k for keys, _, _ in reference[2:] for k in keys]
    rule = {"step": 2, "keys": later[:3], "shards": ["train/shard-00000[3]*"]}
    excl = config(data["coco"], "image_text_small.yaml", exclude=[rule])
    got, state = run(excl, 6)
    assert [g[:2] for g in got[:2]] == [r[:2] for r in reference[:2]], (
        "steps before S are untouched"
    )
    t = tracer(excl)
    shard_of = {
        s["key"]: s["shard"] for step in range(1, 7) for s in tracer(cfg).step(step)["samples"]
    }
    for step, (keys, _, _) in enumerate(got[2:], start=3):
        assert len(keys) == 8 and not set(keys) & set(later[:3])
        assert not [k for k in keys if shard_of.get(k) == "train/shard-000003.tar"]
        trace = t.step(step)
        assert trace["keys"] == keys and trace["excluded"]
    assert state["exclude"] == [
        {
            "start": 2,
            "end": None,
            "keys": later[:3],
            "shards": ["train/shard-00000[3]*"],
            "datasets": [],
        }
    ]
    assert t.find(later[0], 6)["excluded_steps"], (
        "the key's scheduled use after S shows as excluded"
    )
    # a resume on 2 ranks continues the same batches, the history from the state
    _, mid = run(excl, 3)
    resumed, _ = run(config(data["coco"], "image_text_small.yaml", exclude=[rule]), 3, 2, state=mid)
    assert [r[:2] for r in resumed] == [g[:2] for g in got[3:]]


def test_exclusions_added_and_removed_at_resume(data):
    cfg = config(data["blend"])
    reference, state = run(cfg, 3)
    drop = config(data["blend"], exclude=[{"step": 0, "datasets": ["text_mini"]}])
    from energon_platform.loader.train_loader import TrainLoader

    ld = TrainLoader(drop, num_workers=0)
    ld.load_state_dict(state)
    assert any("exclusion of datasets ['text_mini'] added" in c for c in ld.plan.blend_changes)
    after, state2 = run(drop, 3, state=state)
    assert not any(k.startswith("text_mini:") for keys, _, _ in after for k in keys)
    assert all(len(keys) == 8 for keys, _, _ in after)
    assert state2["exclude"][0]["start"] == 3, (
        "added at resume: from the resume batch, not its configured step"
    )
    again, state3 = run(cfg, 2, state=state2)  # the rule left the config: it ends at this resume
    assert any(k.startswith("text_mini:") for keys, _, _ in again for k in keys)
    assert state3["exclude"][0]["end"] == 6
    t = tracer(cfg, state=state3)
    assert [t.step(s)["keys"] for s in range(1, 9)] == [k for k, _, _ in reference + after + again]


def test_a_keys_steps_are_the_loaders_stand_in_uses_included(data):
    """``find`` lists every step whose batches hold the key, also where it trained as the
    stand-in of an excluded sample (``stand_in_for``), equal to the loader's batches."""
    cfg = config(data["coco"], "image_text_small.yaml")
    reference, _ = run(cfg, 6)
    excluded = [k for keys, _, _ in reference[1:] for k in keys][::3]
    excl = config(data["coco"], "image_text_small.yaml", exclude=[{"step": 1, "keys": excluded}])
    got, _ = run(excl, 6)
    seen: dict = {}
    for step, (keys, _, _) in enumerate(got, start=1):
        for k in keys:
            seen.setdefault(k, []).append(step)
    t = tracer(excl)
    found = {k: t.find(k, 6) for k in set(seen) | set(excluded)}
    assert {k: f["steps"] for k, f in found.items() if f["steps"]} == seen
    stand_ins = {
        k: u["stand_in_for"] for k, f in found.items() for u in f["uses"] if "stand_in_for" in u
    }
    assert len(stand_ins) >= len(excluded) - 1 and set(stand_ins.values()) <= set(excluded)
    assert all(found[k]["excluded_steps"] for k in excluded)


def test_a_keys_excluded_steps_start_at_the_rules_start_and_stop_at_its_end(data):
    """Rule from global batch 2 (logged step 3) to 4 (ended at a resume): a use at logged step 2
    or 5 is in ``steps``, uses at logged steps 3 and 4 in ``excluded_steps``."""
    cfg = config(data["coco"], "image_text_small.yaml")
    reference, _ = run(cfg, 6)
    by_step = {s: keys for s, (keys, _, _) in enumerate(reference, start=1)}
    rule = {"step": 2, "keys": [k for s in (2, 3, 4, 5) for k in by_step[s]]}
    _, state = run(config(data["coco"], "image_text_small.yaml", exclude=[rule]), 4)
    _, ended = run(cfg, 2, state=state)
    assert [(r["start"], r["end"]) for r in ended["exclude"]] == [(2, 4)]
    t = tracer(cfg, state=ended)
    for step, keys in by_step.items():
        if step in (2, 3, 4, 5):
            for k in keys:
                found = t.find(k, 6)
                listed = "excluded_steps" if step in (3, 4) else "steps"
                assert (
                    step in found[listed]
                    and step not in found["steps" if listed != "steps" else "excluded_steps"]
                )


def test_a_rule_starting_at_the_resume_batch_is_decided_again_by_the_config(data):
    """A saved rule that starts exactly at the resume batch has not taken effect: removed from the
    config it leaves no trace (and the next resume loads), moved to a later step it starts there."""
    from energon_platform.loader.train_loader import TrainLoader

    rule = {"step": 3, "shards": ["train/shard-000001.tar"]}
    _, state = run(config(data["coco"], "image_text_small.yaml", exclude=[rule]), 3)
    # 8 samples, micro-batches of 2
    assert state["exclude"][0]["start"] == 3 and state["next_microbatch"] == 3 * 4
    _, removed = run(config(data["coco"], "image_text_small.yaml"), 1, state=state)
    assert not removed["exclude"], "a rule not yet in effect and no longer configured is dropped"
    TrainLoader(config(data["coco"], "image_text_small.yaml"), num_workers=0).load_state_dict(
        removed
    )
    _, moved = run(
        config(data["coco"], "image_text_small.yaml", exclude=[{**rule, "step": 5}]), 1, state=state
    )
    assert [(r["start"], r["end"]) for r in moved["exclude"]] == [(5, None)]


def test_trace_cli_one_line_errors(data, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(data["coco"]), "val_split": None},
                "encoder": str(REPO / "configs/encoders/image_text_small.yaml"),
                "loader": {"global_batch_size": 8, "num_workers": 0},
            }
        )
    )

    base = ["trace", "--config", str(path)]
    p = run_cli(*base, "--key", "nope")
    assert (
        p.returncode == 2
        and "no such sample" in p.stderr
        and len(p.stderr.strip().splitlines()) == 1
    ), p.stderr
    for extra, says in (
        (["--steps", "a:b"], "expected A:B"),
        (["--step", "1", "--world-size", "3"], "cannot be split"),
        ([], "say what to trace"),
        (["--steps", "5:3"], "1 <= A <= B"),
        (["--steps", "0:3"], "1 <= A <= B"),
        (["--steps", "1:"], "both ends given"),
        (["--steps", "3"], "--steps 3:3"),
        (["--key", "x", "--steps", "2:4"], "takes a count M"),
    ):
        one_line_error_in_process(capsys, base + extra, says)


# --- a real training run's log -------------------------------------------------------------------


@pytest.mark.slow
def test_trace_equals_the_log_of_a_killed_two_rank_blend_run_with_an_exclusion(data, tmp_path):
    from energon_platform.training.resume_check import RunSpec, check_resume, read_log

    probe, _ = run(config(data["blend"], global_batch_size=6), 8)
    excluded = [k for keys, _, _ in probe[3:] for k in keys if k.startswith("coco_mini:")][:2]
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(data["blend"]), "val_split": None},
                "encoder": str(REPO / "configs/encoders/multimodal.yaml"),
                "loader": {
                    "global_batch_size": 6,
                    "micro_batch_size": 1,
                    "num_workers": 1,
                    "seed": 5,
                    "exclude": [{"step": 3, "keys": excluded}],
                },
                "model": {"dim": 32, "layers": 1, "heads": 2, "patch": 16},
                "train": {"steps": 8, "checkpoint_every": 3, "warmup": 2},
            }
        )
    )
    # 2 -> 1 ranks: losses reduce in another order
    result = check_resume(
        RunSpec(str(path), 8, nproc=2),
        kill_at=5,
        out=tmp_path / "check",
        resume_nproc=1,
        tolerance=1e-5,
        log=lambda *_: None,
    )
    assert result["passed"] and result["keys_identical"] and result["tensors_identical"], result
    for run_dir in ("straight", "killed"):
        rows = read_log(tmp_path / "check" / run_dir / "log.jsonl")
        out = run_cli(
            "trace",
            "--config",
            str(path),
            "--steps",
            "1:8",
            "--json",
            "--checkpoint",
            str(tmp_path / "check" / run_dir),
            check=True,
        ).stdout
        traced = [json.loads(line) for line in out.splitlines()]
        assert [t["keys"] for t in traced] == [rows[s]["keys"] for s in range(1, 9)], run_dir
        # each log row counts what the exclusion replaced in its global batch, as trace lists it
        assert [rows[s].get("excluded", {}) for s in range(1, 9)] == [
            dict(Counter(x["dataset"] for x in t["excluded"])) for t in traced
        ], run_dir
        assert not any("excluded" in rows[s] for s in (1, 2, 3)) and any(
            "excluded" in rows[s] for s in range(4, 9)
        )
        # `epoch`: the first dataset's epochs at the end of the step
        first = next(iter(rows[1]["datasets"]))
        assert [rows[s]["epoch"] for s in range(1, 9)] == [
            round(rows[s]["datasets"][first]["epochs"], 4) for s in range(1, 9)
        ], run_dir
        assert not set(excluded) & {k for s in range(4, 9) for k in rows[s]["keys"]}
        assert [rows[s]["keys"] for s in range(1, 4)] == [probe[s - 1][0] for s in range(1, 4)], (
            "the past"
        )
