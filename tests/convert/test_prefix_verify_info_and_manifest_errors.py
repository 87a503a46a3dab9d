"""Converter, object storage, verify and info edges, one test per defect; each
fails without its fix.

Object storage is a real SeaweedFS (``tests/helpers/s3_server.py``). The staging folder is set per run
(``ENERGON_PLATFORM_STAGING``): a fresh one is what another machine, or a cleared temp folder, has.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from converters import remote
from converters.remote import upload_dataset
from energon_platform.cli import main as cli_main
from tests.helpers import REPO
from tests.helpers.cli import one_line_error, run_cli
from tests.storage.test_s3 import _coco


def docs(path: Path, n: int = 5) -> Path:
    path.write_text(
        "".join(json.dumps({"id": i, "text": f"document number {i}"}) + "\n" for i in range(n))
    )
    return path


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


@pytest.mark.parametrize("command", ["info", "verify", "preview"])
def test_a_path_that_does_not_exist_is_not_called_a_dataset_to_convert(tmp_path, capsys, command):
    """M13: ``info does/not/exist`` said "not an Energon dataset"."""
    missing = str(tmp_path / "does" / "not" / "exist")
    extra = ["--out", str(tmp_path / "sheet.png")] if command == "preview" else []
    assert cli_main([command, missing, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].endswith(f"{missing}: no such file or folder")
        or (command == "preview" and "no such run config, dataset or metadataset" in err[0])
    ), err


# ---------------------------------------------------------------- 3: verify checks what the loader reads


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("text_ds")
    out = root / "ds"
    r = run_cli(
        "convert",
        "text",
        "--manifest",
        docs(root / "docs.jsonl", 12),
        "--out",
        out,
        "--samples-per-shard",
        "5",
        "--no-progress",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize(
    "gone",
    [
        "train/shard-000001.tar.idx",
        ".nv-meta",
        ".nv-meta/split.yaml",
        ".nv-meta/index.sqlite",
        ".nv-meta/dataset.yaml",
        ".nv-meta/index.uuid",
    ],
)
def test_verify_names_each_missing_file_the_loader_needs(text_dataset, tmp_path, capsys, gone):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(text_dataset, ds)
    assert cli_main(["verify", str(ds), "--no-progress"]) == 0
    capsys.readouterr()
    target = ds / gone
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    assert cli_main(["verify", str(ds), "--no-progress"]) == 1
    out = capsys.readouterr().out
    named = [
        line.split(": ", 1)[1]
        for line in out.splitlines()
        if line.startswith("  missing (the loader needs it)")
    ]
    assert named and all(n == gone or n.startswith(gone + "/") for n in named), out
    assert "file(s) the loader needs missing" in out.splitlines()[-1]


# ---------------------------------------------------------------- 11: info on a damaged report


@pytest.mark.parametrize("drop", ["totals", "shards", "splits"])
def test_info_with_a_report_missing_a_section_is_one_line(text_dataset, tmp_path, drop):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(text_dataset, ds)
    report = json.loads((ds / "report.json").read_text())
    del report[drop]
    (ds / "report.json").write_text(json.dumps(report))
    r = run_cli("info", ds, timeout=120)
    assert one_line_error(r) and "report.json: corrupt conversion report" in r.stderr, r.stderr


# ---------------------------------------------------------------- surprises: manifests


def test_jsonl_without_the_text_column_says_the_column_is_missing_like_csv(tmp_path):
    manifest = tmp_path / "docs.jsonl"
    manifest.write_text("".join(json.dumps({"id": i, "body": f"doc {i}"}) + "\n" for i in range(4)))
    r = run_cli(
        "convert",
        "text",
        "--manifest",
        manifest,
        "--out",
        tmp_path / "out",
        "--no-progress",
        timeout=120,
    )
    assert one_line_error(r) and "no column 'text' (columns: body, id)" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    # a field missing from some lines only stays a per-row problem
    manifest.write_text(json.dumps({"id": 0, "text": "doc"}) + "\n" + json.dumps({"id": 1}) + "\n")
    r = run_cli(
        "convert",
        "text",
        "--manifest",
        manifest,
        "--out",
        tmp_path / "out",
        "--no-progress",
        "--max-error-fraction",
        "0.5",
        timeout=120,
    )
    assert r.returncode == 0 and "skipped empty_text: 1" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.csv"])
def test_an_empty_manifest_is_named_empty(tmp_path, name):
    manifest = tmp_path / name
    manifest.write_text("" if name.endswith("jsonl") else "id,text\n")
    r = run_cli(
        "convert",
        "text",
        "--manifest",
        manifest,
        "--out",
        tmp_path / "out",
        "--no-progress",
        timeout=120,
    )
    assert one_line_error(r) and f"{manifest}: empty" in r.stderr, r.stderr
    assert "100.0%" not in r.stdout


# ---------------------------------------------------------------- surprises: --max-seconds cuts are counted


def test_max_seconds_cuts_are_counted_and_the_original_duration_recorded(tmp_path):
    from tests.convert.test_video import members
    from tests.helpers.video_corpus import write_folder

    # 1 s and 4 s at 12 fps
    root = write_folder(tmp_path / "raw", 4, lengths=(12, 48), formats=("mp4",))
    out = tmp_path / "out"
    r = run_cli(
        "convert",
        "video",
        "--root",
        root,
        "--out",
        out,
        "--max-seconds",
        "1.5",
        "--no-progress",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["cut_to_max_seconds"] == {
        "count": 2,
        "max_seconds": 1.5,
        "examples": ["clip_001", "clip_003"],
    }
    assert "cut to --max-seconds 1.5: 2" in r.stdout
    parts = members(out)
    for i in range(4):
        source = json.loads(parts[f"clip_{i:03d}.text.json"])["source"]
        if i % 2:
            assert (source["original_duration"], source["cut_to_seconds"], source["duration"]) == (
                4.0,
                1.5,
                1.5,
            )
        else:
            assert "original_duration" not in source and source["duration"] == 1.0


# ---------------------------------------------------------------- surprises: --help lists what applies


@pytest.mark.parametrize(
    "kind,listed,absent",
    [
        (
            "video",
            {"--max-side", "--max-seconds"},
            {"--image-format", "--max-pixels", "--audio-format"},
        ),
        (
            "text",
            set(),
            {"--image-format", "--max-pixels", "--audio-format", "--max-side", "--max-seconds"},
        ),
        (
            "coco",
            {"--image-format", "--max-side", "--max-pixels"},
            {"--audio-format", "--max-seconds"},
        ),
        (
            "librispeech",
            {"--audio-format"},
            {"--image-format", "--max-pixels", "--max-side", "--max-seconds"},
        ),
    ],
)
def test_convert_help_lists_only_the_options_that_apply(kind, listed, absent):
    r = run_cli("convert", kind, "--help", timeout=60)
    assert r.returncode == 0
    words = set(r.stdout.replace("[", " ").replace("]", " ").replace(",", " ").split())
    assert listed <= words and not (absent & words), (listed - words, absent & words)
    assert "--out" in words and "--overwrite" in words


# ---------------------------------------------------------------- a test that let a bug through: same size, other bytes


def test_upload_sends_again_an_object_of_the_same_size_with_other_bytes(s3, make_dataset, tmp_path):
    import shutil

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
