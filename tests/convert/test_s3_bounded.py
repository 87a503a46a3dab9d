"""Converting to object storage with bounded local disk, against the SeaweedFS the
tests start (``tests/helpers/s3_server.py``).

Each work unit writes its shard into its process's staging folder, uploads and checks it with its
index record, and deletes it; Energon's index is built from the records. The prefix, not a local
folder, is the record of progress: a conversion killed with SIGKILL resumes from another, empty
staging folder. Every claim is checked against a conversion of the same input to a local folder
(Energon's own prepare over the shards) or against an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from energon_platform.cli import main as cli_main
from scripts.folder_sampler import FolderSampler
from tests.helpers.cli import cli_argv
from tests.helpers.s3_server import S3Server
from tests.storage.test_s3 import _coco, assert_same_batch, micro_batches

SPS = 4  #: samples per shard: many small shards, so the corpus is many times the staging bound


def objects(s3, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix/``: relative key → bytes."""
    c = s3.client()
    keys = [
        o["Key"]
        for o in c.list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/").get("Contents", [])
    ]
    return {
        k[len(prefix) + 1 :]: c.get_object(Bucket=s3.bucket, Key=k)["Body"].read() for k in keys
    }


def modified(s3, prefix: str) -> dict[str, object]:
    listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"][len(prefix) + 1 :]: o["LastModified"] for o in listed}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    raw = tmp_path_factory.mktemp("s3b")
    return _coco(raw / "raw", 60)


