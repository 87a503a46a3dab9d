#!/usr/bin/env python
"""Video clips per second through energon-platform's loader against a plain PyAV loop that decodes
the same clips, and decode time per clip on short and long videos (seek, not decode-from-start).

What it does, all in one run on generated videos (H.264 MP4 and VP9 WebM, ``--size``, 30 fps, a
keyframe every second): converts them with ``energon-platform convert video`` (original bytes
kept), then

1. **loader vs PyAV**: ``TrainLoader`` (``video_text``: ``--frames`` frames at stride 2, a random
   crop to 112 px, caption tokens; ``num_workers=0``; samples read from the shards) for
   ``--epochs`` epochs, against a loop that opens each of the same video files with PyAV, seeks to
   the keyframe before the same clip (same sample, same epoch, so the same frame indices) and
   decodes its frames to RGB arrays ("decode only"); and against a loop doing the loader's work by
   hand ("same work": the video member's bytes read from its tar shard, the same PyAV seek and
   decode, the same crop under the same seed; its tensors are checked against the loader's).
   All run in this process, alternating epoch by epoch; the ratios are loader clips/s over each
   loop's clips/s (target >= 0.9 against the same work; the decode-only ratio shows what reading
   whole samples and transforming them cost, with the same work split into read/decode/transform).
2. **seek**: the encoder's decode step (:func:`task_encoders.video_text.decode_frames`) for clips
   at the start, middle and end of short and long videos: ms per clip, and the long/short ratio
   (about 1 when decoding starts at the keyframe before the clip). For contrast, the same clips
   decoded from the first frame, and on WebM through Energon's plain ``get_video_clips`` (whose
   Matroska index is empty until a first seek, so it decodes from the start).

Prints a table and writes ``--json``. No figure is hard-coded: every number is measured here.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.common import (
    check_json_out,
    finish_record,
    run_record,
    timings,
    write_json,
)

FPS = 30


def make_video(path: Path, seconds: float, size: tuple[int, int], fmt: str, seed: int) -> None:
    """A moving gradient with a bouncing square (so inter frames carry real motion)."""
    import av
    import numpy as np

    w, h = size
    rng = np.random.default_rng(seed)
    base = np.add.outer(np.arange(h), np.arange(w)) % 256
    colour = rng.integers(0, 255, 3)
    with av.open(
        str(path), "w", format="webm" if fmt == "webm" else "mp4", options={"fflags": "+bitexact"}
    ) as out:
        vs = out.add_stream("libvpx-vp9" if fmt == "webm" else "libx264", rate=FPS)
        vs.width, vs.height, vs.pix_fmt = w, h, "yuv420p"
        vs.codec_context.gop_size = FPS
        vs.codec_context.thread_count = 1
        vs.options = (
            {"threads": "1", "crf": "34", "b": "0", "deadline": "realtime", "cpu-used": "8"}
            if fmt == "webm"
            else {"preset": "veryfast", "crf": "26", "threads": "1", "x264-params": "mbtree=0"}
        )
        for i in range(int(seconds * FPS)):
            img = np.stack([(base + 3 * i) % 256, base, (base * 2 - i) % 256], axis=-1).astype(
                np.uint8
            )
            x = int((i * 4) % (2 * (w - 40)))
            x = x if x < w - 40 else 2 * (w - 40) - x
            img[h // 3 : h // 3 + 40, x : x + 40] = colour
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            for p in vs.encode(frame):
                out.mux(p)
        for p in vs.encode(None):
            out.mux(p)


def pyav_clip(source: Path | io.BytesIO, indices: list[int], fps: float) -> list:
    """The plain PyAV baseline: open the file (or in-memory bytes), seek to the keyframe before the
    clip, decode to its last frame, keep the wanted frames as RGB arrays (single-threaded decoding,
    as Energon configures it)."""
    import av

    wanted = set(indices)
    out = []
    with av.open(str(source) if isinstance(source, Path) else source) as c:
        s = c.streams.video[0]
        s.codec_context.thread_type = "NONE"
        s.codec_context.thread_count = 0
        tb, start = s.time_base, s.start_time or 0
        c.seek(int(indices[0] / fps / tb) + start, stream=s, backward=True)
        for frame in c.decode(s):
            i = round(float((frame.pts - start) * tb) * fps)
            if i in wanted:
                out.append(frame.to_ndarray(format="rgb24"))
            if i >= indices[-1]:
                break
    return out


def member_index(shards: Path) -> dict[str, tuple[Path, int, int]]:
    """``key -> (shard, byte offset, size)`` of each sample's video member, found once with
    ``tarfile`` before any timing (what a sequential WebDataset reader learns while streaming)."""
    import tarfile

    out = {}
    for shard in sorted(shards.glob("*/shard-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if ".video." in m.name:
                    out[m.name.split(".video.")[0]] = (shard, m.offset_data, m.size)
    return out


def same_work_clip(
    member: tuple[Path, int, int],
    indices: list[int],
    fps: float,
    pipeline,
    seed: int,
    parts: dict[str, float],
):
    """The baseline doing the loader's work by hand: the video member's bytes read from its tar
    shard, :func:`pyav_clip`'s seek and decode on them, the frames stacked to uint8
    ``(T, 3, H, W)`` and the same torchvision pipeline run under the same seed: float32
    ``(T, 3, h, w)``, the tensor the loader puts in its batch. Seconds spent reading, decoding and
    transforming are added to ``parts``."""
    import numpy as np
    import torch
    from torchvision import tv_tensors

    from task_encoders.seeding import seeded_global_torch

    shard, offset, size = member
    t0 = time.perf_counter()
    with open(shard, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    t1 = time.perf_counter()
    frames = pyav_clip(io.BytesIO(data), indices, fps)
    clip = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)
    t2 = time.perf_counter()
    with seeded_global_torch(seed):
        out = pipeline(tv_tensors.Video(clip)).as_subclass(torch.Tensor).to(torch.float32)
    for part, seconds in (
        ("read", t1 - t0),
        ("decode", t2 - t1),
        ("transform", time.perf_counter() - t2),
    ):
        parts[part] = parts.get(part, 0.0) + seconds
    return out


def from_start_clip(data: bytes, indices: list[int]) -> list:
    """The same frames decoded from the first frame on (no seek): what a seek saves."""
    import av

    out, wanted = [], set(indices)
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        s.codec_context.thread_type = "NONE"
        for i, frame in enumerate(c.decode(s)):
            if i in wanted:
                out.append(frame.to_ndarray(format="rgb24"))
            if i >= indices[-1]:
                break
    return out


def loader_vs_pyav(data_dir: Path, frames: int, epochs: int, batch: int) -> dict:
    """Epoch by epoch, alternating: the loader's batches of one epoch, then the PyAV loop on the
    same clips (same key and epoch, hence the same frame indices), so both see the same machine
    load. The first batch (opening the shards, building the pipeline) is a warm-up for both."""
    from types import SimpleNamespace

    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    paths = {p.stem: p for p in (data_dir / "raw").glob("*.mp4")}
    n = len(paths)
    meta = {k: json.loads((data_dir / "meta" / f"{k}.json").read_text()) for k in paths}
    cfg = load_config(
        {
            "data": {"path": str(data_dir / "shards"), "val_split": None},
            "encoder": {
                "encoder": "video_text",
                "text": {"seq_len": 32},
                "video": {
                    "num_frames": frames,
                    "stride": 2,
                    "transforms": [{"name": "RandomResizedCrop", "size": 112, "scale": [0.5, 1.0]}],
                },
            },
            "loader": {"global_batch_size": batch, "num_workers": 0, "seed": 3},
        }
    )
    loader = TrainLoader(cfg)
    encoder = loader.encoder
    first = next(loader)
    for key in first.keys:
        pyav_clip(
            paths[key],
            encoder.clip_of(
                SimpleNamespace(__key__=key, __subflavors__={"epoch": 0}, meta=meta[key])
            ),
            meta[key]["source"]["fps"],
        )
    members = member_index(data_dir / "shards")
    rounds, step, max_diff, parts = [], 1, 0.0, {}
    per_epoch = n // batch
    for epoch in range(epochs):
        seen, made, t0 = [], {}, time.perf_counter()
        while step < (epoch + 1) * per_epoch:
            b = next(loader)
            for k, video, count in zip(b.keys, b.videos, b.num_frames):
                seen.append((k, step * batch // n))
                made[seen[-1]] = video[:count]
            step += 1
        t_loader = time.perf_counter() - t0
        samples = [
            SimpleNamespace(__key__=k, __subflavors__={"epoch": e}, meta=meta[k]) for k, e in seen
        ]
        clips = [
            (
                s.__key__,
                encoder.clip_of(s),
                s.meta["source"]["fps"],
                encoder.sample_seed(s, "video"),
            )
            for s in samples
        ]
        t0 = time.perf_counter()
        for key, indices, fps, _ in clips:
            got = pyav_clip(paths[key], indices, fps)
            assert len(got) == len(indices), (key, indices, len(got))
        t_pyav = time.perf_counter() - t0
        t0, same = time.perf_counter(), []
        for key, indices, fps, seed in clips:
            same.append(same_work_clip(members[key], indices, fps, encoder.pipeline, seed, parts))
        t_same = time.perf_counter() - t0
        # the same tensors, or the comparison is not of the same work
        for (key, e), clip in zip(seen, same):
            max_diff = max(max_diff, float((made[(key, e)] - clip).abs().max()))
        rounds.append(
            {"clips": len(clips), "loader_s": t_loader, "pyav_s": t_pyav, "same_work_s": t_same}
        )
    loader.close()
    clips = sum(r["clips"] for r in rounds)
    t_loader, t_pyav, t_same = (
        sum(r[k] for r in rounds) for k in ("loader_s", "pyav_s", "same_work_s")
    )
    return {
        "clips": clips,
        "frames_per_clip": frames,
        "loader_s": t_loader,
        "pyav_s": t_pyav,
        "same_work_s": t_same,
        "loader_clips_per_s": clips / t_loader,
        "pyav_clips_per_s": clips / t_pyav,
        "same_work_clips_per_s": clips / t_same,
        "ratio": t_pyav / t_loader,
        "ratio_same_work": t_same / t_loader,
        "same_work_max_abs_diff": max_diff,
        "same_work_ms_per_clip": {k: 1000 * v / clips for k, v in parts.items()},
        "ratio_per_epoch_median": statistics.median(r["pyav_s"] / r["loader_s"] for r in rounds),
        "ratio_same_work_per_epoch_median": statistics.median(
            r["same_work_s"] / r["loader_s"] for r in rounds
        ),
        "rounds": rounds,
    }


def seek_table(files: dict[str, Path], frames: int, repeats: int) -> dict:
    from megatron.energon.av import AVDecoder

    from task_encoders.video_text import decode_frames

    out = {}
    for name, path in files.items():
        data = path.read_bytes()
        import av

        with av.open(io.BytesIO(data)) as c:
            total = sum(1 for p in c.demux(video=0) if p.pts is not None)
        row = {"frames_in_video": total}
        for where, start in (("start", 0), ("middle", total // 2), ("end", total - 2 * frames)):
            indices = [start + 2 * i for i in range(frames)]
            for method, fn in (
                ("ours_ms", lambda: decode_frames(AVDecoder(io.BytesIO(data)), indices, FPS)),
                ("from_start_ms", lambda: from_start_clip(data, indices)),
                (
                    "energon_get_video_clips_ms",
                    lambda: AVDecoder(io.BytesIO(data)).get_video_clips(
                        [((i + 0.5) / FPS, (i + 0.5) / FPS) for i in indices], video_unit="seconds"
                    ),
                ),
            ):
                if method == "energon_get_video_clips_ms" and not name.endswith("webm"):
                    continue
                times = timings(fn, repeats)
                row.setdefault(method, {})[where] = 1000 * statistics.median(times)
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning)
    ap = argparse.ArgumentParser(
        prog="python -m scripts.bench.video", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--size",
        type=int,
        nargs=2,
        default=[320, 240],
        metavar=("W", "H"),
        help="video size (320 240)",
    )
    ap.add_argument("--short", type=float, default=3.0, help="seconds of a short video (3)")
    ap.add_argument("--long", type=float, default=60.0, help="seconds of a long video (60)")
    ap.add_argument(
        "--videos",
        type=int,
        default=16,
        help="videos in the loader comparison, half short, half long (16)",
    )
    ap.add_argument("--frames", type=int, default=8, help="frames per clip (8)")
    ap.add_argument("--epochs", type=int, default=8, help="epochs of the loader comparison (8)")
    ap.add_argument(
        "--repeats", type=int, default=5, help="repeats per seek measurement, median taken (5)"
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        help="keep the generated videos and shards here (default: a temp dir)",
    )
    args = ap.parse_args(argv)
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    record = run_record()

    from converters.convert import ConvertOptions, run_conversion

    tmp = tempfile.TemporaryDirectory() if args.workdir is None else None
    work = Path(tmp.name) if tmp else args.workdir
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for i in range(args.videos):
        path = raw / f"v{i:03d}.mp4"
        if not path.exists():
            make_video(path, args.long if i % 2 else args.short, tuple(args.size), "mp4", i)
            path.with_suffix(".txt").write_text(
                f"video {i}, a square bouncing over a moving gradient\n"
            )
    seek_files = {"short.mp4": raw / "v000.mp4", "long.mp4": raw / "v001.mp4"}
    for name, seconds in (("short.webm", args.short), ("long.webm", args.long)):
        seek_files[name] = work / name
        if not seek_files[name].exists():
            make_video(seek_files[name], seconds, tuple(args.size), "webm", 99)
    generated = time.perf_counter() - t0
    outcome = run_conversion(
        "video",
        {"root": str(raw)},
        ConvertOptions(out=str(work / "shards"), samples_per_shard=4, progress=False),
    )
    assert outcome.ok, outcome.report
    (work / "meta").mkdir(exist_ok=True)
    import tarfile

    for shard in (work / "shards").glob("*/shard-*.tar"):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name.endswith(".text.json"):
                    (work / "meta" / m.name.replace(".text.json", ".json")).write_bytes(
                        tar.extractfile(m).read()
                    )

    lvp = loader_vs_pyav(work, args.frames, args.epochs, batch=4)
    seek = seek_table(seek_files, args.frames, args.repeats)
    result = {
        **record,
        "config": {
            "size": args.size,
            "fps": FPS,
            "gop_frames": FPS,
            "short_s": args.short,
            "long_s": args.long,
            "videos": args.videos,
            "frames_per_clip": args.frames,
            "stride": 2,
            "epochs": args.epochs,
            "num_workers": 0,
            "generate_s": round(generated, 2),
        },
        "loader_vs_pyav": lvp,
        "seek": seek,
    }

    print(
        f"\nclips/s, {args.size[0]}x{args.size[1]} H.264, {args.frames} frames at stride 2, one process "
        f"({lvp['clips']} clips, half from {args.short:g} s, half from {args.long:g} s videos)"
    )
    print(f"  {'energon-platform TrainLoader (video_text)':44s} {lvp['loader_clips_per_s']:8.1f}")
    print(
        f"  {'plain PyAV loop, same clips, decode only':44s} {lvp['pyav_clips_per_s']:8.1f}   "
        f"ratio {lvp['ratio']:.2f} (median over epochs {lvp['ratio_per_epoch_median']:.2f})"
    )
    print(
        f"  {'plain PyAV loop, same work (tar read, crop)':44s} {lvp['same_work_clips_per_s']:8.1f}   "
        f"ratio {lvp['ratio_same_work']:.2f} (median over epochs {lvp['ratio_same_work_per_epoch_median']:.2f}); "
        f"target >= 0.9; its tensors differ from the loader's by at most {lvp['same_work_max_abs_diff']:.3g}"
    )
    print(
        "  same work, ms per clip: "
        + ", ".join(f"{k} {v:.1f}" for k, v in lvp["same_work_ms_per_clip"].items())
    )
    print(
        f"\nms per clip decode (median of {args.repeats}); clip at start / middle / end of the video"
    )
    print(
        f"  {'video':12s} {'frames':>6s}  {'ours (seek)':>24s}  {'from the first frame':>24s}  "
        f"{'Energon get_video_clips':>24s}"
    )
    for name, row in seek.items():
        cells = []
        for method in ("ours_ms", "from_start_ms", "energon_get_video_clips_ms"):
            r = row.get(method)
            cells.append(
                " / ".join(f"{r[w]:6.1f}" for w in ("start", "middle", "end")) if r else "-"
            )
        print(
            f"  {name:12s} {row['frames_in_video']:6d}  {cells[0]:>24s}  {cells[1]:>24s}  {cells[2]:>24s}"
        )
    for fmt in ("mp4", "webm"):

        def ours(n, fmt=fmt):
            return statistics.mean(seek[f"{n}.{fmt}"]["ours_ms"].values())

        result.setdefault("seek_long_over_short", {})[fmt] = ours("long") / ours("short")
    print(
        "  long/short decode time per clip (ours, mean over positions): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in result["seek_long_over_short"].items())
    )
    finish_record(result)
    write_json(args.json, result)
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
