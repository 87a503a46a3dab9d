"""A conversion run again, one test per defect: a missing or truncated shard is reported and
only it rewritten (4), a run killed mid-way finishes only the missing shards and the same index
bytes, changed inputs are never "nothing to do", and the dataset's identity follows its content.
"""

from __future__ import annotations

import json
import os

import pytest

from converters.convert import ConvertError
from tests.convert.test_convert import convert, stamps, tree_digest
from tests.helpers.cli import run_cli
from tests.helpers.corpora import caption, folder_corpus, image_bytes

# ---------------------------------------------------------------- 4: missing or changed shards


@pytest.mark.slow
def test_deleted_or_truncated_shard_is_reported_and_only_it_rewritten(tmp_path):
    reader = {"root": str(folder_corpus(tmp_path / "raw", n=10))}
    ref, out = tmp_path / "ref", tmp_path / "out"
    convert("folder", ref, reader=reader, samples_per_shard=2)
    convert("folder", out, reader=reader, samples_per_shard=2)
    (out / "train" / "shard-000001.tar").unlink()
    with open(out / "train" / "shard-000003.tar", "r+b") as f:
        f.truncate(1000)
    untouched = {
        k: v for k, v in stamps(out).items() if not k.endswith(("000001.tar", "000003.tar"))
    }

    r = run_cli("info", out)
    assert r.returncode == 1 and "UNHEALTHY" in r.stdout
    assert (
        "train/shard-000001.tar: missing" in r.stdout
        and "train/shard-000003.tar: 1000 bytes" in r.stdout
    )
    assert run_cli("info", ref).returncode == 0

    r = run_cli(
        "convert",
        "folder",
        "--root",
        reader["root"],
        "--out",
        out,
        "--samples-per-shard",
        2,
        "--no-progress",
    )
    assert r.returncode == 0 and "nothing to do" not in r.stdout
    assert "rewrote 2 shard(s)" in r.stdout and "train/shard-000001.tar" in r.stdout
    assert tree_digest(out) == tree_digest(ref)
    assert {k: v for k, v in stamps(out).items() if k in untouched} == untouched
    assert run_cli("info", out).returncode == 0
    again = convert("folder", out, reader=reader, samples_per_shard=2)
    assert again.already_done and not again.repaired


# ---------------------------------------------------------------- 10: index bytes


def test_index_sqlite_bytes_after_an_interrupted_finish_equal_an_uninterrupted_run(tmp_path):
    reader = {"root": str(folder_corpus(tmp_path / "raw", n=9))}
    ref, out = tmp_path / "ref", tmp_path / "out"
    convert("folder", ref, reader=reader, samples_per_shard=2, val_fraction=0.3)
    convert("folder", out, reader=reader, samples_per_shard=2, val_fraction=0.3)
    assert (out / ".nv-meta" / "index.sqlite").read_bytes() == (
        ref / ".nv-meta" / "index.sqlite"
    ).read_bytes()
    # SIGINT during Energon's indexing: the index exists (partly written), the run is not finished
    state = json.loads((out / ".convert" / "state.json").read_text())
    (out / ".convert" / "state.json").write_text(json.dumps({**state, "finished": False}))
    (out / "report.json").unlink()
    again = convert("folder", out, reader=reader, samples_per_shard=2, val_fraction=0.3)
    assert not again.already_done
    assert (out / ".nv-meta" / "index.sqlite").read_bytes() == (
        ref / ".nv-meta" / "index.sqlite"
    ).read_bytes()
    assert tree_digest(out) == tree_digest(ref)


# ---------------------------------------------------------------- tests that bite: the resume contract


def test_edited_caption_or_changed_media_is_never_nothing_to_do(tmp_path):
    root = folder_corpus(tmp_path / "raw")
    reader = {"root": str(root)}
    out = tmp_path / "out"
    convert("folder", out, reader=reader)
    (root / "002.txt").write_text("an edited caption")
    with pytest.raises(ConvertError, match="another input content"):
        convert("folder", out, reader=reader)
    (root / "002.txt").write_text(caption(2))
    assert convert("folder", out, reader=reader).already_done
    (root / "003.png").write_bytes(image_bytes(3, size=(41, 32)))  # another size
    with pytest.raises(ConvertError, match="another input content"):
        convert("folder", out, reader=reader)
    assert not convert("folder", out, reader=reader, overwrite=True).already_done
    assert convert("folder", out, reader=reader).already_done
    os.utime(root / "004.png", ns=(1, 1))  # same size, another modification time
    with pytest.raises(ConvertError, match="another input content"):
        convert("folder", out, reader=reader)


def test_rerun_after_a_kill_converts_only_the_missing_shards(tmp_path):
    reader = {"root": str(folder_corpus(tmp_path / "raw", n=12))}
    ref, out = tmp_path / "ref", tmp_path / "out"
    convert("folder", ref, reader=reader, samples_per_shard=2)
    convert("folder", out, reader=reader, samples_per_shard=2)
    # what a SIGKILL in the middle leaves: some units done, others without stats or tar, no report
    state = json.loads((out / ".convert" / "state.json").read_text())
    (out / ".convert" / "state.json").write_text(
        json.dumps({k: v for k, v in state.items() if k != "finished"})
    )
    for name in ("report.json", "skipped.jsonl"):
        (out / name).unlink()
    for i in (2, 4):
        (out / "train" / f"shard-{i:06d}.tar").unlink()
        (out / ".convert" / "units" / f"train-shard-{i:06d}.json").unlink()
    (out / "train" / "shard-000005.tar.tmp").write_bytes(b"half a shard")
    finished = stamps(out)
    again = convert("folder", out, reader=reader, samples_per_shard=2)
    assert not again.already_done
    after = stamps(out)
    assert {k: after[k] for k in finished} == finished  # finished shards untouched
    assert sorted(set(after) - set(finished)) == [
        "train/shard-000002.tar",
        "train/shard-000004.tar",
    ]
    assert tree_digest(out) == tree_digest(ref)


def test_dataset_identity_changes_when_only_content_changes(tmp_path):
    root = folder_corpus(tmp_path / "raw")
    reader = {"root": str(root)}
    uuid = lambda out: (out / ".nv-meta" / "index.uuid").read_text()  # noqa: E731
    convert("folder", tmp_path / "a", reader=reader)
    convert("folder", tmp_path / "a2", reader=reader)
    assert uuid(tmp_path / "a") == uuid(tmp_path / "a2")  # same content, same identity
    (root / "001.txt").write_text("another caption, same options")
    convert("folder", tmp_path / "b", reader=reader)
    (root / "001.txt").write_text(caption(1))
    (root / "002.png").write_bytes(image_bytes(5))  # other pixels, same options
    convert("folder", tmp_path / "c", reader=reader)
    assert len({uuid(tmp_path / n) for n in ("a", "b", "c")}) == 3


def test_an_input_moved_with_its_records_unchanged_is_the_same_conversion(tmp_path):
    """M9: a clone moved to another folder (its inputs and output with it) converted again had
    "a conversion of a different source"; the same records of the same kind are nothing to do."""
    root = folder_corpus(tmp_path / "raw")
    out = tmp_path / "out"
    convert("folder", out, reader={"root": str(root)})
    moved = tmp_path / "elsewhere"
    root.rename(moved)
    assert convert("folder", out, reader={"root": str(moved)}).already_done
    (moved / "002.txt").write_text("an edited caption")
    with pytest.raises(ConvertError, match=r"and input content \(records added, removed"):
        convert("folder", out, reader={"root": str(moved)})
