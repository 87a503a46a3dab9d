"""Provenance of balanced runs (``loader.balance``) and exclusion counts: ``trace`` of a step
equals the keys the loaders make (as the trainer logs them: sorted) on 1 and 2 ranks and after an
elastic resume, with excluded samples replaced in packed rows; ``--key`` equals a brute-force scan
of the steps; each step's exclusion counts equal trace's, from the rule's step on; an exclusion is
no failure (no "replaced" warning, not in the record of bad data)."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from scripts.bench.data import coco_dataset, three_modality_blend
from tests.helpers import REPO, layouts
from tests.helpers.cli import run_cli


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("trace-balance")
    return {
        "blend": three_modality_blend(base),
        "coco": coco_dataset(base),
        "lengths": base / "lengths",
    }


def config(data, encoder="multimodal_packed.yaml", path="blend", **loader):
    from energon_platform.config import load_config

    return load_config(
        {
            "data": {"path": str(data[path]), "val_split": None},
            "encoder": str(REPO / "configs/encoders" / encoder),
            "loader": {
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "num_workers": 0,
                "seed": 5,
                "balance": "attention",
                "length_cache": str(data["lengths"]),
                **loader,
            },
        }
    )


def run(cfg, steps, ranks=1, state=None):
    """Per step: ``(keys as the trainer logs them, [rank][micro-batch] keys)``; and the state after."""
    loaders = layouts.loaders_at(cfg, ranks, state)
    out = []
    for _ in range(steps):
        parts = [[list(next(ld).keys) for _ in range(ld.accumulation)] for ld in loaders]
        logged = [k for rank in parts for m in rank for k in m]
        out.append((sorted(logged) if loaders[0].plan.batching.planned else logged, parts))
    return out, loaders[0].state_dict(), loaders[0]


def tracer(cfg, ranks=1, state=None):
    from energon_platform.loader.state import LoaderState
    from energon_platform.loader.trace import open_tracer

    tr = open_tracer(cfg, ranks)
    if state is not None:
        tr.plan.resume(LoaderState.from_dict(state))
    return tr


def assert_traced(t, steps, first=1):
    for step, (keys, parts) in enumerate(steps, start=first):
        trace = t.step(step)
        assert trace["keys"] == keys, step
        for s in trace["samples"]:
            assert s["key"] in parts[s["rank"]][s["micro_batch"]], (step, s)


@pytest.mark.parametrize("ranks", [1, 2])
def test_trace_of_a_balanced_run_equals_the_loaders_keys(data, ranks):
    cfg = config(data)
    steps, _, _ = run(cfg, 4, ranks)
    assert_traced(tracer(cfg, ranks), steps)


def test_trace_of_a_balanced_run_after_an_elastic_resume_with_an_exclusion(data):
    """Resumed on 2 ranks from a 1-rank state: steps before the state are replayed from the start,
    those after it planned from the saved state; excluded samples take stand-ins that fit their rows."""
    probe, _, _ = run(config(data), 6)
    rule = {"step": 2, "keys": [k for keys, _ in probe[3:] for k in keys][::5][:4]}
    cfg = config(data, exclude=[rule])
    before, state, _ = run(cfg, 3)
    after, state2, loader = run(cfg, 3, 2, state=state)
    assert not set(rule["keys"]) & {k for keys, _ in after for k in keys}
    t = tracer(cfg, 2, state=state2)
    # trained on 1 rank
    assert [t.step(s)["keys"] for s in (1, 2, 3)] == [keys for keys, _ in before]
    assert_traced(t, after, first=4)
    assert sum(len(t.step(s)["excluded"]) for s in range(4, 7)) >= 3, (
        "the rule must bite in this run"
    )
    seen: dict = {}  # a key's steps: its own uses and those as a stand-in in a packed row
    for step, (keys, _) in enumerate(before + after, start=1):
        for k in keys:
            seen.setdefault(k, []).append(step)
    found = {k: t.find(k, 6) for k in set(seen) | set(rule["keys"])}
    assert {k: f["steps"] for k, f in found.items() if f["steps"]} == seen
    assert any("stand_in_for" in u for f in found.values() for u in f["uses"])
    counts = [loader.exclusion_stats(b) for b in range(6)]
    assert counts[:2] == [{}, {}], "no counts before the rule's step"
    for b in range(2, 6):
        traced = Counter(x["dataset"] for x in t.step(b + 1)["excluded"])
        assert counts[b] == ({"excluded": dict(traced)} if traced else {}), b


@pytest.mark.parametrize(
    "encoder,balance", [("multimodal_packed.yaml", "attention"), ("multimodal.yaml", "tokens")]
)
def test_key_of_a_balanced_run_equals_a_brute_force_scan(data, encoder, balance):
    cfg = config(data, encoder, balance=balance)
    t = tracer(cfg, 2)
    steps = 34  # past the smallest dataset's first epoch: its keys are used twice
    seen: dict = {}
    for step in range(1, steps + 1):
        for s in t.step(step)["samples"]:
            seen.setdefault(s["key"], []).append((step, s["rank"], s["micro_batch"]))
    assert len(seen) > 40 and max(len(v) for v in seen.values()) >= 2, "keys used in several epochs"
    for key, used in seen.items():
        found = t.find(key, steps)
        assert [(u["step"], u["rank"], u["micro_batch"]) for u in found["uses"]] == used, key
    assert t.find(next(iter(seen)), 1)["steps"] == [
        s for s, _, _ in seen[next(iter(seen))] if s == 1
    ]


def test_exclusion_counts_per_step_equal_trace_and_start_at_the_rule(data):
    probe, _, _ = run(config(data, "image_text_small.yaml", "coco", balance="none"), 5)
    rule = {"step": 2, "keys": [k for keys, _ in probe[2:] for k in keys][::3]}
    cfg = config(data, "image_text_small.yaml", "coco", balance="none", exclude=[rule])
    _, _, loader = run(cfg, 5)
    t = tracer(cfg)
    stats = [loader.exclusion_stats(b) for b in range(5)]
    assert stats[:2] == [{}, {}] and all(stats[2:]), stats
    name = loader.plan.datasets.names[0]
    for b in range(2, 5):
        assert stats[b] == {"excluded": {name: len(t.step(b + 1)["excluded"])}}
    assert loader.maker.excluded == {name: sum(s["excluded"][name] for s in stats[2:])}


def test_an_exclusion_is_no_failure_and_logged_once_per_dataset_and_step(data, caplog):
    probe, _, _ = run(config(data, "multimodal.yaml", balance="none"), 4)
    rule = {
        "step": 1,
        "keys": [k for keys, _ in probe[1:] for k in keys if k.startswith("coco_mini:")][:4],
    }
    with caplog.at_level(logging.INFO, logger="energon_platform.loader.batches"):
        _, _, loader = run(config(data, "multimodal.yaml", balance="none", exclude=[rule]), 4)
    assert not [r for r in caplog.records if "replaced by" in r.getMessage()], (
        "an exclusion is no failure"
    )
    assert loader.maker.replaced == [] and sum(loader.maker.excluded.values()) >= 4
    said = [r for r in caplog.records if "loader.exclude" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said)
    # "global batch B: ... samples of DATASET"
    firsts = [r.getMessage().split(", first")[0] for r in said]
    assert len(firsts) == len(set(firsts)), "one line per dataset and global batch"


def test_trace_cli_of_a_balanced_run(data, tmp_path):
    import json
    import subprocess
    import sys

    import yaml

    steps, _, _ = run(config(data), 3, 2)
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(data["blend"]), "val_split": None},
                "encoder": str(REPO / "configs/encoders/multimodal_packed.yaml"),
                "loader": {
                    "global_batch_size": 8,
                    "micro_batch_size": 2,
                    "num_workers": 0,
                    "seed": 5,
                    "balance": "attention",
                    "length_cache": str(data["lengths"]),
                },
            }
        )
    )
    base = [
        sys.executable,
        "-m",
        "energon_platform",
        "trace",
        "--config",
        str(path),
        "--world-size",
        "2",
        "--json",
    ]
    out = subprocess.run(
        base + ["--steps", "1:3"], capture_output=True, text=True, check=True
    ).stdout
    assert [json.loads(line)["keys"] for line in out.splitlines()] == [keys for keys, _ in steps]


@pytest.mark.slow
def test_trace_equals_the_log_of_a_killed_balanced_run_resumed_on_another_world_size(
    balanced_check,
):
    """Our trainer, ``balance: attention``: 2 ranks, SIGKILL during step 5, resumed on 1 rank
    (`tests/loader/conftest.py`); ``trace --checkpoint`` of each run's output equals the keys its
    log.jsonl holds for every step."""
    import json

    from energon_platform.training.resume_check import read_log

    path, check, report = balanced_check
    assert report["passed"] and report["keys_identical"], report
    for run_dir in ("straight", "killed"):
        rows = read_log(check / run_dir / "log.jsonl")
        r = run_cli(
            "trace", "--config", path, "--steps", "1:6", "--json", "--checkpoint", check / run_dir
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert [json.loads(line)["keys"] for line in r.stdout.splitlines()] == [
            rows[s]["keys"] for s in range(1, 7)
        ]


def test_excluded_samples_left_as_padding_log_one_info_line_per_dataset_and_step(data, caplog):
    """Most of a dataset excluded in packed rows: some rows keep positions as padding (no stand-in
    fits); that is said once per dataset and global batch at info level, never a warning per sample."""
    cfg = config(data, exclude=[{"step": 1, "keys": ["coco_mini:*[0-8]"]}])
    with caplog.at_level(logging.INFO, logger="energon_platform.loader.batches"):
        run(cfg, 4)
    t = tracer(cfg)
    assert any(x["stand_in"] is None for s in range(2, 5) for x in t.step(s)["excluded"]), (
        "rows left as padding"
    )
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    said = [
        r.getMessage().split(", first")[0]
        for r in caplog.records
        if "loader.exclude" in r.getMessage()
    ]
    assert any("as padding" in m for m in said) and len(said) == len(set(said)), said
