"""Samples that fail at training time: replaced deterministically, micro-batches stay full."""

from __future__ import annotations

import pytest

from energon_platform.config import load_config
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.train_loader import TrainLoader
from energon_platform.training.train import batch_digest
from tests.helpers import REPO

IMAGE = str(REPO / "configs/encoders/image_text_small.yaml")
BROKEN = (3, 10, 11)


@pytest.fixture(scope="module")
def clean_dataset(make_dataset):
    return make_dataset("image_text")


def cfg(path, **loader):
    return load_config(
        {
            "data": {"path": str(path), "val_split": None},
            "encoder": IMAGE,
            "loader": {"global_batch_size": 8, "num_workers": 0, **loader},
        }
    )


def steps(config, n, ranks=1, workers=0, state=None):
    loaders = [
        TrainLoader(config, rank=r, world_size=ranks, num_workers=workers) for r in range(ranks)
    ]
    out = []
    for ld in loaders:
        if state:
            ld.load_state_dict(state)
    for _ in range(n):
        parts = [next(ld) for ld in loaders for _ in range(ld.accumulation)]
        out.append(
            ([k for p in parts for k in p.keys], [d for p in parts for d in batch_digest(p)])
        )
    replaced = [r for ld in loaders for r in ld.maker.replaced]
    for ld in loaders:
        ld.close()
    return out, replaced


def test_stand_ins_are_a_pure_function_of_the_failed_sample():
    order = DatasetOrder(24, key=9)
    first = [order.replacement(0, 3, a) for a in range(1, 6)]
    assert first == [DatasetOrder(24, key=9).replacement(0, 3, a) for a in range(1, 6)]
    assert 3 not in first and len(set(first)) == 5
    assert first != [order.replacement(1, 3, a) for a in range(1, 6)], (
        "another epoch, other stand-ins"
    )


def test_failed_samples_are_replaced_so_every_micro_batch_is_full_on_every_layout(make_dataset):
    data = make_dataset("image_text", n=24, broken=BROKEN)
    config = cfg(data, micro_batch_size=2)
    reference, replaced = steps(config, 6)  # two epochs: every broken sample fails twice
    assert all(len(keys) == 8 for keys, _ in reference), "a micro-batch lost a row"
    assert {r["failed_index"] for r in replaced} == set(BROKEN) and len(replaced) == 6
    broken_keys = {f"{i:012d}" for i in BROKEN}
    assert not broken_keys & {k for keys, _ in reference for k in keys}
    other, _ = steps(config, 6, ranks=2, workers=2)
    assert other == reference, "stand-ins must be the same on every layout"
    loader = TrainLoader(config)
    for _ in range(2 * loader.accumulation):
        next(loader)
    state = loader.state_dict()
    loader.close()
    resumed, _ = steps(config, 4, ranks=1, workers=1, state=state)
    assert resumed == reference[2:], "and after a resume"


def test_the_skip_policy_still_counts_every_failure(make_dataset):
    data = make_dataset("image_text", n=24, broken=BROKEN)
    loader = TrainLoader(cfg(data))
    for _ in range(3):
        next(loader)
    # every failure is counted, a stand-in that fails too included
    assert loader.encoder.skip_policy.failures >= len(loader.maker.replaced) >= 1
    loader.close()


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda s: s.update(next_microbatch="5"), "next_microbatch must be an integer"),
        (lambda s: s.update(next_microbatch=5.0), "next_microbatch must be an integer"),
        (lambda s: s.update(next_microbatch=-1), "next_microbatch must be an integer"),
        (lambda s: s.update(next_microbatch=10**30), "next_microbatch must be an integer"),
        (lambda s: s.update(accumulation=True), "accumulation must be an integer"),
        (lambda s: s.update(version=3), "version 3 is not supported"),
        (lambda s: s.update(extra={"__reduce__": "os.system"}), r"unknown field\(s\) \['extra'\]"),
        (lambda s: s.pop("blend"), r"missing field\(s\) \['blend'\]"),
        (lambda s: s.update(fingerprint=[1]), "fingerprint must be a dict"),
        (lambda s: s.update(blend=[{"start": 0, "weights": ["-1"]}]), "non-negative fractions"),
        (lambda s: s.update(blend=[{"start": 5, "weights": ["1"]}]), "start at 0"),
        (lambda s: s.update(datasets=[]), "non-empty list"),
    ],
)
def test_tampered_state_is_a_named_error(clean_dataset, edit, match):
    from energon_platform.loader.state import StateMismatchError

    config = cfg(clean_dataset)
    loader = TrainLoader(config)
    next(loader)
    state = loader.state_dict()
    TrainLoader(config).load_state_dict(state)  # the untouched state loads
    edit(state)
    with pytest.raises(StateMismatchError, match=match):
        TrainLoader(config).load_state_dict(state)


def test_a_shard_truncated_after_conversion_is_replaced_the_same_on_every_layout(
    tmp_path, make_dataset
):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(make_dataset("image_text", n=24), data)
    shard = sorted((data / "train").glob("*.tar"))[1]
    # the second half of its samples is gone
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    config = cfg(data)
    one, replaced = steps(config, 3)
    assert all(len(keys) == 8 for keys, _ in one) and replaced
    two, _ = steps(config, 3, ranks=2, workers=1)
    assert one == two


def test_verify_names_changed_and_missing_shards(coco, tmp_path, capsys):
    import json
    import shutil

    from energon_platform.cli import main

    data = tmp_path / "data"
    shutil.copytree(coco, data)
    assert main(["verify", str(data), "--no-progress"]) == 0
    shards = sorted((data / "train").glob("*.tar"))
    raw = bytearray(shards[0].read_bytes())
    raw[700] ^= 0xFF  # same size: only a full read sees it (info does not)
    shards[0].write_bytes(bytes(raw))
    shards[1].unlink()
    capsys.readouterr()
    assert main(["verify", str(data), "--no-progress", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["shards"][f"train/{shards[0].name}"] == "changed"
    assert result["shards"][f"train/{shards[1].name}"] == "missing"
    assert main(["verify", str(tmp_path / "nowhere"), "--no-progress"]) == 2


def test_a_killed_loader_worker_is_named_and_the_run_resumes_exactly(clean_dataset):
    import os
    import signal

    import psutil

    from energon_platform.loader.train_loader import LoaderWorkerError

    config = cfg(clean_dataset)
    reference = [list(next(ld).keys) for ld in [TrainLoader(config)] for _ in range(5)]
    loader = TrainLoader(config, num_workers=2)
    assert list(next(loader).keys) == reference[0]
    state = loader.state_dict()
    workers = loader.executor.pids()  # the local worker processes
    assert len(workers) == 2 and all(psutil.pid_exists(p) for p in workers)
    os.kill(workers[1], signal.SIGKILL)  # what the kernel's OOM killer does
    with pytest.raises(
        LoaderWorkerError,
        match=r"loader worker \d \(pid \S+\) of rank 0 died while making micro-batch \d+",
    ):
        # the killed worker may have finished its prefetched micro-batches (2 per worker) before
        # the kill: the death shows at the first one it still owes, within 2 x 2 + 2 more
        for _ in range(10):
            next(loader)
    resumed = TrainLoader(config, num_workers=2)
    resumed.load_state_dict(state)
    assert [list(next(resumed).keys) for _ in range(4)] == reference[1:]
    resumed.close()
