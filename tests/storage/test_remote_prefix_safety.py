"""What a conversion or ``prepare`` may do to an object-storage prefix it did not write, and the
edges of both, against the SeaweedFS the tests start (``tests/helpers/s3_server.py``, one per session).

A user's WebDataset indexed with ``prepare`` is never a conversion's to replace, ``--overwrite`` or
not; ``--overwrite`` of a conversion refuses when the prefix holds an object no conversion wrote;
a bucket's root is a prefix like any other. ``prepare`` refuses, writing nothing, a tar that is not
whole and a prefix a conversion wrote, and keeps ``index.uuid`` exactly while the tars are the same.
A unit whose shard on the prefix has another size is converted again. Every refusal is one line,
exit 2, and changes nothing on the store.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from energon_platform.cli import main as cli_main
from tests.helpers.corpora import numbered_docs as docs

#: A hand-made WebDataset: shards named as a conversion names them (the case a careless
#: ``--overwrite`` would delete).
WDS_TARS = (
    "train/shard-000000.tar",
    "train/shard-000001.tar",
    "val/shard-000000.tar",
    "val/shard-000001.tar",
)


def make_tar(name: str = "s", samples: int = 3, word: str = "cat") -> bytes:
    """A WebDataset tar: ``samples`` samples ``NAME-I``, each ``.txt`` and ``.json``; ``word``
    changes the bytes and not the size (for a same-sized word)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(samples):
            for part, data in (
                ("txt", f"a {word} number {i}".encode()),
                ("json", json.dumps({"i": i}).encode()),
            ):
                info = tarfile.TarInfo(f"{name}-{i:06d}.{part}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def etags(s3, key: str) -> dict[str, str]:
    """Every object under ``key/`` (``""``: the whole bucket): relative key → ETag."""
    base = f"{key}/" if key else ""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=base)
    return {o["Key"][len(base) :]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def read(s3, key: str) -> bytes:
    return s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()


def put(s3, key: str, body: bytes) -> None:
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=body)


def hand_made_webdataset(s3, key: str, word: str = "cat") -> None:
    for rel in WDS_TARS:
        put(s3, f"{key}/{rel}", make_tar(rel[:-4].replace("/", "-"), word=word))


def run(argv: list[str], capsys, staging: Path | None = None, monkeypatch=None) -> tuple[int, str]:
    """The CLI in this process: exit status and stderr (a traceback fails the test)."""
    if staging is not None:
        monkeypatch.setenv("ENERGON_PLATFORM_STAGING", str(staging))
    capsys.readouterr()
    rc = cli_main(argv + (["--no-progress"] if argv[0] == "convert" else []))
    return rc, capsys.readouterr().err.strip()


def convert_text(
    url: str, manifest: Path, tmp_path: Path, monkeypatch, capsys, *extra
) -> tuple[int, str]:
    return run(
        [
            "convert",
            "text",
            "--manifest",
            str(manifest),
            "--out",
            url,
            "--samples-per-shard",
            "2",
            *extra,
        ],
        capsys,
        tmp_path / f"staging-{len(list(tmp_path.glob('staging-*')))}",
        monkeypatch,
    )


def refused(rc: int, err: str, *names: str) -> bool:
    return rc == 2 and len(err.splitlines()) == 1 and all(n in err for n in names)


# ---------------------------------------------------------------- a prefix that holds no conversion


def test_overwrite_refuses_a_prepared_webdataset_and_keeps_its_tars(
    s3, tmp_path, monkeypatch, capsys
):
    key = "safety-wds"
    hand_made_webdataset(s3, key)
    assert run(["prepare", s3.url(key)], capsys)[0] == 0
    before = etags(s3, key)
    assert set(before) >= {t + ".idx" for t in WDS_TARS} | {".nv-meta/index.uuid"}
    manifest = docs(tmp_path / "docs.jsonl")
    for extra in ((), ("--overwrite",)):
        rc, err = convert_text(s3.url(key), manifest, tmp_path, monkeypatch, capsys, *extra)
        assert refused(rc, err, s3.url(key), "no energon-platform conversion"), err
        assert "pass --overwrite" not in err, "suggests what would delete the user's tars"
        assert etags(s3, key) == before, f"the user's WebDataset changed ({extra})"


