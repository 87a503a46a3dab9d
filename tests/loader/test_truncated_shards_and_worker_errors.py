"""Runtime faults: a truncated shard stops training with one line that names the shard
and `energon-platform verify` (never memory), with and without loader workers."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from tests.helpers import REPO
from tests.helpers.cli import run_cli

IMAGE = str(REPO / "configs/encoders/image_text_small.yaml")


@pytest.fixture(scope="module")
def truncated(tmp_path_factory):
    """The COCO sample corpus in one shard, cut right after its first sample: the preflight
    check (sample 0) passes, then a micro-batch and all its stand-ins fail mid-run."""
    from converters.convert import ConvertOptions, run_conversion

    out = tmp_path_factory.mktemp("h2r") / "coco_one_shard"
    run_conversion(
        "coco",
        {
            "annotations": str(REPO / "data/coco_mini/captions.json"),
            "images": str(REPO / "data/coco_mini/images"),
        },
        ConvertOptions(out=str(out), samples_per_shard=1000, val_fraction=0.0, progress=False),
    )
    (shard,) = (out / "train").glob("*.tar")
    offsets = np.fromfile(str(shard) + ".idx", dtype="<u8")
    shard.write_bytes(shard.read_bytes()[: int(offsets[1])])
    config = out.parent / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(out), "val_split": None},
                "encoder": IMAGE,
                "loader": {"global_batch_size": 4, "num_workers": 0, "seed": 3},
                "model": {"dim": 16, "layers": 1, "heads": 2, "patch": 16},
                "train": {"steps": 2, "checkpoint_every": 2, "warmup": 1},
            }
        )
    )
    return out, shard, config


@pytest.mark.parametrize("workers", [0, 2])
def test_a_truncated_shard_stops_training_with_one_line_naming_it(truncated, tmp_path, workers):
    data, shard, config = truncated
    r = run_cli(
        "train",
        "--config",
        config,
        "--out",
        tmp_path / "out",
        "--quiet",
        "--num-workers",
        workers,
        timeout=600,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("energon-platform train: error: micro-batch "), last
    assert f"shard train/{shard.name} of {data} is corrupt" in last, last
    assert f"energon-platform verify {data}" in last, last
    assert "memory" not in r.stderr.lower() and "died" not in last, last


@pytest.mark.parametrize("late", [0, 3], ids=["at-once", "worker-1-retired-first"])
def test_an_exception_in_a_loader_worker_is_not_reported_as_its_death(
    make_dataset, monkeypatch, late
):
    """Only a worker that died is a LoaderWorkerError ("Out of memory?"); PyTorch's "Caught
    RuntimeError in DataLoader worker process 0" is the worker's own error, passed on.
    ``late``: seconds worker 0 takes before its micro-batch fails. With 3, worker 1 fails first,
    its iterator ends and PyTorch retires it (it exits with 0) before worker 0's failure arrives:
    that exit is not a death either."""
    import time

    from energon_platform.config import load_config
    from energon_platform.loader.batches import MicroBatchMaker
    from energon_platform.loader.train_loader import LoaderWorkerError, TrainLoader

    def broken(self, c):
        if c == 0:  # worker 0's micro-batch
            time.sleep(late)
        raise RuntimeError(f"the encoder's own failure in micro-batch {c}")

    monkeypatch.setattr(MicroBatchMaker, "_make", broken)  # the workers are forked: they see it
    config = load_config(
        {
            "data": {"path": str(make_dataset("image_text")), "val_split": None},
            "encoder": IMAGE,
            "loader": {"global_batch_size": 4},
        }
    )
    loader = TrainLoader(config, num_workers=2)
    try:
        with pytest.raises(
            RuntimeError, match="the encoder's own failure in micro-batch 0"
        ) as caught:
            next(loader)
    finally:
        loader.close()
    assert not isinstance(caught.value, LoaderWorkerError), str(caught.value)
