"""Converters: every source kind, every bad-input kind, determinism, resume, read-back."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from PIL import Image

from converters.convert import ConvertError, ConvertOptions, reason_counts, run_conversion
from converters.media import ImageOptions
from converters.readers import InputError
from converters.records import KEY_PATTERN, make_key
from tests.helpers.cli import cli_argv, run_cli
from tests.helpers.corpora import (
    caption,
    image_bytes,
    make_coco,
    make_image_files,
    make_librispeech,
    tone_bytes,
)


def convert(kind, out, progress=False, **kw):
    reader_args = kw.pop("reader")
    return run_conversion(kind, reader_args, ConvertOptions(out=str(out), progress=progress, **kw))


def members(out: Path) -> dict[str, bytes]:
    """All tar members of all shards, by shard/member name."""
    found = {}
    for tar in sorted(out.glob("*/shard-*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                found[f"{tar.parent.name}/{m.name}"] = tf.extractfile(m).read()
    return found


def tree_digest(out: Path) -> dict[str, bytes]:
    """Every output file except the per-unit bookkeeping, by relative path."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".convert" not in p.parts
    }


def stamps(out: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every shard: a rewritten shard gets another one."""
    return {
        str(p.relative_to(out)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(out.glob("*/shard-*.tar"))
    }


# ---------------------------------------------------------------- keys


def test_make_key_is_safe_stable_and_injective():
    assert make_key("84-121123-0000") == "84-121123-0000"
    a, b = make_key("a.b"), make_key("a_b")
    assert a != b and KEY_PATTERN.match(a) and "." not in a
    # pinned: keys are stable across versions
    assert make_key("dir/sub dir/img.v2") == "dir_sub_dir_img_v2-dc8db90a"
    assert KEY_PATTERN.match(make_key("ünïcödé/…"))


# ---------------------------------------------------------------- source kinds


def test_coco_all_captions_provenance_and_energon_readback(tmp_path):
    ann, images, _ = make_coco(tmp_path / "raw", n_good=12)
    out = tmp_path / "out"
    outcome = convert(
        "coco",
        out,
        reader={"annotations": str(ann), "images": str(images)},
        samples_per_shard=5,
        val_fraction=0.25,
    )
    rep = outcome.report
    assert outcome.ok and rep["totals"] == {
        "seen": 12,
        "written": 12,
        "skipped": 0,
        "skipped_fraction": 0.0,
    }
    assert rep["splits"]["train"]["samples"] + rep["splits"]["val"]["samples"] == 12
    assert rep["splits"]["val"]["samples"] > 0
    m = members(out)
    doc = json.loads(m.get("train/000000000001.text.json") or m["val/000000000001.text.json"])
    assert doc["caption"] == caption(1) and doc["captions"] == [caption(1), "picture 1"]
    assert doc["source"]["id"] == "1" and doc["source"]["file"] == "img_0001.png"
    assert (doc["source"]["width"], doc["source"]["height"]) == (40, 32)
    assert all(KEY_PATTERN.match(name.split("/")[1].split(".")[0]) for name in m)

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    wc = WorkerConfig(rank=0, world_size=1, num_workers=0)
    ds = get_train_dataset(
        out,
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=wc,
    )
    seen = {}
    for s in get_loader(ds):
        if s.__key__ in seen:
            break
        seen[s.__key__] = s
    assert len(seen) == rep["splits"]["train"]["samples"]
    s = next(iter(seen.values()))
    assert (
        s.image.shape == (3, 32, 40)
        and s.image.dtype.is_floating_point
        and isinstance(s.caption, str)
    )


def test_folder_with_txt_and_json_sidecars(tmp_path):
    root = tmp_path / "raw"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.one.png").write_bytes(image_bytes(1))
    (root / "a" / "x.one.txt").write_text("first caption\n\nsecond caption\n")
    (root / "b.jpg").write_bytes(image_bytes(2, fmt="JPEG"))
    (root / "b.json").write_text(json.dumps({"captions": ["json caption"]}))
    (root / "c.png").write_bytes(image_bytes(3))  # no sidecar
    (root / "d.png").write_bytes(image_bytes(4))
    (root / "d.txt").write_bytes(b"caf\xe9 latin-1")  # not UTF-8
    out = tmp_path / "out"
    outcome = convert("folder", out, reader={"root": str(root)}, max_error_fraction=0.6)
    assert reason_counts(outcome.report) == {"empty_text": 1, "invalid_utf8": 1}
    m = members(out)
    texts = {
        k.split("/")[1].split(".")[0]: json.loads(v)
        for k, v in m.items()
        if k.endswith("text.json")
    }
    assert sorted(t["captions"][0] for t in texts.values()) == ["first caption", "json caption"]
    key = make_key("a/x.one")
    assert texts[key]["captions"] == ["first caption", "second caption"] and "." not in key


def test_hidden_files_and_file_manager_folders_are_not_part_of_a_folder_corpus(tmp_path):
    """``.thumbnails/``, ``@eaDir/``, ``.x.jpg`` and macOS's ``._x.jpg`` became samples or errors."""
    root = tmp_path / "raw"
    for folder in ("", ".thumbnails/", "@eaDir/a.png/", "__MACOSX/"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "a.png").write_bytes(image_bytes(1))
    (root / "a.txt").write_text("a caption")
    (root / ".x.png").write_bytes(image_bytes(2))
    (root / ".x.txt").write_text("a hidden caption")
    (root / "._a.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")  # macOS metadata, no picture
    (root / ".thumbnails" / "a.png").write_bytes(image_bytes(3))
    (root / ".thumbnails" / "a.txt").write_text("a thumbnail")
    (root / "@eaDir" / "a.png" / "SYNOFILE_THUMB_M.jpg").write_bytes(image_bytes(4, fmt="JPEG"))
    (root / "__MACOSX" / "._a.png").write_bytes(b"\x00\x05\x16\x07")
    outcome = convert("folder", tmp_path / "out", reader={"root": str(root)})
    assert reason_counts(outcome.report) == {} and outcome.report["totals"]["seen"] == 1


def test_a_converted_dataset_given_as_the_input_is_named_so_not_empty(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    (root / "a.png").write_bytes(image_bytes(1))
    (root / "a.txt").write_text("a caption")
    convert("folder", tmp_path / "out", reader={"root": str(root)})
    with pytest.raises(InputError, match="out: a converted dataset already"):
        convert("folder", tmp_path / "again", reader={"root": str(tmp_path / "out")})


def test_folder_file_name_not_utf8_is_skipped_with_its_reason_and_the_rest_written(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    (root / "good.jpg").write_bytes(image_bytes(1, fmt="JPEG"))
    (root / "good.txt").write_text("a good caption\n")
    bad = os.path.join(os.fsencode(root), b"caf\xe9")
    Path(os.fsdecode(bad + b".jpg")).write_bytes(image_bytes(2, fmt="JPEG"))
    Path(os.fsdecode(bad + b".txt")).write_text("a caption\n")
    out = tmp_path / "out"
    r = run_cli(
        "convert",
        "folder",
        "--root",
        root,
        "--out",
        out,
        "--no-progress",
        "--max-error-fraction",
        "0.6",
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "invalid_file_name: 1 (e.g. caf\\xe9)" in r.stdout, r.stdout
    [skipped] = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert (skipped["reason"], skipped["id"]) == (
        "invalid_file_name",
        "caf\\xe9",
    ) and "rename" in skipped["detail"]
    assert [name.split(".")[0] for name in members(out)] == ["train/good", "train/good"]


def test_caption_of_another_type_or_with_lone_surrogates_is_named_not_called_empty(tmp_path):
    root = tmp_path / "raw"
    rels = make_image_files(root, 5)
    rows = [
        '{"path": "%s", "caption": "fine", "uid": "ok"}' % rels[0],
        '{"path": "%s", "caption": 123, "uid": "number"}' % rels[1],
        '{"path": "%s", "caption": ["a", {"b": 1}], "uid": "object"}' % rels[2],
        '{"path": "%s", "caption": "bad \\ud800", "uid": "surrogate"}' % rels[3],
        '{"path": "%s", "caption": "fine", "uid": "caf\\udce9"}' % rels[4],
    ]
    (root / "m.jsonl").write_text("\n".join(rows) + "\n")
    (root / "side").mkdir()
    (root / "side" / "x.png").write_bytes(image_bytes(9))
    (root / "side" / "x.json").write_text(json.dumps({"caption": 123}))
    out = convert(
        "manifest",
        tmp_path / "out",
        reader={"manifest": str(root / "m.jsonl"), "image_column": "path", "id_column": "uid"},
        max_error_fraction=0.9,
    )
    by_id = {
        p["id"]: p
        for p in map(json.loads, (tmp_path / "out" / "skipped.jsonl").read_text().splitlines())
    }
    assert {k: p["reason"] for k, p in by_id.items()} == {
        "number": "malformed_line",
        "object": "malformed_line",
        "surrogate": "invalid_utf8",
        "caf\\xe9": "invalid_utf8",
    }
    assert "'caption' holds int 123, not a string" in by_id["number"]["detail"]
    assert "holds dict" in by_id["object"]["detail"] and out.report["totals"]["written"] == 1
    convert(
        "folder", tmp_path / "side_out", reader={"root": str(root / "side")}, max_error_fraction=1.0
    )
    [skipped] = map(json.loads, (tmp_path / "side_out" / "skipped.jsonl").read_text().splitlines())
    assert (
        skipped["reason"] == "malformed_line"
        and "x.json: 'caption' holds int 123" in skipped["detail"]
    )


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_manifest_formats_with_paths(tmp_path, fmt):
    root = tmp_path / "raw"
    rels = make_image_files(root, 6)
    rows = [{"path": r, "text": caption(i), "uid": f"u{i}"} for i, r in enumerate(rels)]
    path = root / f"m.{fmt}"
    if fmt == "jsonl":
        lines = [json.dumps(r) for r in rows] + ["{not json", json.dumps({"path": rels[0]})]
        path.write_text("\n".join(lines) + "\n")
        expected = {"malformed_line": 1, "empty_text": 1}
    elif fmt in ("csv", "tsv"):
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, ["path", "text", "uid"], delimiter="," if fmt == "csv" else "\t")
            w.writeheader()
            w.writerows(rows)
        expected = {}
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
        expected = {}
    out = tmp_path / "out"
    outcome = convert(
        "manifest",
        out,
        reader={
            "manifest": str(path),
            "image_column": "path",
            "text_column": "text",
            "id_column": "uid",
        },
        max_error_fraction=0.5,
    )
    assert reason_counts(outcome.report) == expected
    assert outcome.report["totals"]["written"] == 6
    assert {k.split("/")[1].split(".")[0] for k in members(out)} == {f"u{i}" for i in range(6)}


def test_manifest_parquet_image_bytes_hf_style(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "jpg": {"bytes": image_bytes(i, fmt="JPEG"), "path": f"{i}.jpg"},
            "caption": [caption(i), "alt"],
        }
        for i in range(7)
    ]
    rows.append({"jpg": {"bytes": b"garbage", "path": "x.jpg"}, "caption": ["bad"]})
    path = tmp_path / "laion.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    out = tmp_path / "out"
    outcome = convert(
        "manifest",
        out,
        reader={"manifest": str(path), "image_column": "jpg", "text_column": "caption"},
        max_error_fraction=0.2,
    )
    assert reason_counts(outcome.report) == {"not_an_image": 1}
    m = members(out)
    assert len([k for k in m if k.endswith(".image.png")]) == 7
    assert json.loads(m["train/row-000000003.text.json"])["captions"] == [caption(3), "alt"]


def test_librispeech_and_energon_audio_readback(tmp_path):
    root, _ = make_librispeech(tmp_path / "ls")
    out = tmp_path / "out"
    outcome = convert("librispeech", out, reader={"root": str(root)}, samples_per_shard=4)
    assert outcome.ok and outcome.report["totals"]["written"] == 12
    m = members(out)
    doc = json.loads(m["train/19-198-0001.text.json"])
    assert doc["text"] == "TONE NUMBER 1"
    assert doc["source"]["sample_rate"] == 16000 and doc["source"]["speaker"] == "19"
    assert abs(doc["source"]["duration"] - 0.3) < 1e-3
    assert m["train/19-198-0001.audio.flac"] == (root / "19/198/19-198-0001.flac").read_bytes()

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    ds = get_train_dataset(
        out,
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    s = next(iter(get_loader(ds)))
    assert type(s).__name__ == "AudioTextSample" and s.text.startswith("TONE NUMBER")
    clip = s.audio.get_audio().audio_clips[0]
    assert clip.shape[-1] == 4800


def test_audio_manifest_reencodes_wav_to_flac_or_keeps(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    lines = []
    for i in range(4):
        (root / f"a{i}.wav").write_bytes(tone_bytes(i, fmt="wav"))
        lines.append(
            json.dumps({"audio_filepath": f"a{i}.wav", "text": f"tone {i}", "duration": 0.3})
        )
    (root / "m.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "flac"
    convert("audio-manifest", out, reader={"manifest": str(root / "m.jsonl")})
    m = members(out)
    assert sorted(k for k in m if "audio" in k) == [f"train/a{i}.audio.flac" for i in range(4)]
    import av

    with av.open(io.BytesIO(m["train/a2.audio.flac"])) as c:
        assert sum(f.samples for f in c.decode(audio=0)) == 4800
    from converters.media import AudioOptions

    out2 = tmp_path / "keep"
    convert(
        "audio-manifest",
        out2,
        reader={"manifest": str(root / "m.jsonl")},
        audio=AudioOptions("keep"),
    )
    assert members(out2)["train/a0.audio.wav"] == (root / "a0.wav").read_bytes()


# ---------------------------------------------------------------- media options


def test_exif_orientation_applied_and_keep_format(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    (root / "rot.jpg").write_bytes(image_bytes(1, size=(40, 20), fmt="JPEG", exif_orientation=6))
    (root / "rot.txt").write_text("rotated")
    (root / "big.png").write_bytes(image_bytes(2, size=(200, 100)))
    (root / "big.txt").write_text("big")
    out = tmp_path / "png"
    convert("folder", out, reader={"root": str(root)}, image=ImageOptions(max_side=50))
    m = members(out)
    assert Image.open(io.BytesIO(m["train/rot.image.png"])).size == (20, 40)  # transposed
    assert Image.open(io.BytesIO(m["train/big.image.png"])).size == (50, 25)
    out = tmp_path / "keep"
    convert("folder", out, reader={"root": str(root)}, image=ImageOptions("keep"))
    m = members(out)
    assert m["train/rot.image.jpg"] == (root / "rot.jpg").read_bytes()
    ds_yaml = (out / ".nv-meta" / "dataset.yaml").read_text()
    assert "sample_loader" in ds_yaml  # jpg and png parts: needs the generated loader

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    ds = get_train_dataset(
        out,
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    it = iter(get_loader(ds))
    shapes = {tuple(next(it).image.shape) for _ in range(2)}
    assert shapes == {(3, 40, 20), (3, 100, 200)} or shapes == {(3, 20, 40), (3, 100, 200)}


def test_decompression_bomb_rejected(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    for i, size in enumerate([(30, 30), (300, 300)]):
        (root / f"{i}.png").write_bytes(image_bytes(i, size=size))
        (root / f"{i}.txt").write_text("x")
    outcome = convert(
        "folder",
        tmp_path / "out",
        reader={"root": str(root)},
        image=ImageOptions(max_pixels=10_000),
        max_error_fraction=0.5,
    )
    assert reason_counts(outcome.report) == {"decompression_bomb": 1}


# ---------------------------------------------------------------- bad input


def test_every_bad_image_kind_is_counted_and_listed(tmp_path):
    ann, images, expected = make_coco(tmp_path / "raw", n_good=60, bad=True)
    out = tmp_path / "out"
    outcome = convert("coco", out, reader={"annotations": str(ann), "images": str(images)})
    assert outcome.ok  # 6 of 66 skipped: under the default 10%
    assert reason_counts(outcome.report) == expected
    assert outcome.report["totals"]["written"] == 60
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert sorted(p["reason"] for p in skipped) == sorted(
        r for r, n in expected.items() for _ in range(n)
    )
    assert outcome.report["skipped_by_reason"]["missing_file"]["examples"] == ["1004"]


def test_every_bad_audio_kind_is_counted(tmp_path):
    root, expected = make_librispeech(tmp_path / "ls", bad=True)
    outcome = convert(
        "librispeech", tmp_path / "out", reader={"root": str(root)}, max_error_fraction=0.5
    )
    assert reason_counts(outcome.report) == expected
    assert outcome.report["totals"]["written"] == 12


def test_error_fraction_exit_status_and_usage_errors(tmp_path):
    ann, images, _ = make_coco(tmp_path / "raw", n_good=4, bad=True)  # 6 of 10 bad
    r = run_cli(
        "convert",
        "coco",
        "--annotations",
        ann,
        "--images",
        images,
        "--out",
        tmp_path / "o",
        "--no-progress",
    )
    assert r.returncode == 1 and "exceeds --max-error-fraction" in r.stdout
    assert (tmp_path / "o" / "report.json").is_file()
    r = run_cli(
        "convert",
        "coco",
        "--annotations",
        tmp_path / "nope.json",
        "--images",
        images,
        "--out",
        tmp_path / "p",
    )
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli("convert", "coco", "--images", images, "--out", tmp_path / "p")
    assert r.returncode == 2 and "--annotations" in r.stderr
    r = run_cli(
        "convert", "folder", "--root", images, "--out", tmp_path / "p", "--val-fraction", "2"
    )
    assert r.returncode == 2 and "[0, 1]" in r.stderr
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    r = run_cli(
        "convert", "coco", "--annotations", bad_json, "--images", images, "--out", tmp_path / "q"
    )
    assert (
        r.returncode == 2 and "not a COCO captions file" in r.stderr and "Traceback" not in r.stderr
    )


# ---------------------------------------------------------------- determinism and resume


@pytest.fixture(scope="module")
def coco60(tmp_path_factory):
    return make_coco(tmp_path_factory.mktemp("coco60"), n_good=60, bad=True)


def test_same_bytes_for_any_worker_count(tmp_path, coco60):
    ann, images, _ = coco60
    digests = []
    for w in (1, 2):
        out = tmp_path / f"w{w}"
        convert(
            "coco",
            out,
            reader={"annotations": str(ann), "images": str(images)},
            samples_per_shard=6,
            val_fraction=0.2,
            workers=w,
        )
        digests.append(tree_digest(out))
    assert digests[0] == digests[1]
    assert any(k.endswith(".tar") for k in digests[0]) and ".nv-meta/index.sqlite" in digests[0]


@pytest.mark.slow
def test_ray_executor_same_bytes_as_local(tmp_path, coco60):
    ann, images, _ = coco60
    local, ray_out = tmp_path / "local", tmp_path / "ray"
    args = [
        "convert",
        "coco",
        "--annotations",
        ann,
        "--images",
        images,
        "--samples-per-shard",
        6,
        "--val-fraction",
        0.2,
        "--no-progress",
    ]
    assert run_cli(*args, "--out", local).returncode == 0
    r = run_cli(*args, "--out", ray_out, "--executor", "ray", "--workers", 2, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert tree_digest(local) == tree_digest(ray_out)


def test_rerun_does_nothing_and_other_input_is_refused(tmp_path, coco60):
    ann, images, _ = coco60
    out = tmp_path / "out"
    reader = {"annotations": str(ann), "images": str(images)}
    convert("coco", out, reader=reader)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = convert("coco", out, reader=reader)
    assert again.already_done and before == {
        p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()
    }
    r = run_cli(
        "convert", "coco", "--annotations", ann, "--images", images, "--out", out, "--no-progress"
    )
    assert r.returncode == 0 and "nothing to do" in r.stdout
    with pytest.raises(ConvertError, match="another set of options"):
        convert("coco", out, reader=reader, samples_per_shard=7)
    r = run_cli(
        "convert",
        "coco",
        "--annotations",
        ann,
        "--images",
        images,
        "--out",
        out,
        "--samples-per-shard",
        7,
    )
    assert r.returncode == 2 and "--overwrite" in r.stderr
    ok = convert("coco", out, reader=reader, samples_per_shard=7, overwrite=True)
    assert not ok.already_done and len(list(out.glob("train/*.tar"))) == 9
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(ConvertError, match="not empty"):
        convert("coco", foreign, reader=reader, overwrite=True)
    assert (foreign / "precious.txt").exists()


def test_missing_input_raises_input_error(tmp_path):
    with pytest.raises(InputError):
        convert("librispeech", tmp_path / "o", reader={"root": str(tmp_path / "absent")})


def assert_kill_and_rerun_is_byte_identical(
    args: list, tmp_path: Path, kill_after_units: int, total_units: int
) -> None:
    """Convert with ``args`` straight through, and again with a SIGKILL once ``kill_after_units``
    work units are done, then rerun: the output must equal the uninterrupted one byte for byte."""
    ref = tmp_path / "ref"
    assert run_cli(*args, "--out", ref).returncode == 0
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        cli_argv(*args, "--out", out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    units = out / ".convert" / "units"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(units.glob("*.json"))) < kill_after_units:
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_at_kill = len(list(units.glob("*.json")))
    assert kill_after_units <= done_at_kill < total_units, (
        "the kill must land in the middle of the conversion"
    )
    assert not (out / "report.json").exists()
    r = run_cli(*args, "--out", out)
    assert r.returncode == 0, r.stderr
    assert tree_digest(out) == tree_digest(ref)
    assert not list(out.rglob("*.tmp"))


@pytest.mark.slow
def test_sigkill_then_rerun_is_byte_identical(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    for i in range(240):
        (root / f"{i:04d}.png").write_bytes(image_bytes(i, size=(160, 120)))
        (root / f"{i:04d}.txt").write_text(caption(i))
    args = [
        "convert",
        "folder",
        "--root",
        root,
        "--samples-per-shard",
        3,
        "--no-progress",
        "--val-fraction",
        0.1,
    ]
    assert_kill_and_rerun_is_byte_identical(args, tmp_path, kill_after_units=10, total_units=80)


def test_energon_info_and_our_info_describe_the_output(tmp_path, coco60):
    import shutil

    ann, images, _ = coco60
    out = tmp_path / "out"
    convert("coco", out, reader={"annotations": str(ann), "images": str(images)}, val_fraction=0.2)
    energon = shutil.which("energon", path=str(Path(sys.executable).parent))
    r = subprocess.run([energon, "info", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "CaptioningSample" in r.stdout and "60 samples" in r.stdout
    r = run_cli("info", out)
    assert r.returncode == 0 and "sample type: CaptioningSample" in r.stdout
    assert "skipped missing_file: 1" in r.stdout and "train:" in r.stdout and "val:" in r.stdout
    r = run_cli("info", tmp_path / "nothing")
    assert r.returncode == 2 and f"{tmp_path / 'nothing'}: no such file or folder" in r.stderr
    (tmp_path / "plain").mkdir()
    r = run_cli("info", tmp_path / "plain")
    assert r.returncode == 2 and "not an Energon dataset" in r.stderr


def test_plain_webdataset_reads_the_shards(tmp_path, coco60):
    import webdataset as wds

    ann, images, _ = coco60
    out = tmp_path / "out"
    convert(
        "coco", out, reader={"annotations": str(ann), "images": str(images)}, samples_per_shard=8
    )
    urls = [str(p) for p in sorted(out.glob("train/*.tar"))]
    samples = list(
        wds.WebDataset(urls, shardshuffle=False)
        .decode("pil")
        .to_tuple("__key__", "image.png", "text.json")
    )
    assert len(samples) == 60
    key, img, text = samples[0]
    assert key == "000000000001" and img.mode == "RGB" and img.size == (40, 32)
    assert text["caption"] == caption(1)


def test_manifest_edge_cases_multiline_csv_and_not_parquet(tmp_path):
    root = tmp_path / "raw"
    rels = make_image_files(root, 2)
    path = root / "m.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", "caption"])
        w.writerow([rels[0], "A dog.\nA cat."])
        w.writerow([rels[1], "plain"])
    out = tmp_path / "out"
    convert("manifest", out, reader={"manifest": str(path)})
    texts = sorted(
        json.loads(v)["caption"] for k, v in members(out).items() if k.endswith("text.json")
    )
    assert texts == ["A dog.\nA cat.", "plain"]
    fake = root / "fake.parquet"
    fake.write_text("not parquet")
    r = run_cli("convert", "manifest", "--manifest", fake, "--out", tmp_path / "o2")
    assert (
        r.returncode == 2 and "cannot read as Parquet" in r.stderr and "Traceback" not in r.stderr
    )


def test_coco_malformed_image_rows_are_counted_not_fatal(tmp_path):
    ann, images, _ = make_coco(tmp_path / "raw", n_good=30)
    doc = json.loads(ann.read_text())
    doc["images"] += [{"file_name": "img_0001.png"}, "not an object", {"id": "x", "file_name": 3}]
    ann.write_text(json.dumps(doc))
    outcome = convert(
        "coco", tmp_path / "out", reader={"annotations": str(ann), "images": str(images)}
    )
    assert (
        reason_counts(outcome.report) == {"malformed_line": 3}
        and outcome.report["totals"]["written"] == 30
    )


def test_max_pixels_above_pil_default_is_honoured(tmp_path, monkeypatch):
    from converters.media import encode_image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # stands in for PIL's default limit
    ext, _, info = encode_image(image_bytes(1, size=(50, 50)), ImageOptions(max_pixels=10_000))
    assert ext == "png" and info["width"] == 50 and Image.MAX_IMAGE_PIXELS == 1000


def test_other_options_give_another_dataset_identity(tmp_path, coco60):
    from energon_platform.loader.source import SampleSource

    ann, images, _ = coco60
    reader = {"annotations": str(ann), "images": str(images)}
    convert("coco", tmp_path / "a", reader=reader)
    convert("coco", tmp_path / "b", reader=reader, image=ImageOptions(max_side=16))
    assert (
        SampleSource(str(tmp_path / "a")).identity() != SampleSource(str(tmp_path / "b")).identity()
    )
    convert("coco", tmp_path / "c", reader=reader)
    assert (
        SampleSource(str(tmp_path / "a")).identity() == SampleSource(str(tmp_path / "c")).identity()
    )


# ---------------------------------------------------------------- --help lists the options that apply to the kind


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