def test_conversion_into_a_bucket_root_beside_other_datasets_is_refused(
    s3, tmp_path, monkeypatch, capsys
):
    put(s3, "safety-other-dataset/train/shard-000000.tar", make_tar())
    before = etags(s3, "")
    for extra in ((), ("--overwrite",)):
        rc, err = convert_text(
            s3.url(""), docs(tmp_path / "docs.jsonl"), tmp_path, monkeypatch, capsys, *extra
        )
        assert refused(rc, err, s3.url("").rstrip("/"), "no energon-platform conversion"), err
        assert etags(s3, "") == before, "nothing in the bucket may change"


# ---------------------------------------------------------------- a conversion holding a user's object


def test_overwrite_refuses_a_conversion_holding_an_object_no_conversion_wrote(
    s3, tmp_path, monkeypatch, capsys
):
    url, key = s3.url("safety-notes"), "safety-notes"
    assert convert_text(url, docs(tmp_path / "a.jsonl", 4), tmp_path, monkeypatch, capsys)[0] == 0
    put(s3, f"{key}/train/user_notes.txt", b"mine")
    before = etags(s3, key)
    other = docs(tmp_path / "b.jsonl", 6)
    rc, err = convert_text(url, other, tmp_path, monkeypatch, capsys, "--overwrite")
    assert refused(rc, err, url, "train/user_notes.txt", "--overwrite refused"), err
    assert etags(s3, key) == before
    # without --overwrite: refused as another conversion, and --overwrite is not offered
    rc, err = convert_text(url, other, tmp_path, monkeypatch, capsys)
    assert (
        refused(rc, err, url, "holds a conversion of another", "train/user_notes.txt")
        and "pass --overwrite" not in err
    ), err
    assert etags(s3, key) == before


# ---------------------------------------------------------------- prepare's refusals


def _cut(at: str) -> bytes:
    """A whole tar cut short: inside a member's header or data, before or inside its end blocks."""
    tar = make_tar()
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        member, end = t.getmembers()[2], t.offset
    return tar[
        : {
            "header": member.offset + 300,
            "data": member.offset_data + 5,
            "end": end,
            "end blocks": end + 700,
        }[at]
    ]


BAD_TARS = {
    "cut in a header": lambda: _cut("header"),
    "cut in member data": lambda: _cut("data"),
    "cut before its end blocks": lambda: _cut("end"),
    "cut in its end blocks": lambda: _cut("end blocks"),
    "not a tar": lambda: b"these are not the tars you are looking for\n" * 40,
    "empty tar": lambda: make_tar(samples=0),
    "a key of another shard": lambda: make_tar("whole"),
    "zero bytes": lambda: b"",
}


@pytest.mark.parametrize("case", sorted(BAD_TARS))
def test_prepare_refuses_a_shard_it_cannot_index_naming_it_and_writes_nothing(s3, capsys, case):
    key = "safety-bad-" + case.replace(" ", "-")
    put(s3, f"{key}/train/shard-000000.tar", make_tar("whole"))
    put(s3, f"{key}/train/shard-000001.tar", BAD_TARS[case]())
    before = etags(s3, key)
    rc, err = run(["prepare", s3.url(key)], capsys)
    assert refused(rc, err, s3.url(key), "train/shard-000001.tar"), err
    assert etags(s3, key) == before, "nothing is written, not even the whole shard's .tar.idx"


def test_prepare_refuses_a_converted_prefix_and_keeps_its_uuid(s3, tmp_path, monkeypatch, capsys):
    url, key = s3.url("safety-converted"), "safety-converted"
    assert convert_text(url, docs(tmp_path / "a.jsonl", 4), tmp_path, monkeypatch, capsys)[0] == 0
    before = etags(s3, key)
    rc, err = run(["prepare", url], capsys)
    assert refused(rc, err, url, "energon-platform convert", "verify"), err
    assert etags(s3, key) == before, "index.uuid (or anything else) changed"


