"""The converter under a new user's ordinary mistakes, one test per defect.

Each test fails without its fix: --overwrite and foreign files (2), high bit depth (3), missing or
changed shards (4), silent drops (5), one line + exit 2 instead of tracebacks (6), byte-order
marks (7), audio formats and bit depth (8), the output lock and index bytes (10), ids, keys and
sidecars (12), and the resume contract itself (record digest, only missing shards rewritten,
dataset identity follows content).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from converters.convert import ConvertError, reason_counts
from converters.media import AudioOptions, ImageOptions
from converters.records import KEY_PATTERN, MAX_KEY_LENGTH, make_key
from tests.convert.test_convert import convert, members, tree_digest
from tests.helpers.cli import run_cli, start_python
from tests.helpers.corpora import (
    caption,
    image_bytes,
    make_coco,
    make_image_files,
    make_librispeech,
    tone_bytes,
)


def one_line_error(r) -> bool:
    return (
        r.returncode == 2
        and "Traceback" not in r.stderr
        and len(r.stderr.strip().splitlines()) == 1
    )


def folder_corpus(root: Path, n: int = 6) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"{i:03d}.png").write_bytes(image_bytes(i))
        (root / f"{i:03d}.txt").write_text(caption(i))
    return root


def stamps(out: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every shard: a rewritten shard gets another one."""
    return {
        str(p.relative_to(out)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(out.glob("*/shard-*.tar"))
    }


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

    for inside in (
        root,
        root / "train",
        root / "x.png",
    ):  # never an input inside what --overwrite may remove
        with pytest.raises(ConvertError, match="is or holds the input"):
            check_target(root, [inside])


# ---------------------------------------------------------------- 3: high bit depth


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
def test_high_bit_depth_is_scaled_not_clipped(mode):
    from converters.media import encode_image

    ramp = np.tile(np.linspace(0, 65535, 64), (8, 1))
    data = {
        "I;16": ramp.astype(np.uint16),
        "I": ramp.astype(np.int32),
        "F": (ramp / 65535).astype(np.float32),
    }[mode]
    buf = io.BytesIO()
    Image.fromarray(data).save(buf, format="PNG" if mode == "I;16" else "TIFF")
    assert Image.open(io.BytesIO(buf.getvalue())).mode == mode
    for fmt in ("png", "keep"):  # keep: a loader would clip it, so it is re-encoded too
        ext, png, _ = encode_image(buf.getvalue(), ImageOptions(fmt))
        out = np.asarray(Image.open(io.BytesIO(png)))[..., 0].astype(int)
        assert ext == "png" and out[0, 0] == 0 and out[0, -1] == 255
        assert len(np.unique(out)) == 64 and np.all(np.diff(out[0]) > 0)  # a ramp, not 0/255
        assert abs(out[0, 32] - round(ramp[0, 32] * 255 / 65535)) <= 1


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_transparent_pixels_are_drawn_over_white_not_the_colour_hidden_under_them(mode):
    """A fully transparent PNG trained on the colour stored under its alpha (often black or
    noise); ``keep`` re-encodes it too, since a loader would drop the alpha."""
    from converters.media import encode_image

    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., :3] = 17  # the hidden colour
    rgba[:, 4:, 3] = 255  # the right half opaque
    img = Image.fromarray(rgba, "RGBA")
    if mode == "LA":
        img = img.convert("LA")
    elif mode == "P":
        img = img.convert("RGB").quantize(2)
        img.info["transparency"] = img.getpixel((0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    for fmt in ("png", "keep"):
        ext, png, _ = encode_image(buf.getvalue(), ImageOptions(fmt))
        out = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        assert ext == "png" and (out[:, :4] == 255).all(), fmt  # transparent: white
        if mode != "P":
            assert (out[:, 4:] == 17).all(), fmt  # opaque: its own colour


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


# ---------------------------------------------------------------- 5: silent drops


def test_librispeech_chapter_without_transcript_file_is_counted(tmp_path):
    root, _ = make_librispeech(tmp_path / "ls")  # 2 speakers x 2 chapters x 3 utterances
    (root / "19" / "198" / "19-198.trans.txt").unlink()
    outcome = convert(
        "librispeech", tmp_path / "out", reader={"root": str(root)}, max_error_fraction=0.5
    )
    assert outcome.report["totals"]["written"] == 9 and reason_counts(outcome.report) == {
        "empty_text": 3
    }
    assert "19-198-0000" in outcome.report["skipped_by_reason"]["empty_text"]["examples"]


def test_folder_dangling_symlink_and_loop_are_counted(tmp_path):
    root = folder_corpus(tmp_path / "raw", n=8)
    for name, target in (("dangling", "nowhere.png"), ("loop", "loop.png")):
        (root / f"{name}.png").symlink_to(target)
        (root / f"{name}.txt").write_text("a caption for an image that cannot be read")
    outcome = convert(
        "folder", tmp_path / "out", reader={"root": str(root)}, max_error_fraction=0.5
    )
    assert reason_counts(outcome.report) == {"missing_file": 2}
    details = [
        json.loads(line)["detail"]
        for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()
    ]
    assert any("dangling" in d for d in details) and any("loop" in d for d in details)


def test_coco_annotations_with_unknown_string_or_bad_image_ids_are_counted(tmp_path):
    ann, images, _ = make_coco(tmp_path / "raw", n_good=30)
    doc = json.loads(ann.read_text())
    doc["annotations"] += [
        {"id": 1, "image_id": 999, "caption": "no such image"},
        {"id": 2, "image_id": "3", "caption": "a string id"},
        {"id": 3, "image_id": [1], "caption": "a list id"},
        "not an object",
        {"id": 4, "image_id": 5, "caption": 7},
    ]
    ann.write_text(json.dumps(doc))
    outcome = convert(
        "coco", tmp_path / "out", reader={"annotations": str(ann), "images": str(images)}
    )
    assert reason_counts(outcome.report) == {"unknown_image_id": 3, "malformed_line": 2}
    assert outcome.report["totals"]["written"] == 30


# ---------------------------------------------------------------- 6: one line and exit 2


def test_unusable_out_gives_one_line(tmp_path):
    images = folder_corpus(tmp_path / "raw")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out, expected in ((a_file, "not a folder"), ("/sys/energon-platform-test", "--out")):
        r = run_cli("convert", "folder", "--root", images, "--out", out, "--no-progress")
        assert one_line_error(r) and expected in r.stderr, r.stderr
    assert a_file.read_text() == "x"


def test_read_only_out_gives_one_line(tmp_path, monkeypatch, capsys):
    import errno

    from energon_platform.cli import main

    real_mkdir = Path.mkdir

    def read_only(self, *a, **kw):
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", read_only)
    root = folder_corpus(tmp_path / "raw")
    assert (
        main(
            [
                "convert",
                "folder",
                "--root",
                str(root),
                "--out",
                str(tmp_path / "ro" / "out"),
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "Read-only file system" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("field", ["images", "annotations"])
def test_coco_null_lists_give_one_line(tmp_path, field):
    ann, images, _ = make_coco(tmp_path / "raw", n_good=2)
    doc = json.loads(ann.read_text())
    doc[field] = None
    ann.write_text(json.dumps(doc))
    r = run_cli(
        "convert", "coco", "--annotations", ann, "--images", images, "--out", tmp_path / "o"
    )
    assert one_line_error(r) and "not a COCO captions file" in r.stderr and field in r.stderr
    assert not (tmp_path / "o").exists()


def test_unreachable_ray_address_fails_fast(tmp_path):
    root = folder_corpus(tmp_path / "raw")
    start = time.monotonic()
    r = run_cli(
        "convert",
        "folder",
        "--root",
        root,
        "--out",
        tmp_path / "o",
        "--no-progress",
        "--executor",
        "ray",
        "--ray-address",
        "127.0.0.1:1",
        timeout=90,
    )
    assert time.monotonic() - start < 30
    assert one_line_error(r) and "--ray-address" in r.stderr and "cannot reach" in r.stderr
    assert not (tmp_path / "o").exists()


def test_info_on_corrupt_metadata_gives_one_line(tmp_path):
    out = tmp_path / "out"
    convert("folder", out, reader={"root": str(folder_corpus(tmp_path / "raw"))})
    (out / ".nv-meta" / ".info.json").write_text("{not json")
    r = run_cli("info", out)
    assert one_line_error(r) and "corrupt dataset metadata" in r.stderr


# ---------------------------------------------------------------- 7: byte-order marks


def test_bom_in_csv_header_jsonl_and_sidecars_is_stripped(tmp_path):
    root = tmp_path / "raw"
    rels = make_image_files(root, 2)
    bom = "\ufeff".encode()
    (root / "m.csv").write_bytes(
        bom + f"image,caption\n{rels[0]},first\n{rels[1]},second\n".encode()
    )
    (root / "m.jsonl").write_bytes(
        bom
        + b"\n".join(
            json.dumps({"image": r, "caption": c}).encode()
            for r, c in zip(rels, ("first", "second"))
        )
    )
    for fmt in ("csv", "jsonl"):
        outcome = convert("manifest", tmp_path / fmt, reader={"manifest": str(root / f"m.{fmt}")})
        assert outcome.report["totals"] == {
            "seen": 2,
            "written": 2,
            "skipped": 0,
            "skipped_fraction": 0.0,
        }, fmt
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.png").write_bytes(image_bytes(1))
    (folder / "a.txt").write_bytes(bom + b"a caption with a BOM")
    (folder / "b.png").write_bytes(image_bytes(2))
    (folder / "b.json").write_bytes(bom + json.dumps({"caption": "json with a BOM"}).encode())
    convert("folder", tmp_path / "fo", reader={"root": str(folder)})
    texts = {
        k: json.loads(v)["caption"]
        for k, v in members(tmp_path / "fo").items()
        if k.endswith("text.json")
    }
    assert texts == {
        "train/a.text.json": "a caption with a BOM",
        "train/b.text.json": "json with a BOM",
    }


def test_bom_in_librispeech_transcript_is_stripped(tmp_path):
    root, _ = make_librispeech(tmp_path / "ls")
    trans = root / "19" / "198" / "19-198.trans.txt"
    trans.write_bytes("\ufeff".encode() + trans.read_bytes())
    outcome = convert("librispeech", tmp_path / "out", reader={"root": str(root)})
    assert outcome.report["totals"]["written"] == 12 and outcome.report["totals"]["skipped"] == 0


# ---------------------------------------------------------------- 8: audio formats and bit depth


def wav(subtype: str, seconds=0.2, rate=16000, fmt="WAV") -> bytes:
    """A tone written by libsndfile (``fmt="FLAC"``: a FLAC that our encoder would not write byte for byte)."""
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(
        buf,
        (0.4 * np.sin(2 * np.pi * 330 * t)).astype(np.float64),
        rate,
        format=fmt,
        subtype=subtype,
    )
    return buf.getvalue()


def audio_manifest(root: Path, files: dict[str, bytes]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, data in files.items():
        (root / name).write_bytes(data)
        lines.append(
            json.dumps({"audio_filepath": name, "text": f"clip {name}", "id": name.split(".")[0]})
        )
    (root / "m.jsonl").write_text("\n".join(lines) + "\n")
    return str(root / "m.jsonl")


def test_audio_parts_are_named_by_detected_format(tmp_path):
    manifest = audio_manifest(
        tmp_path / "raw",
        {
            "noext": wav("PCM_16"),
            "liar.flac": wav("PCM_16"),
            "real.flac": wav("PCM_16", fmt="FLAC"),
        },
    )
    convert(
        "audio-manifest",
        tmp_path / "keep",
        reader={"manifest": manifest},
        audio=AudioOptions("keep"),
    )
    keep = members(tmp_path / "keep")
    assert sorted(k for k in keep if "audio" in k) == [
        "train/liar.audio.wav",
        "train/noext.audio.wav",
        "train/real.audio.flac",
    ]
    assert keep["train/liar.audio.wav"] == (tmp_path / "raw" / "liar.flac").read_bytes()
    convert("audio-manifest", tmp_path / "flac", reader={"manifest": manifest})
    flac = members(tmp_path / "flac")
    assert sorted(k for k in flac if "audio" in k) == [
        "train/liar.audio.flac",
        "train/noext.audio.flac",
        "train/real.audio.flac",
    ]
    assert (
        flac["train/liar.audio.flac"][:4] == b"fLaC"
    )  # re-encoded, not WAV bytes under a FLAC name
    assert (
        flac["train/real.audio.flac"]
        == keep["train/real.audio.flac"]
        == (tmp_path / "raw" / "real.flac").read_bytes()
    )


def test_24_bit_and_float_wav_keep_their_depth(tmp_path):
    import soundfile

    manifest = audio_manifest(
        tmp_path / "raw",
        {"deep.wav": wav("PCM_24"), "float.wav": wav("FLOAT"), "plain.wav": wav("PCM_16")},
    )
    convert("audio-manifest", tmp_path / "out", reader={"manifest": manifest})
    m = members(tmp_path / "out")
    assert sorted(k for k in m if "audio" in k) == [
        "train/deep.audio.flac",
        "train/float.audio.wav",
        "train/plain.audio.flac",
    ]
    assert soundfile.info(io.BytesIO(m["train/deep.audio.flac"])).subtype == "PCM_24"
    deep, _ = soundfile.read(io.BytesIO(m["train/deep.audio.flac"]), dtype="int32")
    src, _ = soundfile.read(tmp_path / "raw" / "deep.wav", dtype="int32")
    assert np.array_equal(deep, src)  # lossless, all 24 bits
    assert m["train/float.audio.wav"] == (tmp_path / "raw" / "float.wav").read_bytes()
    assert soundfile.info(io.BytesIO(m["train/plain.audio.flac"])).subtype == "PCM_16"
    meta = {
        k: json.loads(v)["source"]["sample_format"] for k, v in m.items() if k.endswith("text.json")
    }
    assert meta == {
        "train/deep.text.json": "s24",
        "train/float.text.json": "f32",
        "train/plain.text.json": "s16",
    }


# ---------------------------------------------------------------- 10: lock and index bytes

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


# ---------------------------------------------------------------- 12: ids, keys, sidecars, help


def test_null_or_missing_manifest_id_never_becomes_a_key(tmp_path):
    root = tmp_path / "raw"
    rels = make_image_files(root, 4)
    rows = [
        {"image": rels[0], "caption": "a", "uid": None},
        {"image": rels[1], "caption": "b"},
        {"image": rels[2], "caption": "c", "uid": "ok"},
        {"image": rels[3], "caption": "d", "uid": 0},
    ]
    (root / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    outcome = convert(
        "manifest",
        tmp_path / "out",
        reader={"manifest": str(root / "m.jsonl"), "id_column": "uid"},
        max_error_fraction=0.6,
    )
    assert reason_counts(outcome.report) == {"malformed_line": 2}
    assert {k.split("/")[1].split(".")[0] for k in members(tmp_path / "out")} == {"ok", "0"}
    audio = audio_manifest(
        tmp_path / "a", {"x.wav": tone_bytes(1, fmt="wav"), "y.wav": tone_bytes(2, fmt="wav")}
    )
    lines = [
        dict(json.loads(line), id=v)
        for line, v in zip(Path(audio).read_text().splitlines(), (None, 0))
    ]
    Path(audio).write_text("\n".join(map(json.dumps, lines)) + "\n")
    convert("audio-manifest", tmp_path / "ao", reader={"manifest": audio})
    keys = {k.split("/")[1].split(".")[0] for k in members(tmp_path / "ao")}
    assert keys == {"x", "0"}  # null id: the path; id 0 is an id


def test_duplicate_id_messages_name_both_files(tmp_path):
    ann, images, _ = make_coco(tmp_path / "raw", n_good=12, bad=True)
    convert("coco", tmp_path / "out", reader={"annotations": str(ann), "images": str(images)})
    dup = [
        json.loads(line)
        for line in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()
        if json.loads(line)["reason"] == "duplicate_id"
    ]
    assert (
        len(dup) == 1 and "img_0002.png" in dup[0]["detail"] and "img_0001.png" in dup[0]["detail"]
    )


def test_sidecars_empty_txt_does_not_hide_json_and_case_is_ignored(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    for name in ("a", "b", "c"):
        (root / f"{name}.png").write_bytes(image_bytes(ord(name)))
    (root / "a.txt").write_text("\n  \n")
    (root / "a.json").write_text(json.dumps({"caption": "from the json"}))
    (root / "b.TXT").write_text("upper-case sidecar")
    (root / "c.Json").write_text(json.dumps("a json string"))
    outcome = convert("folder", tmp_path / "out", reader={"root": str(root)})
    texts = {
        k: json.loads(v)["caption"]
        for k, v in members(tmp_path / "out").items()
        if k.endswith("text.json")
    }
    assert outcome.report["totals"]["skipped"] == 0
    assert texts == {
        "train/a.text.json": "from the json",
        "train/b.text.json": "upper-case sidecar",
        "train/c.text.json": "a json string",
    }


def test_long_ids_give_bounded_unique_stable_keys(tmp_path):
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    ka, kb = make_key(long_a), make_key(long_b)
    assert len(ka) <= MAX_KEY_LENGTH and len(kb) <= MAX_KEY_LENGTH and ka != kb
    assert KEY_PATTERN.match(ka) and ka == "a" * 80 + "-" + ka[-8:] and ka == make_key("a" * 300)
    assert make_key("x" * MAX_KEY_LENGTH) == "x" * MAX_KEY_LENGTH  # short enough: kept verbatim
    root = tmp_path / "raw"
    rels = make_image_files(root, 2)
    (root / "m.jsonl").write_text(
        "".join(
            json.dumps({"image": r, "caption": caption(i), "uid": uid}) + "\n"
            for i, (r, uid) in enumerate(zip(rels, (long_a, long_b)))
        )
    )
    out = tmp_path / "out"
    convert("manifest", out, reader={"manifest": str(root / "m.jsonl"), "id_column": "uid"})
    with tarfile.open(next(out.glob("train/*.tar"))) as tf:
        names = tf.getnames()
    assert len(names) == 4 and max(len(n) for n in names) <= MAX_KEY_LENGTH + len(".image.png")
    subprocess.run(
        ["tar", "xf", str(next(out.glob("train/*.tar"))), "-C", str(tmp_path)], check=True
    )


def test_root_and_manifest_have_help():
    for kind, arg in (
        ("folder", "--root"),
        ("librispeech", "--root"),
        ("audio-manifest", "--manifest"),
    ):
        r = run_cli("convert", kind, "--help")
        options = r.stdout.split("\n\n", 1)[1]  # after the usage lines
        line = next(ln for ln in options.splitlines() if ln.strip().startswith(arg))
        assert len(line.split()) > 2, (kind, line)  # more than "--root ROOT"


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


def test_an_audio_manifest_text_of_another_type_is_malformed_not_empty(tmp_path):
    """M5: ``"text": 42`` or ``["a", 1]`` was counted as ``empty_text``."""
    manifest = Path(audio_manifest(tmp_path / "raw", {f"{i}.wav": wav("PCM_16") for i in range(4)}))
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    rows[1]["text"], rows[2]["text"], rows[3]["text"] = 42, ["a", 1], " "
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outcome = convert(
        "audio-manifest", tmp_path / "out", reader={"manifest": str(manifest)}, max_error_fraction=1
    )
    assert reason_counts(outcome.report) == {"malformed_line": 2, "empty_text": 1}


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
