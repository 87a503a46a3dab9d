"""The length index is a cache that heals itself (`lengths.check_index`, `length_parts.part_damage`,
`length_store`, ``energon-platform index``).

On copies of one indexed text dataset: a truncated ``facts.i32``, an overwritten ``keys.off`` and a
``meta.json`` that is not JSON are found when the index is opened; ``index`` and a loader under
``loader.length_index: build`` rebuild it (saying which file was damaged, never that the index was
reused), and ``require`` refuses it in one line naming the file and the command that rebuilds it.
A truncated part, and a part whose data no longer reads though its headers do, are indexed again,
never counted as reused. The command a run prints carries the run's overrides the index depends on
(and only those): run as printed, it builds the index the run then opens. The build-time estimate
is a measured rate, not the first samples' cost. ``index`` and ``train`` on a conversion that wrote
no sample say so, not "convert it"."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from energon_platform import cli
from energon_platform.config import config_dict, load_config
from energon_platform.loader.balance import length_store
from energon_platform.loader.balance.index_command import INDEX_KEYS, index_command
from energon_platform.loader.balance.lengths import LengthIndex, index_damage
from energon_platform.loader.train_loader import TrainLoader
from tests.helpers.cli import one_line_error, one_line_error_in_process, run_cli
from tests.loader.test_length_store import (
    PER_SHARD,
    SHARDS,
    TEXT,
    balanced_text,
    finished_parts,
    opened,
    text_dataset,
)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> Path:
    """A text dataset indexed once, its index stored with it: tests damage copies of it."""
    base = tmp_path_factory.mktemp("length-heals")
    data = text_dataset(base)
    assert cli.main(["index", "--config", str(balanced_text(base, data)), "--no-progress"]) == 0
    return data


def copied(indexed: Path, tmp_path: Path, **loader) -> tuple[Path, Path, Path]:
    """A copy of ``indexed`` (its shards' stamps kept, so its index is fresh) and a run config of
    it: ``(config, data, the index's folder)``."""
    data = tmp_path / "text"
    shutil.copytree(indexed, data)
    (index,) = [p.parent for p in (data / length_store.WITH_DATA).glob("*/meta.json")]
    return balanced_text(tmp_path, data, **loader), data, index


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def zero_the_last_offset(index: Path) -> None:
    """``keys.off`` of its size, its last offset overwritten: the keys' end it names is wrong."""
    with open(index / "keys.off", "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(bytes(8))


#: a damage of an index: the file it names, and how it is made
DAMAGES = {
    "facts.i32 truncated": ("facts.i32", lambda index: truncate(index / "facts.i32", 100)),
    "keys.off overwritten": ("keys.off", zero_the_last_offset),
    "meta.json not JSON": ("meta.json", lambda index: (index / "meta.json").write_text('{"st')),
}


def whole(index: Path) -> tuple[np.ndarray, list[str]]:
    """The facts and keys of the index ``index``, read whole."""
    opened_index = LengthIndex(index)
    return np.array(opened_index._facts), [opened_index.key(i) for i in range(len(opened_index))]


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_index_rebuilds_a_damaged_index_and_says_so(indexed, tmp_path, damage):
    config, _, index = copied(indexed, tmp_path)
    name, make = DAMAGES[damage]
    before = whole(index)
    make(index)
    assert index_damage(index) is not None and str(index / name) in index_damage(index)
    r = run_cli("index", "--config", config, "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"damaged, rebuilt: {index / name}" in r.stdout, r.stdout
    assert index_damage(index) is None
    after = whole(index)
    assert np.array_equal(after[0], before[0]) and after[1] == before[1]
    again = run_cli("index", "--config", config, "--no-progress")
    assert f"0 of {SHARDS} shards indexed now, {SHARDS} reused" in again.stdout
    assert "damaged, rebuilt" not in again.stdout, again.stdout


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_require_refuses_a_damaged_index_in_one_line_naming_the_file_and_the_command(
    indexed, tmp_path, damage
):
    config, _, index = copied(indexed, tmp_path)
    name, make = DAMAGES[damage]
    make(index)
    out = tmp_path / "run"
    r = run_cli(
        "train", "--config", config, "--out", out, "--steps", 1,
        "--set", "loader.length_index=require", timeout=300,
    )  # fmt: skip
    line = one_line_error(
        r, "loader.length_index", f"damaged: {index / name}", f"`energon-platform index --config {config}` rebuilds it"
    )  # fmt: skip
    assert "reused" not in line and not out.exists()


@pytest.mark.parametrize("damage", ["facts.i32 truncated", "meta.json not JSON"])
def test_a_loader_under_build_rebuilds_a_damaged_index_at_start(indexed, tmp_path, capsys, damage):
    config, _, index = copied(indexed, tmp_path)
    name, make = DAMAGES[damage]
    before = whole(index)
    make(index)
    next(TrainLoader(load_config(str(config)), num_workers=0))
    err = capsys.readouterr().err
    assert f"damaged: {index / name}" in err and "(rebuilding it now)" in err, err
    after = whole(index)
    assert np.array_equal(after[0], before[0]) and after[1] == before[1]


def test_a_truncated_part_is_indexed_again_by_index_not_reused(indexed, tmp_path):
    """The index itself is whole: ``index`` still finds the part its next build would reuse."""
    config, data, _ = copied(indexed, tmp_path)
    part = sorted(finished_parts(data / length_store.WITH_DATA))[3]
    truncate(part, 500)
    r = run_cli("index", "--config", config, "--no-progress")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"1 of {SHARDS} shards indexed now, {SHARDS - 1} reused" in r.stdout, r.stdout
    assert f"damaged, rebuilt: {part}" in r.stdout
    with np.load(part) as z:
        assert z["facts"].shape == (PER_SHARD, 1)


def test_a_truncated_part_under_a_stale_index_is_indexed_again_at_a_loaders_start(
    indexed, tmp_path, capsys
):
    config, data, index = copied(indexed, tmp_path)
    part = sorted(finished_parts(data / length_store.WITH_DATA))[5]
    truncate(part, 500)
    shard = data / "train" / "shard-000002.tar"
    later = shard.stat().st_mtime + 60
    os.utime(shard, (later, later))  # its part is named by the new stamp: indexed again too
    next(TrainLoader(load_config(str(config)), num_workers=0))
    assert "stale: shards changed" in capsys.readouterr().err
    source, encoder, digest, _ = opened(config)
    assert length_store.locate(source, encoder, digest).fresh
    with np.load(part) as z:
        assert z["facts"].shape == (PER_SHARD, 1)


def test_a_part_whose_data_does_not_read_is_indexed_again_when_assembled(
    indexed, tmp_path, monkeypatch
):
    """A part large enough that reading its headers does not read its arrays: its damage is met
    when the index is assembled, and that shard is indexed again."""
    config, data, index = copied(indexed, tmp_path)
    before = whole(index)
    part = sorted(finished_parts(data / length_store.WITH_DATA))[4]
    with np.load(part) as z:
        facts = z["facts"].tobytes()
    raw = bytearray(part.read_bytes())
    at = raw.find(facts)
    raw[at] ^= 0xFF  # a fact changed: the member's CRC no longer matches
    part.write_bytes(raw)
    (index / "meta.json").unlink()  # the index is assembled again
    monkeypatch.setattr(length_store, "part_damage", lambda path, job, width: None)
    source, encoder, digest, _ = opened(config)
    stats = length_store.build(
        source, encoder, digest, data / length_store.WITH_DATA, progress=False
    )
    assert stats["indexed"] == 1 and stats["reused"] == SHARDS - 1, stats
    assert len(stats["damaged"]) == 1 and str(part) in stats["damaged"][0], stats["damaged"]
    after = whole(index)
    assert np.array_equal(after[0], before[0]) and after[1] == before[1]


def test_the_printed_command_builds_the_index_the_run_needs(indexed, tmp_path):
    """A run with ``--set`` overrides that needs another index: the command it prints carries the
    overrides the index depends on, and no other; run as printed, it builds what the run opens."""
    config, data, _ = copied(indexed, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(data, elsewhere, ignore=shutil.ignore_patterns(length_store.WITH_DATA.parts[0]))
    cache = tmp_path / "shared cache"
    run_sets = {
        "data.path": str(elsewhere),
        "loader.length_cache": str(cache),
        "loader.length_index": "require",
        "train.steps": 2,
    }
    sets = [w for key, value in run_sets.items() for w in ("--set", f"{key}={value}")]
    r = run_cli("train", "--config", config, "--out", tmp_path / "run", *sets, timeout=300)
    line = one_line_error(r, "none found")
    argv = shlex.split(re.search(r"`(energon-platform index [^`]*)`", line).group(1))
    assert argv == [
        "energon-platform", "index", "--config", str(config),
        "--set", f"data.path={elsewhere}", "--set", f"loader.length_cache={cache}",
    ]  # fmt: skip
    built = run_cli(*argv[1:], "--no-progress")
    assert built.returncode == 0 and str(elsewhere) in built.stdout, built.stderr[-2000:]
    loader = TrainLoader(load_config(str(config), run_sets), num_workers=0)  # require: found
    next(loader)


def test_the_command_sets_a_changed_inline_encoder_key_and_reads_back_as_the_run(tmp_path):
    encoder = yaml.safe_load(Path(TEXT).read_text())
    written = {
        "data": {"path": str(tmp_path / "data"), "val_split": None},
        "encoder": encoder,
        "loader": {"global_batch_size": 8, "balance": "tokens"},
    }
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(written))
    run_sets = {"encoder.text.seq_len": 64, "data.train_split": "val", "loader.seed": 9}
    cfg = load_config(str(config), run_sets)
    command = index_command(cfg)
    argv = shlex.split(command)
    assert argv[4:] == ["--set", "data.train_split=val", "--set", "encoder.text.seq_len=64"]
    sets = dict(pair.split("=", 1) for pair in argv[5::2])
    again = config_dict(load_config(str(config), {k: yaml.safe_load(v) for k, v in sets.items()}))
    for key in INDEX_KEYS:
        section, name = key.split(".") if "." in key else (key, None)
        ran = config_dict(cfg)[section]
        assert (again[section] if name is None else again[section][name]) == (
            ran if name is None else ran[name]
        ), key
    assert index_command(load_config(str(config))) == f"energon-platform index --config {config}"


class _FirstSlow:
    """An encoder whose first sample takes half a second (a tokenizer loading) and each other 2 ms."""

    def __init__(self):
        self.calls = 0

    def sample_facts(self, sample):
        self.calls += 1
        time.sleep(0.5 if self.calls == 1 else 0.002)
        return (1,)


class _Samples:
    """A dataset of 100,000 samples in 50 shards (`light_sample` patched to give the index)."""

    path = "nowhere"

    class _factory:  # noqa: N801 (the attribute SampleSource has)
        shards = [None] * 50

    def __len__(self) -> int:
        return 100_000


@pytest.mark.parametrize("workers,cores", [(1, 16), (8, 2)])
def test_the_build_time_estimate_is_a_measured_rate(monkeypatch, workers, cores):
    """200 s of samples on 1 process (100 on 2): the estimate is that, not the first sample's
    half second taken for every sample's cost (29 min), and more processes than cores do not
    divide it further."""
    monkeypatch.setattr(length_store, "light_sample", lambda source, i: i)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    said = length_store.estimate(_Samples(), _FirstSlow(), workers)
    found = re.fullmatch(r"(\d+) min on (\d+) process(es)?", said)
    assert found and int(found.group(2)) == workers, said
    parallel = min(workers, cores)
    assert 3 / parallel - 1 <= int(found.group(1)) <= 10 / parallel, said


def test_a_conversion_that_wrote_no_sample_is_named_so_not_sent_to_convert(tmp_path, capsys):
    from converters.convert import ConvertOptions, run_conversion

    manifest = tmp_path / "docs.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"d{i}", "text": ""}) + "\n" for i in range(3)))
    out = tmp_path / "text"
    outcome = run_conversion(
        "text",
        {"manifest": str(manifest), "text_column": "text", "id_column": "id", "fmt": None},
        ConvertOptions(out=str(out), progress=False),
    )
    assert not outcome.ok and (out / "report.json").is_file()
    config = balanced_text(tmp_path, out)
    needles = (str(out), "wrote no sample", "empty_text 3", "report.json")
    line = one_line_error(run_cli("index", "--config", config), *needles)
    assert "convert it" not in line
    argv = ["train", "--config", config, "--out", tmp_path / "run", "--steps", 1]
    assert "convert it" not in one_line_error_in_process(capsys, argv, *needles)


def test_a_published_index_of_the_wrong_sizes_is_refused_naming_it_and_built_again(
    s3, make_dataset, tmp_path, monkeypatch, capsys
):
    """A dataset on object storage: its published ``facts.i32`` replaced by a shorter one. Another
    node under ``require`` refuses it naming that object; under ``build`` it builds the index in
    its cache and publishes it again, whole."""
    from megatron.energon.epathlib import EPath

    from converters.remote import upload_dataset, upload_file
    from task_encoders.config_parser import ConfigError

    remote = s3.url("heals")
    upload_dataset(make_dataset("image_text", n=16), remote)
    image = str(Path(TEXT).parent / "image_text_small.yaml")
    run = {"data": {"path": remote, "val_split": None}, "encoder": image}
    run["loader"] = {"global_batch_size": 8, "num_workers": 0, "balance": "attention"}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run))
    monkeypatch.setenv("ENERGON_PLATFORM_CACHE", str(tmp_path / "builder"))
    assert cli.main(["index", "--config", str(config), "--no-progress"]) == 0
    published = capsys.readouterr().out.split("index: ")[1].split()[0]
    built = tmp_path / "builder" / "lengths" / published.rsplit("/", 1)[1]
    short = tmp_path / "short.i32"
    short.write_bytes((built / "facts.i32").read_bytes()[:-4])
    upload_file(str(short), f"{published}/facts.i32")
    monkeypatch.setenv("ENERGON_PLATFORM_CACHE", str(tmp_path / "other-node"))
    with pytest.raises(ConfigError) as refused:
        TrainLoader(load_config(str(config), {"loader.length_index": "require"}), num_workers=0)
    line = str(refused.value)
    assert f"damaged: {published}/facts.i32" in line and "\n" not in line, line
    assert f"`energon-platform index --config {config}` rebuilds it" in line
    next(TrainLoader(load_config(str(config)), num_workers=0))
    assert "(rebuilding it now)" in capsys.readouterr().err
    assert EPath(f"{published}/facts.i32").size() == (built / "facts.i32").stat().st_size
