"""Datasets on object storage: a real S3 server (SeaweedFS on loopback), read through Energon's
``msc://`` paths (multi-storage-client), by the loader and ``info``; written by ``converters.remote``.

What the bad cases rely on (MSC 1.3 with boto3; profiles written by ``scripts/s3_server.py``):
botocore's ``standard`` retry mode (``retries.max_attempts`` tries, on connection errors, read
timeouts and 5xx) under every request, and MSC's own ``retry`` (``attempts``, ``delay``,
``backoff_multiplier``) around ``read``/``download_file``/``upload_file`` for what MSC classes as
retryable (HTTP 408/429/503, read timeouts, incomplete reads). ``info`` (HEAD, the first request
of every shard open) has botocore's retries only. A 403 is a ``PermissionError`` at once; a server
that stays unreachable ends in MSC's ``RuntimeError``. The loader turns all of these into a
one-line ``StorageError`` (a ``DatasetError``), never a skipped sample.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time

import pytest
import torch
import yaml

from converters.remote import dataset_files, upload_dataset
from energon_platform.cli import main as cli_main
from energon_platform.config import load_config
from energon_platform.loader.source import SampleSource, split_parts
from energon_platform.loader.train_loader import TrainLoader
from storage import DatasetError, StorageError
from tests.helpers import REPO
from tests.helpers.cli import start_python
from tests.helpers.s3_server import S3Server

IMAGE = str(REPO / "configs/encoders/image_text_small.yaml")


@pytest.fixture(scope="module")
def local(make_dataset):
    """48 image-text samples in 6 shards of 8 (more shards than Energon's reader keeps open: 5)."""
    return make_dataset("image_text", n=48)


@pytest.fixture(scope="module")
def remote(s3_server, local) -> str:
    """``local`` uploaded to the session's server: its ``msc://`` URL."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MSC_CONFIG", str(s3_server.msc_config))
        url = s3_server.url("image_text")
        upload_dataset(local, url)
    return url


def cfg(path, **loader):
    return load_config(
        {
            "data": {"path": str(path), "val_split": None},
            "encoder": IMAGE,
            "loader": {"global_batch_size": 8, "num_workers": 0, **loader},
        }
    )


def fields(batch) -> dict:
    return (
        {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
        if dataclasses.is_dataclass(batch)
        else dict(vars(batch))
    )


def assert_same_batch(a, b) -> None:
    """Same tensors and values; ``__sources__`` alike but for where the dataset lives."""
    fa, fb = fields(a), fields(b)
    assert fa.keys() == fb.keys()
    for f in (fa, fb):
        f["__sources__"] = [
            (s.index, s.shard_name, s.file_names) for s in f.get("__sources__") or ()
        ]
    for name in fa:
        if isinstance(fa[name], torch.Tensor):
            assert torch.equal(fa[name], fb[name]), name
        else:
            assert fa[name] == fb[name], name


def micro_batches(path, n: int, workers: int) -> list:
    loader = TrainLoader(cfg(path), num_workers=workers)
    try:
        return [next(loader) for _ in range(n)]
    finally:
        loader.close()


# ---------------------------------------------------------------- upload, info, loader


def test_upload_copies_the_conversion_once_and_skips_what_is_there(s3, local, tmp_path):
    url = s3.url("upload-check")
    first = upload_dataset(local, url)
    names = dataset_files(local)
    assert [f.url for f in first.files] == [f"{url}/{n}" for n in names] and first.uploaded == len(
        names
    )
    # what makes it a dataset: last
    assert names[-2:] == [
        ".nv-meta/.info.json",
        ".nv-meta/dataset.yaml",
    ]
    assert not any(n.startswith(".convert/") for n in names) and any(
        n.endswith(".tar.idx") for n in names
    )
    listed = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix="upload-check/")["Contents"]
    assert sorted(o["Key"].split("/", 1)[1] for o in listed) == sorted(names)

    before = s3.counters()
    again = upload_dataset(local, url)
    cost = s3.counters() - before
    assert again.uploaded == 0 and again.skipped == len(names)
    assert cost.requests == len(names) and cost.bytes_out == 0  # one HEAD per file, nothing sent

    changed = tmp_path / "changed"
    shutil.copytree(local, changed)
    (changed / "report.json").write_text((changed / "report.json").read_text() + "\n")
    third = upload_dataset(changed, url)
    assert [f.url.rsplit("/", 1)[1] for f in third.files if f.uploaded] == ["report.json"]


def test_info_reads_an_msc_dataset(s3, remote, local, capsys):
    from converters.info import dataset_info

    here, there = dataset_info(str(local)), dataset_info(remote)
    assert (
        there["path"] == remote
        and there["splits"] == here["splits"]
        and here["splits"]["train"] == {"shards": 6, "samples": 48}
    )
    assert (there["sample_type"], there["parts"], there["report"]) == (
        here["sample_type"],
        here["parts"],
        here["report"],
    )
    assert cli_main(["info", remote]) == 0
    assert f"dataset: {remote}" in capsys.readouterr().out


def test_preview_reads_an_msc_dataset_as_info_and_train_do(s3, remote, tmp_path, capsys):
    """M3: ``preview msc://...`` was refused ("no such run config, dataset or metadataset")."""
    sheet = tmp_path / "sheet.png"
    assert cli_main(["preview", remote, "--out", str(sheet), "--n", "2"]) == 0
    assert sheet.stat().st_size > 0 and "2 documents" in capsys.readouterr().out


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_on_s3_gives_the_micro_batches_of_local_disk(s3, remote, local, workers):
    there, here = micro_batches(remote, 4, workers), micro_batches(local, 4, workers)
    assert [b.keys for b in there] == [b.keys for b in here]
    for a, b in zip(there, here):
        assert_same_batch(a, b)


def test_an_index_built_once_is_published_beside_the_shards_and_read_by_ranges_per_node(
    s3, remote, tmp_path, monkeypatch, capsys
):
    """``index`` on an ``msc://`` dataset builds in a cache folder and publishes the index beside
    the shards; a loader on another node (other cache folders) builds nothing, even with
    ``loader.length_index: require``: it makes a ranged copy (opening fetches ``meta.json`` and
    the files' sizes, not the index) whose blocks, fetched as the planner reads them, hold the
    published bytes."""
    from megatron.energon.epathlib import EPath

    from energon_platform.loader.balance import length_store
    from energon_platform.loader.balance.lengths import LengthIndex
    from energon_platform.loader.balance.ranged_copy import copies

    config = tmp_path / "run.yaml"
    run = {"data": {"path": remote, "val_split": None}, "encoder": IMAGE}
    run["loader"] = {"global_batch_size": 8, "num_workers": 0, "balance": "attention"}
    config.write_text(yaml.safe_dump(run))
    monkeypatch.setenv("ENERGON_PLATFORM_CACHE", str(tmp_path / "builder"))
    assert cli_main(["index", "--config", str(config), "--no-progress"]) == 0
    out = capsys.readouterr().out
    published = out.split("index: ")[1].split()[0]
    assert published.startswith(f"{remote}/.energon-platform/lengths/"), out
    assert EPath(f"{published}/meta.json").is_file()
    built = tmp_path / "builder" / "lengths" / published.rsplit("/", 1)[1]
    monkeypatch.setenv("ENERGON_PLATFORM_CACHE", str(tmp_path / "other-node"))
    shared = tmp_path / "other-node-shared"

    source = SampleSource(remote)
    before = s3.counters()
    copy = length_store.fetch_published(source, built.name, length_store.shard_jobs(source), shared)
    opened = LengthIndex(copy)
    cost = s3.counters() - before
    assert copy == shared / built.name
    assert cost.bytes_out < 2 * (built / "meta.json").stat().st_size, cost  # meta.json alone
    assert opened.facts(3) == LengthIndex(built).facts(3)
    assert opened.key(5) == LengthIndex(built).key(5)

    loader = TrainLoader(
        cfg(remote, balance="attention", length_index="require", length_cache=str(shared)),
        num_workers=0,
    )
    next(loader)
    loader.close()
    assert "length index" not in capsys.readouterr().err
    ranged = copies(copy)
    for name in ("facts.i32", "keys.bin", "keys.off"):
        local, whole = (copy / name).read_bytes(), (built / name).read_bytes()
        filled = ranged[name]._filled
        assert len(local) == len(whole) and filled[0], name
        block = ranged[name].block
        for b in range(len(filled)):
            if filled[b]:
                assert local[b * block : (b + 1) * block] == whole[b * block : (b + 1) * block]
    assert not (tmp_path / "other-node").exists(), "the local cache was not written"


def test_the_key_index_of_an_msc_dataset_is_copied_once_per_node(s3, remote, tmp_path, monkeypatch):
    """Energon's ``index.sqlite`` (read for keys and exclusion rules) is copied into the node's
    cache once: a second reader (another process of the node) reuses the copy."""
    from energon_platform.loader.key_index import KeyIndex

    monkeypatch.setenv("ENERGON_PLATFORM_CACHE", str(tmp_path / "node"))
    first = KeyIndex(SampleSource(remote))
    (copy,) = (tmp_path / "node" / "key-index").glob("*.sqlite")
    made = copy.stat().st_mtime_ns
    second = KeyIndex(SampleSource(remote))
    assert list((tmp_path / "node" / "key-index").glob("*.sqlite")) == [copy]
    assert copy.stat().st_mtime_ns == made, "the second reader copied it again"
    assert first.keys([0, 47]) == second.keys([0, 47]) and second.index(first.keys([5])[0]) == 5


# ---------------------------------------------------------------- bad cases


def test_shard_missing_on_the_store_is_named_at_start(s3, local):
    url = s3.url("missing-shard")
    upload_dataset(local, url)
    s3.client().delete_object(Bucket=s3.bucket, Key="missing-shard/train/shard-000003.tar")
    with pytest.raises(
        DatasetError, match=r"shard train/shard-000003.tar of split 'train' is missing \(1 of 6"
    ):
        SampleSource(url)
    with pytest.raises(DatasetError, match="shard-000003.tar"):
        TrainLoader(cfg(url))


def test_wrong_credentials_are_one_named_line(s3, remote, capsys):
    bad = remote.replace(s3.profile, s3.bad_profile)
    with pytest.raises(StorageError) as e:
        SampleSource(bad)
    message = str(e.value)
    assert "\n" not in message and "status_code: 403" in message and repr(s3.bad_profile) in message
    for argv in (["info", bad], ["info", "msc://no-such-profile/x"]):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(
            "energon-platform info: error: msc://"
        ) and "Traceback" not in "\n".join(err)


def test_refused_credentials_fail_an_upload_at_once_without_backoff(s3, tmp_path, monkeypatch):
    """A 403 reaches the retry loop as a ``StorageError`` caused by ``PermissionError``: one try,
    no pause (a retry cannot fix a credential)."""
    import storage.retry
    from converters import remote

    def no_pause(seconds):
        raise AssertionError(f"a refused credential was retried after a {seconds} s pause")

    monkeypatch.setattr(storage.retry.time, "sleep", no_pause)
    real, tries = remote.upload_file, []
    monkeypatch.setattr(remote, "upload_file", lambda *a: tries.append(a) or real(*a))
    (tmp_path / "f.bin").write_bytes(b"x" * 10)
    with pytest.raises(remote.UploadError, match="after 1 try") as e:
        remote.put_checked(
            str(tmp_path / "f.bin"),
            s3.url("refused/f.bin", profile=s3.bad_profile),
            "f.bin",
            attempts=5,
            backoff=10.0,
        )
    assert len(tries) == 1 and isinstance(e.value.__cause__.__cause__, PermissionError), e.value


@pytest.fixture
def own_server(tmp_path, local, monkeypatch):
    """A server of the test's own (it gets killed or paused) with ``local`` at ``msc://.../ds``;
    botocore's read timeout 1 s so stalls and deaths show within seconds."""
    server = S3Server.launch(tmp_path / "s3", read_timeout=1.0)
    monkeypatch.setenv("MSC_CONFIG", str(server.msc_config))
    try:
        upload_dataset(local, server.url("ds"))
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.resume()  # a paused process would not take the SIGKILL until continued
        server.stop(kill=True)


LAUNCH_AND_WAIT = """
import sys, time
from pathlib import Path
from scripts.s3_server import S3Server
server = S3Server.launch(Path(sys.argv[1]))
print(server.proc.pid, flush=True)
time.sleep(120)
"""


def test_a_server_dies_with_the_process_that_launched_it_even_by_sigkill(tmp_path):
    """A test worker killed past its timeout leaves no SeaweedFS behind (ports, CPU, files)."""
    with start_python(LAUNCH_AND_WAIT, tmp_path / "s3", cwd=REPO) as launcher:
        try:
            weed = int(launcher.stdout.readline())
        finally:
            launcher.kill()  # SIGKILL: no stop(), no atexit
    deadline = time.monotonic() + 10
    while _alive(weed) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(weed), f"weed {weed} outlived the process that launched it"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie: an orphan's zombie waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("workers", [0, 2])
def test_server_killed_mid_run_is_a_named_error_not_a_skip(own_server, workers):
    url = own_server.url("ds")
    loader = TrainLoader(cfg(url), num_workers=workers)
    try:
        next(loader)
        own_server.stop(kill=True)
        start = time.monotonic()
        with pytest.raises(StorageError) as e:
            for _ in range(12):  # two epochs: some sample needs a shard that is not open
                next(loader)
        assert time.monotonic() - start < 60
    finally:
        loader.close()
    message = str(e.value)
    # a worker that reopens the dataset after the kill names the metadata, others the sample
    assert "\n" not in message and message.startswith(f"{url}: cannot read "), message


def test_a_failed_read_ahead_costs_no_worker_and_changes_no_batch(s3, remote, monkeypatch):
    """A worker's read ahead (of the micro-batches after the one it makes) that fails is only a
    head start lost: the worker lives, the batches are those of a run without read ahead, and a
    real failure is reported by the micro-batch that needs the data (a store killed while the
    read ahead was the first to reach it ended the worker before: "worker died ... Out of
    memory?" instead of the store's error)."""
    from energon_platform.loader.batches import MicroBatchMaker

    def batches(n: int = 3) -> list[list[str]]:
        loader = TrainLoader(cfg(remote), num_workers=2)
        try:
            return [list(next(loader).keys) for _ in range(n)]
        finally:
            loader.close()

    expected = batches()

    def failing(self, c):
        raise StorageError(f"{remote}: cannot read (a read ahead failed on purpose)")

    monkeypatch.setattr(MicroBatchMaker, "prefetch", failing)  # the workers fork with it
    assert batches() == expected


def test_a_bug_in_the_read_ahead_is_reported_not_swallowed(s3, remote, monkeypatch):
    """Only the store's failures (`StorageError`) are a lost head start: any other error of a
    read ahead is a bug, and fails the micro-batch, named with the worker's traceback."""
    from energon_platform.loader.batches import MicroBatchMaker

    def broken(self, c):
        raise ZeroDivisionError("a bug in the read ahead, on purpose")

    monkeypatch.setattr(MicroBatchMaker, "prefetch", broken)
    loader = TrainLoader(cfg(remote), num_workers=2)
    try:
        with pytest.raises(ZeroDivisionError, match="on purpose") as e:
            next(loader)
    finally:
        loader.close()
    assert any("in loader worker" in note for note in getattr(e.value, "__notes__", ())), e.value


def test_server_gone_between_head_and_get_of_the_split_file_is_a_storage_error(
    own_server, s3, local, monkeypatch
):
    """A DataLoader worker reopens the dataset after the kill: the client's HEAD of
    ``split.yaml`` answered, its GET did not (MSC raises a plain ``OSError``). That is the store
    failing, a `StorageError`; a split file the store says is not there stays bad input."""
    from multistorageclient.providers.s3 import S3StorageProvider

    url = own_server.url("ds")
    assert split_parts(url) == ["train"]  # HEAD and GET answered
    real = S3StorageProvider._download_file

    def killed_before_the_get(self, remote_path, *a, **kw):
        if remote_path.endswith("split.yaml"):
            own_server.stop(kill=True)
        return real(self, remote_path, *a, **kw)

    monkeypatch.setattr(S3StorageProvider, "_download_file", killed_before_the_get)
    with pytest.raises(StorageError, match=rf"^{url}: cannot read \.nv-meta/split\.yaml \("):
        split_parts(url)

    missing = s3.url("no-split-file")
    upload_dataset(local, missing)
    s3.client().delete_object(Bucket=s3.bucket, Key="no-split-file/.nv-meta/split.yaml")
    with pytest.raises(DatasetError, match="split.yaml is missing or unreadable") as e:
        split_parts(missing)
    assert not isinstance(e.value, StorageError)


def test_stall_shorter_than_the_retries_is_waited_out_with_the_same_sample(
    own_server, local, caplog
):
    url = own_server.url("ds")
    expected = SampleSource(str(local))[0]
    assert torch.equal(SampleSource(url)[0].image, expected.image)  # warms the process's MSC client
    # botocore says each retry it makes; counted on the client, not from the server's counters
    # (the server counts the abandoned request only if its late answer still reaches a socket)
    caplog.set_level(logging.DEBUG, logger=BOTOCORE_RETRIES)
    calm = SampleSource(url)
    assert torch.equal(calm[0].image, expected.image)
    assert retries_in(caplog) == 0

    stalled = SampleSource(url)
    caplog.clear()
    own_server.pause()
    threading.Timer(1.5, own_server.resume).start()  # botocore: 1 s timeout, then a second try
    sample = stalled[0]
    assert sample.__key__ == expected.__key__ and torch.equal(sample.image, expected.image)
    assert retries_in(caplog) >= 1  # the timed-out request was retried


BOTOCORE_RETRIES = "botocore.retries.standard"


def retries_in(caplog) -> int:
    """How many requests botocore's standard retry mode retried, from its log records."""
    return sum(
        r.name == BOTOCORE_RETRIES and r.getMessage().startswith("Retry needed")
        for r in caplog.records
    )


# --- the converter writes to object storage; a whole train, SIGKILL and resume reads from it ---------------


def _coco(raw, n=20):
    """A raw COCO corpus of ``n`` images (conftest's items) for the converter."""
    import json

    from tests.conftest import _image_item

    (raw / "images").mkdir(parents=True)
    items = [_image_item(i, False) for i in range(n)]
    for key, data, _ in items:
        (raw / "images" / f"{key}.png").write_bytes(data)
    (raw / "captions.json").write_text(
        json.dumps(
            {
                "images": [{"id": int(k), "file_name": f"{k}.png"} for k, _, _ in items],
                "annotations": [
                    {"id": i, "image_id": int(k), "caption": t} for i, (k, _, t) in enumerate(items)
                ],
            }
        )
    )
    return ["--annotations", str(raw / "captions.json"), "--images", str(raw / "images")]


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_convert_to_object_storage_matches_a_local_conversion(
    s3, tmp_path, monkeypatch, capsys, executor
):
    monkeypatch.setenv("ENERGON_PLATFORM_STAGING", str(tmp_path / "staging"))
    args = _coco(tmp_path / "raw")
    url = s3.url(f"converted-{executor}")
    common = ["--samples-per-shard", "8", "--no-progress", "--workers", "2", "--executor", executor]
    assert cli_main(["convert", "coco", *args, "--out", url, *common]) == 0
    assert (
        cli_main(
            [
                "convert",
                "coco",
                *args,
                "--out",
                str(tmp_path / "local"),
                "--samples-per-shard",
                "8",
                "--no-progress",
            ]
        )
        == 0
    )
    remote_batches = [next(TrainLoader(cfg(url))) for _ in range(1)]
    local_batches = [next(TrainLoader(cfg(tmp_path / "local"))) for _ in range(1)]
    assert remote_batches[0].keys == local_batches[0].keys
    assert torch.equal(remote_batches[0].images, local_batches[0].images)
    # identical bytes: the shards on the store are the local conversion's shards
    assert (
        SampleSource(url).identity()["index_uuid"]
        == SampleSource(str(tmp_path / "local")).identity()["index_uuid"]
    )
    before = s3.counters()
    capsys.readouterr()
    assert cli_main(["convert", "coco", *args, "--out", url, *common]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert dict((s3.counters() - before).by_type).get("PUT", 0) == 0, (
        "a finished upload is not sent again"
    )


@pytest.mark.slow
def test_train_killed_and_resumed_on_object_storage_is_bit_exact(s3, tmp_path, monkeypatch):
    import yaml

    from energon_platform.training.resume_check import RunSpec, check_resume

    monkeypatch.setenv("ENERGON_PLATFORM_STAGING", str(tmp_path / "staging"))
    url = s3.url("train-resume")
    assert (
        cli_main(
            [
                "convert",
                "coco",
                *_coco(tmp_path / "raw", 40),
                "--out",
                url,
                "--samples-per-shard",
                "8",
                "--val-fraction",
                "0.2",
                "--no-progress",
            ]
        )
        == 0
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": url},
                "encoder": IMAGE,
                "loader": {
                    "global_batch_size": 4,
                    "num_workers": 2,
                    "seed": 3,
                    "shuffle_buffer": 16,
                    "shuffle_run": 2,
                },
                "model": {"dim": 32, "layers": 1, "heads": 2, "patch": 8},
                "train": {"steps": 8, "checkpoint_every": 3},
            }
        )
    )
    result = check_resume(
        RunSpec(str(config), 8), kill_at=5, out=tmp_path / "check", log=lambda *_: None
    )
    assert result["passed"] and result["resume_step"] == 3, result


def test_opening_an_msc_dataset_lists_its_shards_once_not_one_request_each(s3, remote):
    """The shard check and the length index's stamps read one listing of the shards' folder (a
    LIST request per 1,000 objects), not a request per shard (there were two a shard, 12 here):
    a rank's start-up does not grow by a request a shard."""
    from energon_platform.loader.balance.length_parts import shard_jobs
    from energon_platform.loader.source import _listed

    source = SampleSource(remote)
    before = s3.counters()
    stamps = [job.stamp for job in shard_jobs(source)]  # from the listing read at open
    assert (s3.counters() - before).requests == 0
    shards = len(source.shard_names)
    assert shards == 6 and len(set(stamps)) == shards
    before = s3.counters()
    assert [m.content_length for m in _listed(source._factory.shards)] == [
        int(stamp.split("-")[0]) for stamp in stamps
    ]
    cost = s3.counters() - before
    assert cost.requests < shards and dict(cost.by_type).get("LIST", 0) >= 1, cost
