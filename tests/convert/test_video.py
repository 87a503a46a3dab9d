"""``energon-platform convert video``: folder and manifest forms (JSONL, CSV, Parquet paths and
Parquet bytes), original bytes kept after a decode check, provenance, every bad-input reason,
deterministic re-encoding, worker/executor independence, SIGKILL + rerun, Energon's loader."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from converters.convert import ConvertOptions, reason_counts, run_conversion
from converters.media import VideoOptions
from converters.readers import InputError
from tests.convert.test_convert import assert_kill_and_rerun_is_byte_identical
from tests.helpers.cli import run_cli
from tests.helpers.video_corpus import (
    audio_only_mp4,
    caption,
    make_video,
    read_index,
    tree_digest,
    unknown_codec_mkv,
    write_folder,
)


def convert(out: Path, reader: dict, **opts):
    return run_conversion("video", reader, ConvertOptions(out=str(out), progress=False, **opts))


def members(out: Path) -> dict[str, bytes]:
    data = {}
    for shard in sorted(out.glob("*/shard-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                data[m.name] = tar.extractfile(m).read()
    return data


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Good videos in every kept container (two with audio), plus one bad input of every kind."""
    root = tmp_path_factory.mktemp("video-raw")
    good = {
        "a_mp4.mp4": make_video("mp4", 24, seed=1),
        "b_webm.webm": make_video("webm", 30, audio=True, seed=2),
        "c_mkv.mkv": make_video("mkv", 18, seed=3),
        "sub/d_mp4.mp4": make_video("mp4", 36, audio=True, seed=4),
        "e_avi.avi": make_video("avi", 12, seed=5),
    }
    bad = {
        "not_video.mp4": b"this is a text file, not a video" * 20,
        "empty.mp4": b"",
        "truncated.mp4": make_video("mp4", 24, seed=6)[:2500],
        "cut_short.webm": make_video("webm", 48, seed=7)[:-1200],
        "audio_only.mp4": audio_only_mp4(),
        "unknown_codec.mkv": unknown_codec_mkv(),
        "picture.mp4": _png(),
    }
    for i, (name, data) in enumerate({**good, **bad}.items()):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.with_suffix(".txt").write_text(caption(i) + "\n")
    (root / "no_caption.mp4").write_bytes(make_video("mp4", 12, seed=8))
    return root


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


EXPECTED_REASONS = {
    "not_a_video": 2,
    "empty_file": 1,
    "truncated_video": 2,
    "no_video_stream": 1,
    "undecodable_video": 1,
    "empty_text": 1,
}


def test_folder_keeps_bytes_writes_provenance_and_counts_every_bad_kind(tmp_path, raw):
    out = tmp_path / "out"
    outcome = convert(out, {"root": str(raw)}, max_error_fraction=1.0)
    assert reason_counts(outcome.report) == EXPECTED_REASONS
    assert outcome.report["totals"]["written"] == 5 and outcome.report["modality"] == "video"
    skipped = {
        json.loads(line)["id"]: json.loads(line)["reason"]
        for line in (out / "skipped.jsonl").read_text().splitlines()
    }
    assert skipped == {
        "not_video": "not_a_video",
        "picture": "not_a_video",
        "empty": "empty_file",
        "truncated": "truncated_video",
        "cut_short": "truncated_video",
        "audio_only": "no_video_stream",
        "unknown_codec": "undecodable_video",
        "no_caption": "empty_text",
    }
    parts = members(out)
    # kept as their original bytes, named by the detected container
    assert parts["a_mp4.video.mp4"] == (raw / "a_mp4.mp4").read_bytes()
    assert parts["b_webm.video.webm"] == (raw / "b_webm.webm").read_bytes()
    assert parts["c_mkv.video.mkv"] == (raw / "c_mkv.mkv").read_bytes()
    assert "e_avi.video.mp4" in parts  # AVI is re-encoded as MP4
    meta = json.loads(parts["b_webm.text.json"])
    assert meta["text"] == caption(1) and meta["captions"] == [caption(1)]
    src = meta["source"]
    assert (src["frames"], src["fps"], src["duration"], src["width"], src["height"]) == (
        30,
        12.0,
        2.5,
        128,
        96,
    )
    assert (
        src["codec"] == "vp9"
        and src["audio"] is True
        and src["audio_codec"] == "opus"
        and not src["reencoded"]
    )
    assert json.loads(parts["a_mp4.text.json"])["source"]["audio"] is False
    assert (
        json.loads(parts["sub_d_mp4-" + parts_key_suffix(parts, "sub_d_mp4")].decode())["source"][
            "frames"
        ]
        == 36
    )
    avi = json.loads(parts["e_avi.text.json"])["source"]
    assert avi["reencoded"] and avi["codec"] == "h264" and avi["frames"] == 12


