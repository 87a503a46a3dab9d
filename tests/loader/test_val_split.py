"""The validation loader over ``data.val_split``: a split the dataset lacks is skipped with one
warning line on stderr naming the split, the dataset and the splits it has; ``null`` skips it
silently; a split the dataset has gives a loader and no warning."""

from __future__ import annotations

from energon_platform.config import load_config
from energon_platform.loader.train_loader import build_val_loader
from tests.helpers.run_configs import run_config


def val_loader(data: dict, rank: int = 0):
    """``build_val_loader`` for a run config whose ``data`` section is ``data``."""
    return build_val_loader(load_config(run_config(data)), batch_size=2, rank=rank)


def test_a_val_split_the_dataset_lacks_warns_naming_split_path_and_splits(coco, capsys):
    assert val_loader({"path": str(coco), "val_split": "validation"}) is None
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("warning: data.val_split 'validation' is not a split of ")
    assert str(coco) in lines[0] and "(it has: train, val)" in lines[0], lines[0]


def test_only_rank_zero_warns_of_a_missing_val_split(coco, capsys):
    assert val_loader({"path": str(coco), "val_split": "validation"}, rank=1) is None
    assert capsys.readouterr().err == ""


def test_a_null_val_split_or_an_existing_one_warns_nothing(coco, capsys):
    assert val_loader({"path": str(coco), "val_split": None}) is None
    assert val_loader({"path": str(coco), "val_split": "val"}) is not None
    assert "warning" not in capsys.readouterr().err


def test_a_pass_over_the_val_loader_runs_no_garbage_collection(coco, monkeypatch):
    """The val loader reads in the trainer's process: a pass must not scan the trainer's whole heap
    (Energon's ``GcDataset`` collects at the start of every pass, 0.2 s per evaluation)."""
    import gc

    loader = val_loader({"path": str(coco), "val_split": "val"})
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    for _ in range(2):
        assert sum(1 for _ in loader) > 0
    assert calls == []
