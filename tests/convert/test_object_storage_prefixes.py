"""Conversions into object storage: the prefix a conversion wrote is the authority (another
conversion onto it is refused, ``--overwrite`` replaces every object it wrote, a finished prefix
needs no staging folder), an unusable profile or bucket is one line, and an upload compares bytes,
not sizes.

Object storage is a real SeaweedFS (``tests/helpers/s3_server.py``). The staging folder is set per run
(``ENERGON_PLATFORM_STAGING``): a fresh one is what another machine, or a cleared temp folder, has.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from converters import remote
from converters.remote import upload_dataset
from energon_platform.cli import main as cli_main
from tests.helpers import REPO
from tests.helpers.cli import one_line_error, run_cli
from tests.helpers.corpora import numbered_docs as docs
from tests.storage.test_s3 import _coco


def objects(s3, prefix: str) -> dict[str, str]:
    """Every object under ``prefix/``: relative key → ETag (changes when the object is rewritten)."""
    listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"][len(prefix) + 1 :]: o["ETag"] for o in listed}


def convert(argv: list[str], staging: Path, monkeypatch) -> int:
    monkeypatch.setenv("ENERGON_PLATFORM_STAGING", str(staging))
    return cli_main(["convert", *argv, "--no-progress"])


# ---------------------------------------------------------------- 1: the prefix is the authority


@pytest.fixture
def converted(s3, tmp_path, monkeypatch, request):
    """20 COCO images converted to ``msc://.../NAME`` in 3 shards, through staging folder ``a``."""
    key = f"h2-{request.node.name}".replace("[", "-").replace("]", "")[:60]
    url = s3.url(key)
    coco = _coco(tmp_path / "raw")
    assert (
        convert(
            ["coco", *coco, "--out", url, "--samples-per-shard", "8"], tmp_path / "a", monkeypatch
        )
        == 0
    )
    return url, key, coco


def test_other_conversion_onto_a_dataset_prefix_is_refused_naming_the_url(
    s3, converted, tmp_path, monkeypatch, capsys
):
    url, key, _ = converted
    before = objects(s3, key)
    assert "train/shard-000002.tar" in before and ".convert/state.json" in before
    capsys.readouterr()
    text = ["text", "--manifest", str(docs(tmp_path / "docs.jsonl")), "--out", url]
    assert convert(text, tmp_path / "b", monkeypatch) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and url in err
        and "another input (another kind of corpus" in err
        and "--overwrite" in err
    ), err
    assert str(tmp_path / "b") not in err
    assert objects(s3, key) == before, "nothing on the prefix may change"


def test_overwrite_of_a_prefix_replaces_every_object_a_conversion_wrote(
    s3, converted, tmp_path, monkeypatch
):
    """(A prefix also holding an object no conversion wrote is refused: test_remote_prefix_safety.py.)"""
    url, key, _ = converted
    text = ["text", "--manifest", str(docs(tmp_path / "docs.jsonl")), "--out", url, "--overwrite"]
    assert convert(text, tmp_path / "b", monkeypatch) == 0
    after = objects(s3, key)
    from converters.energon_meta import META_FILES

    expected = {
        "report.json",
        "skipped.jsonl",
        ".convert/state.json",
        "train/shard-000000.tar",
        "train/shard-000000.tar.idx",
        ".convert/units/train-shard-000000.json",
        *(f".nv-meta/{n}" for n in META_FILES),
    }
    assert set(after) == expected, "old shards orphaned"
    assert "train/shard-000002.tar" not in after
    report = json.loads(
        s3.client().get_object(Bucket=s3.bucket, Key=f"{key}/report.json")["Body"].read()
    )
    assert report["modality"] == "text" and report["totals"]["written"] == 5


def test_finished_prefix_rerun_from_an_empty_staging_folder_has_nothing_to_do(
    s3, converted, tmp_path, monkeypatch, capsys
):
    url, key, coco = converted
    before, counters = objects(s3, key), s3.counters()
    capsys.readouterr()
    assert (
        convert(
            ["coco", *coco, "--out", url, "--samples-per-shard", "8"], tmp_path / "b", monkeypatch
        )
        == 0
    )
    assert "nothing to do" in capsys.readouterr().out
    assert (
        dict((s3.counters() - counters).by_type).get("PUT", 0) == 0 and objects(s3, key) == before
    )
    assert not remote.staging_dir(url).exists(), "nothing converted locally"