@pytest.fixture(scope="module")
def local_conversion(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("s3b-local") / "out"
    assert (
        cli_main(
            [
                "convert",
                "coco",
                *corpus,
                "--out",
                str(out),
                "--samples-per-shard",
                str(SPS),
                "--val-fraction",
                "0.2",
                "--no-progress",
            ]
        )
        == 0
    )
    return out


def convert(corpus, url, staging: Path, monkeypatch, *extra, progress: bool = False) -> int:
    monkeypatch.setenv("ENERGON_PLATFORM_STAGING", str(staging))
    return cli_main(
        [
            "convert",
            "coco",
            *corpus,
            "--out",
            url,
            "--samples-per-shard",
            str(SPS),
            "--val-fraction",
            "0.2",
            *([] if progress else ["--no-progress"]),
            *extra,
        ]
    )


def test_bounded_staging_gives_the_local_conversion_and_energons_index(
    s3, corpus, local_conversion, tmp_path, monkeypatch
):
    staging = tmp_path / "staging"
    staging.mkdir()
    workers = 2
    with FolderSampler(staging) as sampler:
        assert (
            convert(corpus, s3.url("bounded"), staging, monkeypatch, "--workers", str(workers)) == 0
        )
    got = objects(s3, "bounded")
    local = {
        p.relative_to(local_conversion).as_posix(): p.read_bytes()
        for p in local_conversion.rglob("*")
        if p.is_file() and p.relative_to(local_conversion).parts[0] != ".convert"
    }
    # every shard, .tar.idx and .nv-meta file (index.sqlite included) is the local conversion's, byte for byte
    report = json.loads(got.pop("report.json"))
    assert report.pop("uploads") == {"retries": 0}
    assert report == json.loads(local.pop("report.json"))
    assert {k: v for k, v in got.items() if not k.startswith(".convert/")} == local
    shards = [k for k in local if k.endswith(".tar")]
    assert len(shards) >= 12 and all(
        f".convert/units/{s[:-4].replace('/', '-')}.json" in got for s in shards
    )
    # the staging folder never held more than (workers + 1) shards plus small metadata, and is gone
    largest = max(len(local[s]) + len(local[s + ".idx"]) for s in shards)
    corpus_bytes = sum(len(local[s]) for s in shards)
    assert 0 < sampler.peak_shards <= (workers + 1) * largest, (sampler.peak_shards, largest)
    assert sampler.peak <= (workers + 1) * largest + 96 * 1024, sampler.peak
    assert corpus_bytes >= 4 * (workers + 1) * largest
    assert not any(staging.iterdir()), "the staging folder is removed after the upload"
    # Energon's own loader reads the prefix; ours gives the batches of the local conversion
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    ds = get_train_dataset(
        s3.url("bounded"),
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    keys = set()
    for sample in get_loader(ds):
        if sample.__key__ in keys:
            break
        keys.add(sample.__key__)
    assert len(keys) == report["splits"]["train"]["samples"]
    for a, b in zip(micro_batches(s3.url("bounded"), 3, 0), micro_batches(local_conversion, 3, 0)):
        assert_same_batch(a, b)


def test_index_built_from_records_equals_energons_prepare(local_conversion, tmp_path):
    """The records taken from the shards' headers rebuild .tar.idx and index.sqlite byte for byte."""
    from converters.energon_meta import prepare
    from converters.shard_index import file_record, tar_idx_bytes

    shards = [
        s["shard"] for s in json.loads((local_conversion / "report.json").read_text())["shards"]
    ]
    records = {s: file_record(local_conversion / s) for s in shards}
    assert all(
        tar_idx_bytes(records[s]) == (local_conversion / (s + ".idx")).read_bytes() for s in shards
    )
    prepare(str(tmp_path), shards, "image", ["image.png"], "x", records.__getitem__)
    ours, energon = tmp_path / ".nv-meta", local_conversion / ".nv-meta"
    for name in ("index.sqlite", ".info.json", "split.yaml"):
        assert (ours / name).read_bytes() == (energon / name).read_bytes(), name
    dump = lambda p: list(sqlite3.connect(p).iterdump())  # noqa: E731
    assert dump(ours / "index.sqlite") == dump(energon / "index.sqlite")


@pytest.mark.slow
def test_sigkill_then_resume_from_another_empty_staging_folder_is_byte_identical(
    s3, corpus, tmp_path, monkeypatch, capsys
):
    assert convert(corpus, s3.url("uninterrupted"), tmp_path / "u", monkeypatch) == 0
    env = {
        **os.environ,
        "MSC_CONFIG": str(s3.msc_config),
        "ENERGON_PLATFORM_STAGING": str(tmp_path / "machine-a"),
    }
    proc = subprocess.Popen(
        cli_argv(
            "convert",
            "coco",
            *corpus,
            "--out",
            s3.url("killed"),
            "--samples-per-shard",
            str(SPS),
            "--val-fraction",
            "0.2",
            "--no-progress",
        ),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (
                "finished before it could be killed"
            )
            # frozen while the prefix is listed, so the kill finds what the listing shows,
            # however long listing takes on a loaded machine
            os.killpg(proc.pid, signal.SIGSTOP)
            if sum(k.startswith(".convert/units/") for k in modified(s3, "killed")) >= 4:
                break
            os.killpg(proc.pid, signal.SIGCONT)
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    before = modified(s3, "killed")
    done = {k for k in before if k.startswith(".convert/units/")}
    assert "report.json" not in before and 4 <= len(done) < 15
    time.sleep(1.1)  # LastModified has 1 s resolution: a re-upload would show
    capsys.readouterr()
    assert (
        convert(corpus, s3.url("killed"), tmp_path / "machine-b", monkeypatch, progress=True) == 0
    )
    bar = capsys.readouterr().err
    first = re.search(r"shards (\d+)/(\d+)", bar)
    assert first.group(1) == str(len(done)), "the progress starts at the units the prefix holds"
    assert f"shards {first.group(2)}/{first.group(2)} written+uploaded" in bar and "MB/s up" in bar
    after = modified(s3, "killed")
    for rel in done:  # finished units were not converted or uploaded again
        shard = rel[len(".convert/units/") : -len(".json")].replace("-", "/", 1) + ".tar"
        assert after[rel] == before[rel] and (
            shard not in before or after[shard] == before[shard]
        ), rel
    assert objects(s3, "killed") == objects(s3, "uninterrupted")


@pytest.mark.slow
def test_ray_two_workers_separate_staging_gives_the_same_objects(s3, corpus, tmp_path, monkeypatch):
    staging = tmp_path / "driver"
    staging.mkdir()
    monkeypatch.setenv("ENERGON_PLATFORM_STAGING", str(staging))
    import ray  # noqa: F401  (sets RAY_CLIENT_MODE when imported, for its workers to inherit)

    environ = dict(os.environ)
    with FolderSampler(staging) as sampler:
        assert (
            convert(
                corpus, s3.url("ray"), staging, monkeypatch, "--executor", "ray", "--workers", "2"
            )
            == 0
        )
    assert dict(os.environ) == environ  # Ray's own variables (PYTHONBREAKPOINT, ...) did not stay
    if not (objects_local := objects(s3, "inline")):
        assert convert(corpus, s3.url("inline"), tmp_path / "inline", monkeypatch) == 0
        objects_local = objects(s3, "inline")
    assert objects(s3, "ray") == objects_local
    # each Ray worker wrote its shards in a staging folder of its own (none in the driver's process)
    workers = {d[3] for d in sampler.shard_dirs if d[:3][1:] == (".convert", "work")}
    assert len(workers) >= 2 and not any(w.endswith(f"-{os.getpid()}") for w in workers), (
        sampler.shard_dirs
    )


@pytest.fixture
def own_server(tmp_path, monkeypatch):
    """A server of this test's own: it is stopped and started under a running conversion."""
    server = S3Server.launch(tmp_path / "weed")
    monkeypatch.setenv("MSC_CONFIG", str(server.msc_config))
    yield server
    server.stop()


@pytest.mark.slow
def test_failed_upload_is_retried_with_backoff_named_and_rerun_continues(
    own_server, corpus, tmp_path, monkeypatch, capsys
):
    s3 = own_server
    monkeypatch.setenv("ENERGON_PLATFORM_UPLOAD_ATTEMPTS", "2")
    monkeypatch.setenv("ENERGON_PLATFORM_UPLOAD_BACKOFF", "0.2")

    def records() -> int:
        return sum(k.startswith(".convert/units/") for k in modified(s3, "flaky"))

    def stop_after_first_record(restart_after: float | None):
        baseline = records()
        while records() <= baseline:
            time.sleep(0.01)
        s3.stop(kill=True)
        if restart_after is not None:
            time.sleep(restart_after)
            s3.start()

    # the store goes away for good: the run stops naming the shard it could not upload
    t = threading.Thread(target=stop_after_first_record, args=(None,))
    t.start()
    capsys.readouterr()
    assert convert(corpus, s3.url("flaky"), tmp_path / "a", monkeypatch) == 2
    t.join()
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "cannot upload" in err
        and "shard-0000" in err
        and "2 tries" in err
    ), err
    # it comes back while the next run's uploads are being retried: retried, counted, finished
    s3.start()
    monkeypatch.setenv("ENERGON_PLATFORM_UPLOAD_ATTEMPTS", "10")  # up to ~100 s for a slow restart
    t = threading.Thread(target=stop_after_first_record, args=(1.0,))
    t.start()
    assert convert(corpus, s3.url("flaky"), tmp_path / "b", monkeypatch) == 0
    t.join()
    report = json.loads(objects(s3, "flaky")["report.json"])
    assert report["uploads"]["retries"] >= 1 and report["status"] == "ok"


def test_upload_retries_are_counted_over_every_run_of_a_conversion(
    s3, corpus, tmp_path, monkeypatch, capsys
):
    """A run retries one upload and then fails on another shard after 2 tries; the run that
    finishes reports the first run's 2 retries too (kept on the prefix, not in the staging folder)."""
    import converters.remote as remote

    monkeypatch.setenv("ENERGON_PLATFORM_UPLOAD_ATTEMPTS", "2")
    monkeypatch.setenv("ENERGON_PLATFORM_UPLOAD_BACKOFF", "0.01")
    real, calls = remote.upload_file, {}

    def flaky(local_path, url):
        rel = url.split("/carry/", 1)[1]
        calls[rel] = calls.get(rel, 0) + 1
        if rel == "train/shard-000000.tar" and calls[rel] == 1 or rel == "train/shard-000002.tar":
            raise OSError(f"injected failure of {rel}")
        return real(local_path, url)

    monkeypatch.setattr(remote, "upload_file", flaky)
    capsys.readouterr()
    assert convert(corpus, s3.url("carry"), tmp_path / "a", monkeypatch) == 2
    err = capsys.readouterr().err
    assert "train/shard-000002.tar" in err and "2 tries" in err, err
    assert calls["train/shard-000000.tar"] == 2 and "train/shard-000001.tar" in calls
    monkeypatch.setattr(remote, "upload_file", real)
    # another, empty staging folder
    assert convert(corpus, s3.url("carry"), tmp_path / "b", monkeypatch) == 0
    report = json.loads(objects(s3, "carry")["report.json"])
    assert report["uploads"] == {"retries": 2} and report["status"] == "ok", report["uploads"]
    assert json.loads(objects(s3, "carry")[".convert/state.json"])["upload_retries"] == 2


def test_prepare_an_existing_webdataset_on_s3_reads_only_tar_headers(s3, local_conversion, capsys):
    """Tars put on a prefix by hand; ``prepare`` writes the index ``convert`` would have written."""
    from converters.remote_prepare import prepare_prefix

    c, key = s3.client(), "wds-foreign"
    tars = sorted(
        p.relative_to(local_conversion).as_posix() for p in local_conversion.rglob("*.tar")
    )
    for rel in tars + [".nv-meta/dataset.yaml"]:
        c.put_object(
            Bucket=s3.bucket, Key=f"{key}/{rel}", Body=(local_conversion / rel).read_bytes()
        )
    r = prepare_prefix(s3.url(key), readahead=512)  # one 512-byte header per request
    got = objects(s3, key)
    assert all(got[t + ".idx"] == (local_conversion / (t + ".idx")).read_bytes() for t in tars)
    for name in ("index.sqlite", ".info.json", "split.yaml"):
        assert got[f".nv-meta/{name}"] == (local_conversion / ".nv-meta" / name).read_bytes(), name
    # one request per member header (2 members a sample) and one for the end of each tar, never the data
    assert r["shards"] == len(tars) and r["requests"] <= 2 * r["samples"] + r["shards"], r
    assert r["bytes_read"] <= 1024 * r["requests"] and r["bytes_read"] < r["tar_bytes"] / 2, r
    for a, b in zip(micro_batches(s3.url(key), 2, 0), micro_batches(local_conversion, 2, 0)):
        assert_same_batch(a, b)
    capsys.readouterr()
    assert cli_main(["prepare", s3.url(key)]) == 0
    out = capsys.readouterr().out
    assert "ranged requests" in out and f"{len(tars)} shards" in out