def test_prepare_of_a_local_folder_says_it_takes_msc_urls(tmp_path, capsys):
    (tmp_path / "shard-000000.tar").write_bytes(make_tar())
    rc, err = run(["prepare", str(tmp_path)], capsys)
    assert refused(rc, err, str(tmp_path), "msc://", "energon prepare"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-000000.tar"]


def test_prepare_keeps_index_uuid_exactly_while_the_tars_are_the_same(s3, capsys):
    key = "safety-uuid"
    uuid_key = f"{key}/.nv-meta/index.uuid"
    hand_made_webdataset(s3, key, word="cat")
    assert run(["prepare", s3.url(key)], capsys)[0] == 0
    first = read(s3, uuid_key)
    assert run(["prepare", s3.url(key)], capsys)[0] == 0
    assert read(s3, uuid_key) == first, "the same tars prepared again: old checkpoints stay valid"
    hand_made_webdataset(s3, key, word="dog")  # same names, sizes and sample counts; other bytes
    assert run(["prepare", s3.url(key)], capsys)[0] == 0
    assert read(s3, uuid_key) != first, (
        "changed tars kept the uuid: stale checkpoints and length caches accepted"
    )


# ---------------------------------------------------------------- the prefix records progress


def test_a_shard_of_another_size_on_the_prefix_is_converted_again(
    s3, tmp_path, monkeypatch, capsys
):
    manifest = docs(tmp_path / "docs.jsonl", 8)
    assert convert_text(s3.url("safety-whole"), manifest, tmp_path, monkeypatch, capsys)[0] == 0
    url, key = s3.url("safety-resized"), "safety-resized"
    assert convert_text(url, manifest, tmp_path, monkeypatch, capsys)[0] == 0
    shard = f"{key}/train/shard-000001.tar"
    put(s3, shard, read(s3, shard)[:-512] + b"x" * 100)  # other bytes, another size
    # an empty staging folder
    assert convert_text(url, manifest, tmp_path, monkeypatch, capsys)[0] == 0
    whole = {k: read(s3, f"safety-whole/{k}") for k in etags(s3, "safety-whole")}
    assert {k: read(s3, f"{key}/{k}") for k in etags(s3, key)} == whole


# ---------------------------------------------------------------- upload retries over runs


def test_retries_of_a_run_whose_upload_failed_every_try_are_counted(
    s3, tmp_path, monkeypatch, capsys
):
    """A shard's tar needs one retry, then every try of its ``.tar.idx`` fails (5 tries, 4
    retries): the run that completes reports all 5."""
    import converters.remote as remote

    monkeypatch.setenv("ENERGON_PLATFORM_UPLOAD_ATTEMPTS", "5")
    monkeypatch.setenv("ENERGON_PLATFORM_UPLOAD_BACKOFF", "0.001")
    real, calls = remote.upload_file, []

    def failing(local_path, url):
        calls.append(url)
        if (
            url.endswith("/train/shard-000001.tar.idx")
            or url.endswith("/train/shard-000001.tar")
            and calls.count(url) == 1
        ):
            raise OSError("injected failure")
        return real(local_path, url)

    monkeypatch.setattr(remote, "upload_file", failing)
    url, key, manifest = (
        s3.url("safety-retries"),
        "safety-retries",
        docs(tmp_path / "docs.jsonl", 6),
    )
    rc, err = convert_text(url, manifest, tmp_path, monkeypatch, capsys)
    assert refused(rc, err, "train/shard-000001.tar.idx", "5 tries"), err
    monkeypatch.setattr(remote, "upload_file", real)
    assert convert_text(url, manifest, tmp_path, monkeypatch, capsys)[0] == 0
    assert json.loads(read(s3, f"{key}/report.json"))["uploads"] == {"retries": 5}
