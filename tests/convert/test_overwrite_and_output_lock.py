"""What a conversion may replace, one test per defect: ``--overwrite`` deletes only what a
conversion wrote and never an input (2), the output lock refuses a second conversion while one
runs (10), and a dataset a live loader reads is never overwritten.
"""

from __future__ import annotations

import os
import signal

import pytest

from converters.convert import ConvertError
from tests.convert.test_convert import convert, stamps, tree_digest
from tests.helpers.cli import one_line_error, run_cli, start_python
from tests.helpers.corpora import folder_corpus, image_bytes

# ---------------------------------------------------------------- 2: --overwrite deletes only ours


def test_overwrite_never_deletes_what_a_conversion_did_not_write(tmp_path):
    reader = {"root": str(folder_corpus(tmp_path / "raw"))}
    user = tmp_path / "user"  # the user's own train/, val/ and report.json, never a conversion
    for name in ("train/notes.txt", "val/notes.txt", "report.json"):
        (user / name).parent.mkdir(parents=True, exist_ok=True)
        (user / name).write_text("mine")
    with pytest.raises(ConvertError, match="holds no energon-platform conversion"):
        convert("folder", user, reader=reader, overwrite=True)
    assert sorted(str(p.relative_to(user)) for p in user.rglob("*")) == [
        "report.json",
        "train",
        "train/notes.txt",
        "val",
        "val/notes.txt",
    ]

    out = tmp_path / "out"
    convert("folder", out, reader=reader, samples_per_shard=2)
    shards = sorted(out.glob("train/*.tar"))
    for extra in (out / "precious.txt", out / "train" / "my-notes.txt"):
        extra.write_text("keep me")
        with pytest.raises(ConvertError, match="nothing was removed"):
            convert("folder", out, reader=reader, samples_per_shard=3, overwrite=True)
        assert extra.read_text() == "keep me" and sorted(out.glob("train/*.tar")) == shards
        assert (out / "report.json").is_file() and (out / ".nv-meta" / "index.sqlite").is_file()
        extra.unlink()
    ok = convert("folder", out, reader=reader, samples_per_shard=3, overwrite=True)
    assert not ok.already_done and len(list(out.glob("train/*.tar"))) == 2


def test_out_equal_to_the_input_root_is_refused_and_the_input_kept(tmp_path):
    root = folder_corpus(tmp_path / "raw")
    (root / "train").mkdir()
    (root / "train" / "x.png").write_bytes(image_bytes(9))
    (root / "train" / "x.txt").write_text("an input image in a folder named train")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for overwrite in (False, True):
        r = run_cli(
            "convert",
            "folder",
            "--root",
            root,
            "--out",
            root,
            "--no-progress",
            *(["--overwrite"] if overwrite else []),
        )
        assert one_line_error(r) and "input" in r.stderr
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    from converters.output import check_target

    # never an input inside what --overwrite may remove
    for inside in (
        root,
        root / "train",
        root / "x.png",
    ):
        with pytest.raises(ConvertError, match="is or holds the input"):
            check_target(root, [inside])


# ---------------------------------------------------------------- 10: the output lock


_HOLD_LOCK = """
import sys, time
from pathlib import Path
from converters.output import OutputLock
with OutputLock(Path(sys.argv[1])) as lock:
    lock.announce()
    print("locked", flush=True)
    time.sleep(600)
"""


def test_second_conversion_is_refused_while_one_runs_and_a_killed_holder_frees_it(tmp_path):
    reader = {"root": str(folder_corpus(tmp_path / "raw"))}
    out = tmp_path / "out"
    convert("folder", out, reader=reader)
    before = tree_digest(out)
    with start_python(_HOLD_LOCK, out) as holder:
        try:
            assert holder.stdout.readline().strip() == "locked"
            for extra in ([], ["--overwrite"], ["--samples-per-shard", "2", "--overwrite"]):
                r = run_cli(
                    "convert",
                    "folder",
                    "--root",
                    reader["root"],
                    "--out",
                    out,
                    "--no-progress",
                    *extra,
                )
                assert (
                    one_line_error(r)
                    and f"being written by another conversion (pid {holder.pid}" in r.stderr
                )
            assert tree_digest(out) == before  # --overwrite did not delete the running conversion
        finally:
            os.kill(holder.pid, signal.SIGKILL)
    ok = convert("folder", out, reader=reader, samples_per_shard=2, overwrite=True)
    assert not ok.already_done and len(list(out.glob("train/*.tar"))) == 3


def test_overwrite_of_a_dataset_a_live_loader_reads_is_refused(tmp_path):
    """``convert --overwrite`` replaced a dataset a running job read (the run could not resume):
    every loader holds a shared lock on the dataset while it lives."""
    import gc

    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader
    from storage.outputs import read_by_a_run
    from tests.helpers import REPO

    reader = {"root": str(folder_corpus(tmp_path / "raw", n=8))}
    out = tmp_path / "out"
    convert("folder", out, reader=reader)
    config = {
        "data": {"path": str(out), "val_split": None},
        "encoder": str(REPO / "configs/encoders/image_text_small.yaml"),
        "loader": {"global_batch_size": 2, "num_workers": 0},
    }
    loader = TrainLoader(load_config(config))
    assert read_by_a_run(out)
    before = stamps(out)
    with pytest.raises(ConvertError, match="is read by a running training job"):
        convert("folder", out, reader=reader, overwrite=True)
    assert stamps(out) == before
    assert convert("folder", out, reader=reader).already_done  # reading it: still nothing to do
    del loader
    gc.collect()
    assert not read_by_a_run(out)
    assert not convert("folder", out, reader=reader, overwrite=True).already_done
