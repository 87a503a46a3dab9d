"""What an input's records become, one test per defect: every record dropped is counted with its
reason (5), byte-order marks are stripped (7), ids become bounded, unique keys and sidecars are
read whatever their case (12), and a text of another type is malformed, not empty.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

from converters.convert import reason_counts
from converters.records import KEY_PATTERN, MAX_KEY_LENGTH, make_key
from tests.convert.test_convert import convert, members
from tests.helpers.corpora import (
    audio_manifest,
    caption,
    folder_corpus,
    image_bytes,
    make_coco,
    make_image_files,
    make_librispeech,
    tone_bytes,
    wav,
)

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


# ---------------------------------------------------------------- 12: ids, keys, sidecars


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
