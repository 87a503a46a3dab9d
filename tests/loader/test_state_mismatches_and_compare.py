"""Loader state mismatches, checkpoint markers and the resume comparison: each test kills a small,
plausible bug (the mutation each one is for is named in its docstring)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from energon_platform.config import load_config
from energon_platform.loader.batches import MicroBatchMaker
from energon_platform.loader.state import StateMismatchError
from energon_platform.loader.train_loader import TrainLoader
from energon_platform.training import checkpoint
from energon_platform.training.resume_check import compare
from tests.helpers import REPO

IMAGE = str(REPO / "configs/encoders/image_text_small.yaml")
IMAGE_PACKED = str(REPO / "configs/encoders/image_text_small_packed.yaml")


def cfg(path, encoder=IMAGE, **loader):
    return load_config(
        {
            "data": {"path": str(path)},
            "encoder": encoder,
            "loader": {"global_batch_size": 8, "num_workers": 0, **loader},
        }
    )


def saved_state(config) -> dict:
    loader = TrainLoader(config)
    next(loader)
    return loader.state_dict()


# ---------------------------------------------------------------- (a) the fingerprint, one field at a time


@pytest.mark.parametrize(
    "saved,restored", [(None, 64), (32, 64)], ids=["permutation-to-window", "window-32-to-64"]
)
def test_only_shuffle_buffer_changed_is_refused(image_text_shards, saved, restored):
    """Mutation: the shuffle setting left out of the loader's fingerprint."""
    state = saved_state(cfg(image_text_shards, shuffle_buffer=saved))
    with pytest.raises(StateMismatchError, match="shuffle"):
        TrainLoader(cfg(image_text_shards, shuffle_buffer=restored)).load_state_dict(state)


def test_only_pack_group_changed_is_refused(image_text_shards):
    """Mutation: ``pack_group`` left out of the fingerprint (the encoder config is the same)."""
    # the encoder's buffer size
    state = saved_state(cfg(image_text_shards, IMAGE_PACKED, global_batch_size=1))
    with pytest.raises(StateMismatchError, match="pack_group"):
        TrainLoader(
            cfg(image_text_shards, IMAGE_PACKED, global_batch_size=1, pack_group=4)
        ).load_state_dict(state)


def test_only_index_uuid_changed_is_refused(image_text_shards, tmp_path):
    """Mutation: Energon's ``index.uuid`` left out of the dataset identity. Same folder name, same
    shards and counts: only the uuid tells the two datasets apart."""
    other = tmp_path / "copy" / image_text_shards.name
    shutil.copytree(image_text_shards, other)
    uuid = other / ".nv-meta" / "index.uuid"
    uuid.write_text(uuid.read_text().strip()[::-1] + "\n")
    state = saved_state(cfg(image_text_shards))
    TrainLoader(cfg(image_text_shards)).load_state_dict(state)  # the same dataset restores
    with pytest.raises(StateMismatchError, match="index_uuid"):
        TrainLoader(cfg(other)).load_state_dict(state)


# ---------------------------------------------------------------- (b) our loader's skip path


def test_train_loader_counts_bad_samples_by_key(make_dataset):
    """Mutation: ``MicroBatchMaker._skip`` a no-op (bad samples vanish uncounted). Drives our
    loader (``TrainLoader`` → ``MicroBatchMaker``), the one train, check-resume and Megatron use."""
    broken = {3, 10, 17}
    loader = TrainLoader(cfg(make_dataset("image_text", n=24, broken=broken)))
    # one epoch: 24 samples in 3 batches of 8
    keys = [k for _ in range(3) for k in next(loader).keys]
    policy = loader.encoder.skip_policy
    # every broken sample is counted and logged by key, and replaced by a stand-in (batches stay full)
    assert len(keys) == 24 and not {f"{i:012d}" for i in broken} & set(keys)
    assert policy.failures >= len(broken) and {f"{i:012d}" for i in broken} <= set(policy.recent)
    assert {r["failed_index"] for r in loader.maker.replaced} == broken