def parts_key_suffix(parts: dict, prefix: str) -> str:
    """The hash suffix make_key gave ``sub/d_mp4`` (a slash is not key-safe)."""
    (name,) = [n for n in parts if n.startswith(prefix + "-") and n.endswith(".text.json")]
    return name[len(prefix) + 1 :]


def test_truncated_webm_is_detected_by_its_declared_duration(tmp_path):
    root = tmp_path / "raw"
    root.mkdir()
    (root / "cut.webm").write_bytes(make_video("webm", 48, seed=7)[:-1200])
    (root / "cut.txt").write_text("x")
    (root / "ok.webm").write_bytes(make_video("webm", 48, seed=7))
    (root / "ok.txt").write_text("x")
    outcome = convert(tmp_path / "out", {"root": str(root)}, max_error_fraction=1.0)
    assert reason_counts(outcome.report) == {"truncated_video": 1}
    assert outcome.report["skipped_by_reason"]["truncated_video"]["examples"] == ["cut"]


def test_manifest_forms_jsonl_csv_parquet_paths_and_bytes(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    videos = tmp_path / "videos"
    write_folder(videos, 4)
    rows = [
        {
            "videoid": 1000 + i,
            "name": caption(i),
            "path": f"videos/clip_{i:03d}.{('mp4', 'mp4', 'webm')[i % 3]}",
        }
        for i in range(4)
    ]
    rows.append({"videoid": 2000, "name": "", "path": "videos/clip_000.mp4"})  # missing caption
    rows.append({"videoid": 2001, "name": "gone", "path": "videos/absent.mp4"})  # missing file
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "m.csv").write_text(
        "videoid,name,path\n" + "".join(f'{r["videoid"]},"{r["name"]}",{r["path"]}\n' for r in rows)
    )
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    inline = [
        {
            "videoid": r["videoid"],
            "name": r["name"],
            "video": (tmp_path / r["path"]).read_bytes()
            if (tmp_path / r["path"]).exists()
            else b"",
        }
        for r in rows
    ]
    pq.write_table(pa.Table.from_pylist(inline), tmp_path / "inline.parquet")
    digests = {}
    for name, extra in (
        ("m.jsonl", {}),
        ("m.csv", {}),
        ("m.parquet", {}),
        ("inline.parquet", {"video_column": "video"}),
    ):
        out = tmp_path / f"out-{name}"
        outcome = convert(out, {"manifest": str(tmp_path / name), **extra}, max_error_fraction=0.5)
        expected = {"empty_text": 1, "missing_file" if "inline" not in name else "empty_file": 1}
        assert reason_counts(outcome.report) == expected, name
        parts = members(out)
        assert sorted(n for n in parts if n.endswith(".text.json")) == [
            f"{1000 + i}.text.json" for i in range(4)
        ]
        assert parts["1002.video.webm"] == (videos / "clip_002.webm").read_bytes()
        assert json.loads(parts["1001.text.json"])["text"] == caption(1)
        digests[name] = {k: v for k, v in parts.items() if k.endswith(("mp4", "webm"))}
    assert (
        len({json.dumps(sorted((k, len(v)) for k, v in d.items())) for d in digests.values()}) == 1
    )


def test_cli_needs_exactly_one_source_and_missing_input_is_exit_2(tmp_path):
    r = run_cli("convert", "video", "--out", tmp_path / "o", "--no-progress")
    assert r.returncode == 2 and "--root" in r.stderr
    r = run_cli(
        "convert", "video", "--root", tmp_path / "absent", "--out", tmp_path / "o", "--no-progress"
    )
    assert r.returncode == 2 and "video folder" in r.stderr
    with pytest.raises(InputError, match="exactly one"):
        convert(tmp_path / "o2", {})


