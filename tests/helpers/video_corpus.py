"""Small generated videos for the video tests: every frame carries its own index as 8 black or white
16x8 px blocks along the top (bit 7 first), which survives lossy coding, so a test can read from the
pixels which frames a decoder returned."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np

BITS = 8


def frame_pixels(index: int, width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.empty((height, width, 3), np.uint8)
    img[:] = rng.integers(40, 200, 3, dtype=np.uint8)
    x = int(index * 3) % max(1, width - 16)
    img[height // 2 : height // 2 + 12, x : x + 12] = (230, 30, 30)
    for b in range(BITS):
        img[0:8, b * 16 : (b + 1) * 16] = 255 if (index >> (BITS - 1 - b)) & 1 else 0
    return img


def read_index(frame: np.ndarray) -> int:
    """The index written by :func:`frame_pixels`, from an ``(H, W, 3)`` or ``(3, H, W)`` uint8 frame."""
    if frame.shape[0] == 3:
        frame = frame.transpose(1, 2, 0)
    value = 0
    for b in range(BITS):
        value = value * 2 + int(frame[1:7, b * 16 + 3 : (b + 1) * 16 - 3].mean() > 127)
    return value


def make_video(
    fmt: str = "mp4",
    frames: int = 24,
    fps: int = 12,
    width: int = 128,
    height: int = 96,
    audio: bool = False,
    seed: int = 0,
    gop: int = 12,
) -> bytes:
    """MP4 (H.264), WebM (VP9) or MKV (MPEG-4 part 2), deterministic bytes; a 330 Hz tone if ``audio``."""
    import av

    codec = {"mp4": "libx264", "webm": "libvpx-vp9", "mkv": "mpeg4", "avi": "mpeg4"}[fmt]
    container = {"mkv": "matroska"}.get(fmt, fmt)
    buf = io.BytesIO()
    with av.open(buf, "w", format=container, options={"fflags": "+bitexact"}) as out:
        out.metadata.clear()
        vs = out.add_stream(codec, rate=fps)
        vs.width, vs.height, vs.pix_fmt = width, height, "yuv420p"
        vs.codec_context.thread_count = 1
        vs.codec_context.gop_size = gop
        vs.options = {
            "libx264": {
                "preset": "veryfast",
                "crf": "20",
                "threads": "1",
                "x264-params": "mbtree=0",
            },
            "libvpx-vp9": {
                "threads": "1",
                "crf": "30",
                "b": "0",
                "deadline": "good",
                "cpu-used": "8",
            },
        }.get(codec, {"qscale": "3"})
        if audio:
            rate = 48000 if fmt == "webm" else 16000
            aus = out.add_stream("libopus" if fmt == "webm" else "aac", rate=rate, layout="mono")
            aus.bit_rate = 24000
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_pixels(i, width, height, seed), format="rgb24")
            frame.pts = i
            for packet in vs.encode(frame):
                out.mux(packet)
        for packet in vs.encode(None):
            out.mux(packet)
        if audio:
            n = int(frames / fps * rate)
            wave = (0.3 * np.sin(2 * np.pi * 330.0 * np.arange(n) / rate)).astype(np.float32)[None]
            af = av.AudioFrame.from_ndarray(wave, format="flt", layout="mono")
            af.sample_rate, af.pts = rate, 0
            for packet in [*aus.encode(af), *aus.encode(None)]:
                out.mux(packet)
    return buf.getvalue()


def audio_only_mp4() -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4", options={"fflags": "+bitexact"}) as out:
        aus = out.add_stream("aac", rate=16000, layout="mono")
        wave = np.zeros((1, 16000), np.float32)
        af = av.AudioFrame.from_ndarray(wave, format="flt", layout="mono")
        af.sample_rate, af.pts = 16000, 0
        for packet in [*aus.encode(af), *aus.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


def unknown_codec_mkv() -> bytes:
    """A Matroska file whose video codec id names no codec FFmpeg knows (same length, patched)."""
    data = make_video("mkv", frames=6)
    at = data.index(b"V_MPEG4/ISO/ASP")
    return data[:at] + b"V_QQQQQ/ISO/ASP" + data[at + 15 :]


def caption(i: int) -> str:
    return f"clip {i}: a red block drifts to the right over a plain background"


def write_folder(root: Path, n: int, lengths=(24, 36, 48), formats=("mp4", "mp4", "webm")) -> Path:
    """``n`` videos ``clip_NNN.<fmt>`` + ``.txt`` sidecars; every 4th has audio."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        fmt = formats[i % len(formats)]
        (root / f"clip_{i:03d}.{fmt}").write_bytes(
            make_video(fmt, lengths[i % len(lengths)], audio=i % 4 == 1, seed=i)
        )
        (root / f"clip_{i:03d}.txt").write_text(caption(i) + "\n")
    return root


def video_dataset(base: Path, n: int = 12, samples_per_shard: int = 4) -> Path:
    """A converted video dataset (``clip_000``...) under ``base``; a second call is a no-op."""
    from converters.convert import ConvertOptions, run_conversion

    raw, out = base / "video-raw", base / "video-shards"
    if not raw.exists():
        write_folder(raw, n)
    outcome = run_conversion(
        "video",
        {"root": str(raw)},
        ConvertOptions(out=str(out), samples_per_shard=samples_per_shard, progress=False),
    )
    assert outcome.ok and outcome.report["totals"]["skipped"] == 0, outcome.report
    return out


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".convert" not in p.relative_to(root).parts
    }