# ---------------------------------------------------------------- (c) checkpoint write order


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not even ``except Exception``)."""


def _kill_at(monkeypatch, k: int) -> list[str]:
    """Make the ``k``-th file-system step of ``checkpoint.save`` die (a write dies half done).
    Returns the list the steps are recorded in."""
    steps: list[str] = []

    def step(name, real):
        def run(*args, **kwargs):
            steps.append(f"{name}({', '.join(Path(str(a)).name for a in args[:2])})")
            if len(steps) - 1 == k:
                if name == "write":
                    Path(args[0]).write_bytes(args[1][: len(args[1]) // 2])
                raise Killed
            return real(*args, **kwargs)

        return run

    monkeypatch.setattr(checkpoint, "_fsync_write", step("write", checkpoint._fsync_write))
    monkeypatch.setattr(checkpoint, "_fsync_dir", step("fsync_dir", checkpoint._fsync_dir))
    monkeypatch.setattr(checkpoint.os, "replace", step("replace", os.replace))
    monkeypatch.setattr(checkpoint.shutil, "rmtree", step("rmtree", shutil.rmtree))
    return steps


def test_latest_never_names_an_incomplete_checkpoint(tmp_path, monkeypatch):
    """Mutation: ``latest`` replaced before the folder rename (or before its files are synced).
    Kills ``save`` at every one of its file-system steps in turn; after each, ``latest`` must name a
    checkpoint that verifies, and loading must give step 5 or step 10, whole."""

    def save(root, step):
        checkpoint.save(root, step, 0, 1, model_state={"w": step}, loader_state={"pos": step})

    save(tmp_path / "base", 5)
    with monkeypatch.context() as m:
        all_steps = _kill_at(m, -1)
        save(tmp_path / "count", 10)
    assert any(s.startswith("replace(latest.tmp") for s in all_steps), all_steps
    outcomes = []
    for k in range(len(all_steps)):
        root = tmp_path / f"kill{k}"
        shutil.copytree(tmp_path / "base", root)
        with monkeypatch.context() as m:
            done = _kill_at(m, k)
            with pytest.raises(Killed):
                save(root, 10)
        named = (root / "latest").read_text().strip()
        checkpoint.verify(root / named)  # raises if latest names an incomplete folder
        loaded = checkpoint.load(checkpoint.latest(root), 0)
        assert loaded["loader_state"] == {"pos": loaded["step"]} and loaded["model_state"] == {
            "w": loaded["step"]
        }
        outcomes.append((done[-1], loaded["step"]))
    assert outcomes[0][1] == 5 and outcomes[-1][1] in (5, 10)
    save(tmp_path / "kill0", 10)  # a later save over the debris of a killed one completes
    assert checkpoint.load(checkpoint.latest(tmp_path / "kill0"), 0)["step"] == 10


# ---------------------------------------------------------------- (d) the resume checker itself


def _rows(steps, **change):
    rows = {
        s: {"step": s, "keys": [f"k{s}a", f"k{s}b"], "batch_sha256": f"sha{s}", "loss": 1.0 / s}
        for s in steps
    }
    for step, (field, value) in change.items():
        rows[int(step)][field] = value
    return rows


@pytest.mark.parametrize(
    "resumed,tolerance,field,value",
    [
        (_rows(range(6, 11), **{"8": ("keys", ["k8b", "k8a"])}), 0.0, "keys_identical", False),
        (_rows(range(6, 11), **{"9": ("batch_sha256", "other")}), 0.0, "tensors_identical", False),
        (
            _rows(range(6, 11), **{"7": ("loss", 1.0 / 7 + 1e-3)}),
            1e-5,
            "max_abs_loss_diff",
            pytest.approx(1e-3),
        ),
        ({s: r for s, r in _rows(range(6, 11)).items() if s != 9}, 0.0, "missing_steps", [9]),
        # restarted from 0
        (
            _rows(range(1, 11)),
            0.0,
            "resumed_steps_before_resume_point",
            [1, 2, 3, 4, 5],
        ),
    ],
    ids=["keys", "tensors", "loss", "missing-step", "restarted-from-zero"],
)
def test_compare_fails_on_each_kind_of_difference(resumed, tolerance, field, value):
    """Mutation: ``compare`` comparing a row with itself, or ignoring one kind of difference."""
    straight = _rows(range(1, 11))
    assert compare(straight, _rows(range(6, 11)), 6, 10, tolerance)["passed"]
    result = compare(straight, resumed, 6, 10, tolerance)
    assert not result["passed"] and result[field] == value


def test_compare_loss_within_tolerance_passes():
    straight = _rows(range(1, 11))
    resumed = _rows(range(6, 11), **{"7": ("loss", 1.0 / 7 + 1e-6)})
    assert (
        not compare(straight, resumed, 6, 10, 0.0)["passed"]
        and compare(straight, resumed, 6, 10, 1e-5)["passed"]
    )


# ---------------------------------------------------------------- (e) O(1) restore


def test_restore_builds_only_the_requested_micro_batches(coco, monkeypatch):
    """Mutation: a restore that replays (builds the micro-batches before the saved position and
    throws them away). Counts the micro-batches built, with 0 workers (built in this process)."""
    # 2 micro-batches per step: the position is micro-batch-exact
    config = cfg(coco, micro_batch_size=4)
    saver = TrainLoader(config)
    saver.next_microbatch = 1000  # the position a saving loader holds after 500 steps
    state = saver.state_dict()
    expected = [saver.maker(1000).keys, saver.maker(1001).keys]
    built = []
    real = MicroBatchMaker.__call__
    monkeypatch.setattr(
        MicroBatchMaker, "__call__", lambda self, c: built.append(c) or real(self, c)
    )
    restored = TrainLoader(config)
    restored.load_state_dict(state)
    got = [next(restored).keys, next(restored).keys]
    restored.close()
    assert built == [1000, 1001], (
        f"built {len(built)} micro-batches for 2 requested (first {built[:3]})"
    )
    assert got == expected and restored.state_dict()["next_microbatch"] == 1002
