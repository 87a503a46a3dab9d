"""The length index built ahead of training and stored with the data (`length_store`,
`length_parts`, ``energon-platform index``).

On a text dataset of many small shards: ``index`` stores the index beside the shards, and a
balanced loader on another "node" (another cache folder, another local cache) opens it and writes
nothing into either; a SIGKILLed ``index`` resumes with the shards it finished; a shard rewritten
since is detected and indexed again alone; a dataset that gained shards indexes only those; an
index of another encoder configuration is never read; ``loader.length_index: require`` stops in
one line naming the command and the time it will take; assembling streams (its memory is one
part's, whatever the number of parts); bad input is one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml

from energon_platform import cli
from energon_platform.config import load_config
from energon_platform.loader.balance import length_parts, length_store
from energon_platform.loader.balance.lengths import LengthIndex
from energon_platform.loader.fingerprint import encoder_digest
from energon_platform.loader.run_plan import build_encoder
from energon_platform.loader.source import SampleSource
from storage.paths import DERIVED_FOLDER
from tests.helpers import REPO
from tests.helpers.run_configs import loader_config, write_config

SHARDS, PER_SHARD = 8, 40
TEXT = str(REPO / "configs/encoders/text_small.yaml")


def text_dataset(folder: Path, shards: int = SHARDS) -> Path:
    """A converted text dataset of ``shards`` shards of `PER_SHARD` documents."""
    from converters.convert import ConvertOptions, run_conversion

    manifest = folder / "docs.jsonl"
    folder.mkdir(parents=True, exist_ok=True)
    manifest.write_text(
        "".join(
            json.dumps({"id": f"doc-{i:05d}", "text": "word " * (1 + i % 37) + f"number {i}."})
            + "\n"
            for i in range(shards * PER_SHARD)
        )
    )
    out = folder / "text"
    run_conversion(
        "text",
        {"manifest": str(manifest), "text_column": "text", "id_column": "id", "fmt": None},
        ConvertOptions(out=str(out), samples_per_shard=PER_SHARD, progress=False),
    )
    return out


def balanced_text(folder: Path, data: Path, **loader) -> Path:
    """``folder/run.yaml``: `loader_config` of ``data`` (no validation split) with the small text
    encoder, global batches of 8 balanced by tokens, and ``loader`` keys set."""
    config = loader_config(
        {"path": str(data), "val_split": None},
        TEXT,
        global_batch_size=8,
        balance="tokens",
        **loader,
    )
    return write_config(folder / "run.yaml", config)


def finished_parts(store: Path) -> list[Path]:
    """The shard parts written whole under ``store`` (not a worker's ``.tmp`` file)."""
    return [p for p in store.glob("parts-*/*.npz") if not p.name.startswith(".")]


def index_cli(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main(["index", *map(str, argv)])
    out, err = capsys.readouterr()
    return status, out, err


def opened(config: Path, **overrides):
    cfg = load_config(str(config), overrides)
    encoder = build_encoder(cfg)
    return SampleSource(str(cfg.data.path)), encoder, encoder_digest(encoder), cfg


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> tuple[Path, Path]:
    """A text dataset indexed by the command once: (its run config, the dataset)."""
    base = tmp_path_factory.mktemp("length-store")
    data = text_dataset(base)
    config = balanced_text(base, data)
    assert cli.main(["index", "--config", str(config), "--no-progress"]) == 0
    return config, data


def test_index_stores_it_with_the_data_and_a_loader_elsewhere_builds_nothing(
    indexed, tmp_path, monkeypatch, capsys
):
    from energon_platform.loader.train_loader import TrainLoader

    config, data = indexed
    store = data / DERIVED_FOLDER / "lengths"
    (complete,) = [p.parent for p in store.glob("*/meta.json")]
    assert json.loads((complete / "meta.json").read_text())["samples"] == SHARDS * PER_SHARD
    assert len(finished_parts(store)) == SHARDS
    monkeypatch.setenv("ENERGON_PLATFORM_CACHE", str(tmp_path / "local"))  # another node's
    shared = tmp_path / "shared"
    cfg = load_config(str(config), {"loader.length_cache": str(shared)})
    loader = TrainLoader(cfg, num_workers=0)
    next(loader)
    err = capsys.readouterr().err
    assert "length index" not in err, err
    assert not (tmp_path / "local").exists() and not shared.exists()
    again = index_cli(capsys, "--config", config, "--no-progress")
    assert again[0] == 0 and f"0 of {SHARDS} shards indexed now, {SHARDS} reused" in again[1]


def test_a_killed_index_resumes_with_the_shards_it_finished(tmp_path, capsys):
    data = text_dataset(tmp_path, shards=24)
    config = balanced_text(tmp_path, data)
    parts = data / DERIVED_FOLDER / "lengths"
    slow = tmp_path / "slow.py"  # each shard takes a moment: the kill lands mid-build
    slow.write_text(
        "import sys, time\n"
        "from energon_platform.loader.balance import length_parts\n"
        "index_shard = length_parts.index_shard\n"
        "def slow(job, parts, spec):\n"
        "    time.sleep(0.3)\n"
        "    return index_shard(job, parts, spec)\n"
        "length_parts.index_shard = slow\n"
        "from energon_platform.cli import run\n"
        "sys.argv = ['energon-platform', 'index', '--config', sys.argv[1], '--no-progress']\n"
        "run()\n"
    )
    with subprocess.Popen([sys.executable, str(slow), str(config)], cwd=REPO) as proc:
        deadline = time.time() + 120
        while len(finished_parts(parts)) < 3 and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    kept = len(finished_parts(parts))
    assert 3 <= kept < 24 and not list(parts.glob("*/meta.json")), kept
    status, out, err = index_cli(capsys, "--config", config, "--no-progress")
    assert status == 0 and f"{24 - kept} of 24 shards indexed now, {kept} reused" in out, out + err
    source, encoder, digest, _ = opened(config)
    resumed = LengthIndex(length_store.locate(source, encoder, digest).folder)
    straight = length_store.build(source, encoder, digest, tmp_path / "straight", progress=False)
    fresh = LengthIndex(Path(straight["folder"]))
    assert straight["indexed"] == 24 and len(resumed) == len(fresh) == 24 * PER_SHARD
    assert np.array_equal(resumed._facts, fresh._facts)
    assert [resumed.key(i) for i in range(len(resumed))] == [
        fresh.key(i) for i in range(len(fresh))
    ]


def test_a_shard_rewritten_since_is_indexed_again_alone(tmp_path, capsys):
    data = text_dataset(tmp_path)
    config = balanced_text(tmp_path, data)
    assert index_cli(capsys, "--config", config, "--no-progress")[0] == 0
    shard = data / "train" / "shard-000003.tar"
    later = shard.stat().st_mtime + 60
    os.utime(shard, (later, later))  # a changed file: another modification time
    source, encoder, digest, _ = opened(config)
    found = length_store.locate(source, encoder, digest)
    assert found is not None and not found.fresh
    with pytest.raises(length_store.LengthIndexMissing, match="stale: shards changed"):
        length_store.open_index(source, encoder, digest, require=True)
    status, out, _ = index_cli(capsys, "--config", config, "--no-progress")
    assert status == 0 and f"1 of {SHARDS} shards indexed now, {SHARDS - 1} reused" in out
    assert length_store.locate(source, encoder, digest).fresh


def test_a_dataset_that_gained_shards_indexes_only_those(tmp_path, capsys):
    data = text_dataset(tmp_path)
    split = data / ".nv-meta" / "split.yaml"
    full = split.read_text()
    parts = yaml.safe_load(full)
    parts["split_parts"]["train"] = [f"train/shard-{k:06d}.tar" for k in range(5)]
    split.write_text(yaml.safe_dump(parts))  # the dataset as it was before its last 3 shards
    config = balanced_text(tmp_path, data)
    status, out, _ = index_cli(capsys, "--config", config, "--no-progress")
    assert status == 0 and "0 reused" in out and f"{5 * PER_SHARD} samples" in out
    split.write_text(full)
    status, out, _ = index_cli(capsys, "--config", config, "--no-progress")
    assert status == 0 and f"3 of {SHARDS} shards indexed now, 5 reused" in out, out
    assert len(list((data / DERIVED_FOLDER / "lengths").glob("*/meta.json"))) == 2


def test_an_index_of_another_encoder_configuration_is_never_read(indexed, tmp_path, capsys):
    config, _ = indexed
    _, _, digest, _ = opened(config)
    other_config = tmp_path / "other.yaml"
    encoder_yaml = yaml.safe_load(Path(TEXT).read_text())
    encoder_yaml.setdefault("text", {})["seq_len"] = 64
    (tmp_path / "text_64.yaml").write_text(yaml.safe_dump(encoder_yaml))
    other_config.write_text(
        yaml.safe_dump(
            {
                **yaml.safe_load(config.read_text()),
                "encoder": str(tmp_path / "text_64.yaml"),
                "loader": {
                    "global_batch_size": 8,
                    "num_workers": 0,
                    "balance": "tokens",
                    "length_index": "require",
                },
            }
        )
    )
    other_source, other, other_digest, _ = opened(other_config)
    assert other_digest != digest
    assert length_store.locate(other_source, other, other_digest) is None
    from energon_platform.loader.train_loader import TrainLoader
    from task_encoders.config_parser import ConfigError

    with pytest.raises(ConfigError) as refused:
        TrainLoader(load_config(str(other_config)), num_workers=0)
    line = str(refused.value)
    assert (
        "loader.length_index" in line and f"energon-platform index --config {other_config}" in line
    )
    assert re.search(r"about \d+ s on 1 process", line) and "\n" not in line, line


def assembled_peak(folder: Path, parts: int, per: int = 5000) -> tuple[int, LengthIndex]:
    """Peak traced memory (numpy's included) of assembling ``parts`` parts of ``per`` samples,
    and the index it wrote."""
    store, jobs = folder / "parts", []
    store.mkdir(parents=True)
    for k in range(parts):
        job = length_parts.ShardJob(k, f"train/shard-{k:06d}.tar", k * per, per, "1-1")
        keys = "\n".join(f"key-{k:03d}-{i:06d}" for i in range(per))
        np.savez(
            store / job.part,
            facts=np.full((per, 2), k, np.int32),
            keys=np.frombuffer(keys.encode(), np.uint8),
        )
        jobs.append(job)
    tracemalloc.start()
    length_parts.assemble(folder / "index", store, jobs, 2, {"stamps": []})
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, LengthIndex(folder / "index")


def test_assembling_streams_one_part_at_a_time(tmp_path):
    """The peak memory of assembling 60 parts is that of assembling 10: one part's."""
    few, _ = assembled_peak(tmp_path / "few", 10)
    peak, index = assembled_peak(tmp_path / "many", 60)
    assert len(index) == 60 * 5000 and index.key(59 * 5000 + 7) == "key-059-000007"
    assert index.key(0) == "key-000-000000" and index.facts(3 * 5000) == (3, 3)
    assert peak < 1.2 * few and peak < index.nbytes / 10, (few, peak, index.nbytes)


def test_bad_input_is_one_line(tmp_path, capsys):
    status, _, err = index_cli(capsys, "--config", tmp_path / "missing.yaml")
    assert status == 2 and err.count("\n") == 1 and "missing.yaml" in err
    config = balanced_text(tmp_path, tmp_path / "no-dataset")
    status, _, err = index_cli(capsys, "--config", config)
    assert status == 2 and err.count("\n") == 1 and "no-dataset" in err, err
    status, _, err = index_cli(capsys, "--config", config, "--ray-address", "nowhere")
    assert status == 2 and err.count("\n") == 1


def test_convert_with_an_index_encoder_leaves_the_index_a_loader_opens(tmp_path, capsys):
    from energon_platform.loader.train_loader import TrainLoader

    out = tmp_path / "text"
    argv = ["convert", "text", "--manifest", str(REPO / "data/text_mini/documents.jsonl")]
    argv += ["--id-column", "id", "--out", str(out), "--no-progress", "--index-encoder", TEXT]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "1 of 1 shards indexed now" in printed and str(out / DERIVED_FOLDER) in printed
    config = balanced_text(tmp_path, out, length_index="require")
    next(TrainLoader(load_config(str(config)), num_workers=0))  # require: found, not built
    assert "length index" not in capsys.readouterr().err
    status = cli.main([*argv[:-2], "--overwrite", "--index-encoder", str(tmp_path / "none.yaml")])
    err = capsys.readouterr().err
    assert status == 2 and "--index-encoder" in err and err.count("\n") == 1
    assert (out / DERIVED_FOLDER).is_dir(), "a refused --index-encoder changes nothing"