def test_reencode_max_side_max_seconds_deterministic_and_decodable(tmp_path):
    import io

    import av

    root = write_folder(tmp_path / "raw", 3, lengths=(48,), formats=("mp4", "webm", "mkv"))
    outs = []
    for w in (1, 2):
        out = tmp_path / f"w{w}"
        r = run_cli(
            "convert",
            "video",
            "--root",
            root,
            "--out",
            out,
            "--max-side",
            64,
            "--max-seconds",
            1.5,
            "--samples-per-shard",
            1,
            "--workers",
            w,
            "--no-progress",
        )
        assert r.returncode == 0, r.stderr
        outs.append(out)
    assert tree_digest(outs[0]) == tree_digest(outs[1])
    parts = members(outs[0])
    for i in range(3):
        meta = json.loads(parts[f"clip_{i:03d}.text.json"])["source"]
        assert (
            meta["reencoded"]
            and (meta["width"], meta["height"]) == (64, 48)
            and meta["frames"] == 18
        )
        with av.open(io.BytesIO(parts[f"clip_{i:03d}.video.mp4"])) as c:
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
            assert len(frames) == 18 and frames[0].shape == (48, 64, 3)
            assert c.streams.audio[0].codec_context.name == "aac" if i == 1 else not c.streams.audio
    state = json.loads((outs[0] / ".convert" / "state.json").read_text())
    assert state["options"]["video"] == {"max_side": 64, "max_seconds": 1.5}
    # a short, small video needs no re-encode: original bytes
    out = tmp_path / "large-limits"
    convert(out, {"root": str(root)}, video=VideoOptions(max_side=1024, max_seconds=60))
    assert members(out)["clip_000.video.mp4"] == (root / "clip_000.mp4").read_bytes()


def test_energon_loads_video_text_samples_with_av_decoder(tmp_path):
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset
    from megatron.energon.av import AVDecoder

    from converters.sample_types import VideoTextSample

    out = tmp_path / "out"
    convert(out, {"root": str(write_folder(tmp_path / "raw", 6))}, samples_per_shard=2)
    yaml_text = (out / ".nv-meta" / "dataset.yaml").read_text()
    assert "VideoTextSample" in yaml_text and "sample_loader" in yaml_text  # mp4 + webm parts
    ds = get_val_dataset(
        out,
        split_part="train",
        batch_size=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    samples = list(get_loader(ds))
    assert len(samples) == 6 and all(
        isinstance(s, VideoTextSample) and isinstance(s.video, AVDecoder) for s in samples
    )
    s = samples[0]
    clips, _ = s.video.get_video_clips([(5, 5)], video_unit="frames")
    assert (
        read_index(clips[0][0].numpy()) == 5
        and s.text == caption(0)
        and s.meta["source"]["frames"] == 24
    )


def test_same_bytes_for_workers_and_rerun_is_nothing_to_do(tmp_path):
    root = write_folder(tmp_path / "raw", 8)
    a, b = tmp_path / "a", tmp_path / "b"
    convert(a, {"root": str(root)}, samples_per_shard=2, val_fraction=0.25)
    convert(b, {"root": str(root)}, samples_per_shard=2, val_fraction=0.25, workers=2)
    assert tree_digest(a) == tree_digest(b) and any(k.startswith("val/") for k in tree_digest(a))
    assert convert(a, {"root": str(root)}, samples_per_shard=2, val_fraction=0.25).already_done


@pytest.mark.slow
def test_ray_executor_same_bytes_as_local(tmp_path):
    root = write_folder(tmp_path / "raw", 6)
    args = ["convert", "video", "--root", root, "--samples-per-shard", 2, "--no-progress"]
    assert run_cli(*args, "--out", tmp_path / "local").returncode == 0
    r = run_cli(*args, "--out", tmp_path / "ray", "--executor", "ray", "--workers", 2, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert tree_digest(tmp_path / "local") == tree_digest(tmp_path / "ray")


@pytest.mark.slow
def test_sigkill_then_rerun_is_byte_identical(tmp_path):
    root = write_folder(tmp_path / "raw", 60, lengths=(24,))
    args = [
        "convert",
        "video",
        "--root",
        root,
        "--samples-per-shard",
        1,
        "--max-side",
        64,
        "--no-progress",
    ]
    assert_kill_and_rerun_is_byte_identical(args, tmp_path, kill_after_units=8, total_units=60)


# ---------------------------------------------------------------- --max-seconds cuts are counted


def test_max_seconds_cuts_are_counted_and_the_original_duration_recorded(tmp_path):
    # 1 s and 4 s at 12 fps
    root = write_folder(tmp_path / "raw", 4, lengths=(12, 48), formats=("mp4",))
    out = tmp_path / "out"
    argv = ["--root", root, "--out", out, "--max-seconds", "1.5", "--no-progress"]
    r = run_cli("convert", "video", *argv, timeout=300)
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