def test_a_prefix_holding_foreign_objects_only_is_refused(s3, tmp_path, monkeypatch, capsys):
    key = "h2-foreign-only"
    s3.client().put_object(Bucket=s3.bucket, Key=f"{key}/notes.txt", Body=b"mine")
    text = ["text", "--manifest", str(docs(tmp_path / "docs.jsonl")), "--out", s3.url(key)]
    assert convert(text, tmp_path / "b", monkeypatch) == 2
    assert "no energon-platform conversion" in capsys.readouterr().err
    assert objects(s3, key).keys() == {"notes.txt"}


# ---------------------------------------------------------------- 10: profile errors on the first run


@pytest.mark.parametrize("case", ["no MSC_CONFIG", "unknown profile", "missing config file"])
def test_first_conversion_to_an_unusable_msc_profile_is_one_line(s3, tmp_path, case):
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "ENERGON_PLATFORM_STAGING": str(tmp_path / "staging"),
    }
    env.pop("MSC_CONFIG", None)
    url = s3.url("h2-profile")
    if case == "unknown profile":
        env["MSC_CONFIG"], url = str(s3.msc_config), "msc://no-such-profile/x"
    elif case == "missing config file":
        env["MSC_CONFIG"] = str(tmp_path / "nowhere.yaml")
    r = run_cli(
        "convert",
        "text",
        "--manifest",
        docs(tmp_path / "docs.jsonl"),
        "--out",
        url,
        "--no-progress",
        env=env,
        timeout=120,
    )
    assert one_line_error(r), r.stderr
    assert url in r.stderr and "MSC_CONFIG" in r.stderr


@pytest.mark.parametrize("command", ["convert", "prepare", "info", "verify", "preview", "train"])
def test_a_bucket_that_does_not_exist_is_named_by_every_command(s3, tmp_path, capsys, command):
    """T1/T2/M4: a missing bucket was a 60-line botocore traceback (convert, prepare) or "not an
    Energon dataset" / "no report.json" / "convert it first" (the readers)."""
    url = s3.url("x", s3.no_bucket_profile)
    argv = {
        "convert": ["convert", "text", "--manifest", str(docs(tmp_path / "d.jsonl")), "--out", url],
        "prepare": ["prepare", url],
        "info": ["info", url],
        "verify": ["verify", url],
        "preview": ["preview", url, "--out", str(tmp_path / "sheet.png")],
        "train": [
            "train",
            "--config",
            str(REPO / "configs/train_image_text.yaml"),
            "--set",
            f"data.path={url}",
            "--out",
            str(tmp_path / "run"),
        ],
    }[command]
    assert cli_main([*argv, *(["--no-progress"] if command == "convert" else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{url}: the bucket of MSC profile" in err[0], err
    assert "does not exist (NoSuchBucket)" in err[0]


# ---------------------------------------------------------------- a test that let a bug through: same size, other bytes


def test_upload_sends_again_an_object_of_the_same_size_with_other_bytes(s3, make_dataset, tmp_path):

    local = tmp_path / "ds"
    shutil.copytree(make_dataset("image_text", n=16), local)
    url = s3.url("h2-same-size")
    upload_dataset(local, url)
    report = local / "report.json"
    data = report.read_bytes()
    at = data.index(b'"status": "ok"') + len(b'"status": "')
    report.write_bytes(data[:at] + b"O" + data[at + 1 :])  # one byte, same size
    assert report.stat().st_size == len(data)
    before = s3.counters()
    again = upload_dataset(local, url)
    puts = dict((s3.counters() - before).by_type).get("PUT", 0)
    assert puts == 1 and [f.url for f in again.files if f.uploaded] == [f"{url}/report.json"], puts
    body = s3.client().get_object(Bucket=s3.bucket, Key="h2-same-size/report.json")["Body"].read()
    assert body == report.read_bytes()
