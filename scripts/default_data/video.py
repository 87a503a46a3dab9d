"""``video_mini/``: generated videos of moving shapes with computed captions."""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .common import SEED, article
from .shapes import draw_shape

VIDEO_W, VIDEO_H, VIDEO_FPS = 96, 72, 12
VIDEO_BITEXACT = {"fflags": "+bitexact"}  # no random Matroska segment id, no date, no encoder tag
VIDEO_COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 90, 230),
    "yellow": (240, 220, 40),
    "white": (245, 245, 245),
    "orange": (245, 140, 30),
    "purple": (150, 60, 200),
}
VIDEO_BACKGROUNDS = {
    "black": (10, 10, 10),
    "grey": (110, 110, 110),
    "dark blue": (15, 20, 70),
    "dark green": (15, 60, 25),
}
# name -> (start (x, y) and end (x, y) as fractions of the frame, how the caption says it)
VIDEO_MOTIONS = {
    "right": ((0.15, 0.5), (0.85, 0.5), "moves from left to right"),
    "left": ((0.85, 0.5), (0.15, 0.5), "moves from right to left"),
    "down": ((0.5, 0.18), (0.5, 0.82), "moves down from the top to the bottom"),
    "up": ((0.5, 0.82), (0.5, 0.18), "moves up from the bottom to the top"),
    "diagonal": (
        (0.15, 0.18),
        (0.85, 0.82),
        "moves diagonally from the top left to the bottom right",
    ),
    "anti-diagonal": (
        (0.15, 0.82),
        (0.85, 0.18),
        "moves diagonally from the bottom left to the top right",
    ),
}
VIDEO_SHAPES = ("circle", "square", "triangle")


def _video_plan(rng: random.Random) -> list[dict]:
    """36 videos: every motion with every shape twice (colours and backgrounds drawn from ``rng``);
    every 6th is WebM (VP9) instead of MP4 (H.264); 6 carry a tone; 4 are 8 s long (the rest 2-3 s);
    6 have a second shape moving the opposite way."""
    plan = []
    for i, (motion, shape) in enumerate(
        (m, s) for _ in range(2) for m in VIDEO_MOTIONS for s in VIDEO_SHAPES
    ):
        bg = rng.choice(sorted(VIDEO_BACKGROUNDS))
        colour = rng.choice(sorted(VIDEO_COLOURS))
        second = None
        if i % 6 == 5:
            second = (rng.choice(sorted(set(VIDEO_COLOURS) - {colour})), rng.choice(VIDEO_SHAPES))
        plan.append(
            {
                "id": f"video_{i:03d}",
                "motion": motion,
                "shape": shape,
                "colour": colour,
                "background": bg,
                "second": second,
                "webm": i % 6 == 3,
                "tone": i % 6 == 1,
                "frames": 96 if i % 9 == 4 else rng.choice((24, 30, 36)),
            }
        )
    return plan


def _video_captions(v: dict) -> list[str]:
    what = f"{article(v['colour'])} {v['colour']} {v['shape']}"
    text = f"{what[0].upper()}{what[1:]} {VIDEO_MOTIONS[v['motion']][2]} on a {v['background']} background"
    if v["second"]:
        colour, shape = v["second"]
        text += f", while {article(colour)} {colour} {shape} moves the opposite way"
    if v["tone"]:
        text += ", with a steady tone playing"
    seconds = v["frames"] / VIDEO_FPS
    short = (
        f"{v['colour']} {v['shape']} moving {v['motion'].replace('-', ' ')}, "
        f"{seconds:g} seconds, {v['background']} background"
    )
    return [text + ".", short]


def _draw_video_frame(v: dict, t: float) -> np.ndarray:
    img = Image.new("RGB", (VIDEO_W, VIDEO_H), VIDEO_BACKGROUNDS[v["background"]])
    d = ImageDraw.Draw(img)
    r = 9.0
    (x0, y0), (x1, y1), _ = VIDEO_MOTIONS[v["motion"]]
    shapes = [(v["shape"], v["colour"], x0 + (x1 - x0) * t, y0 + (y1 - y0) * t)]
    if v["second"]:  # the same path backwards
        shapes.append((v["second"][1], v["second"][0], x1 + (x0 - x1) * t, y1 + (y0 - y1) * t))
    for shape, colour, fx, fy in shapes:
        draw_shape(
            d,
            shape,
            fx * VIDEO_W,
            fy * VIDEO_H,
            r,
            VIDEO_COLOURS[colour],
            VIDEO_BACKGROUNDS[v["background"]],
        )
    return np.asarray(img)


def encode_video_file(v: dict) -> bytes:
    """One video: H.264 in MP4 (or VP9 in WebM), one thread, fixed settings, bitexact muxing
    (x264's macroblock tree is off: with it the bytes vary from run to run at these sizes);
    a 440 Hz tone as ALAC (MP4) or Opus (WebM) when ``v["tone"]``: ALAC is an integer codec,
    while FFmpeg's AAC encoder gives other bytes on another CPU (its float transforms follow the
    CPU's instruction set), and these files must reproduce on any machine."""

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="webm" if v["webm"] else "mp4", options=VIDEO_BITEXACT) as out:
        out.metadata.clear()
        vs = out.add_stream("libvpx-vp9" if v["webm"] else "libx264", rate=VIDEO_FPS)
        vs.width, vs.height, vs.pix_fmt = VIDEO_W, VIDEO_H, "yuv420p"
        vs.codec_context.thread_count = 1
        vs.codec_context.gop_size = (
            VIDEO_FPS  # a keyframe every second: clips seek close to their start
        )
        vs.options = (
            {"threads": "1", "crf": "32", "b": "0", "deadline": "good", "cpu-used": "4"}
            if v["webm"]
            else {"preset": "medium", "crf": "26", "threads": "1", "x264-params": "mbtree=0"}
        )
        if v["tone"]:
            rate = 48000 if v["webm"] else 16000
            aus = out.add_stream("libopus" if v["webm"] else "alac", rate=rate, layout="mono")
            if v["webm"]:
                aus.bit_rate = 24000
        for i in range(v["frames"]):
            frame = av.VideoFrame.from_ndarray(
                _draw_video_frame(v, i / (v["frames"] - 1)), format="rgb24"
            )
            frame.pts = i
            for packet in vs.encode(frame):
                out.mux(packet)
        for packet in vs.encode(None):
            out.mux(packet)
        if v["tone"]:
            n = int(v["frames"] / VIDEO_FPS * rate)
            wave = 0.3 * np.sin(2 * np.pi * 440.0 * np.arange(n) / rate)[None]
            frame = (
                av.AudioFrame.from_ndarray(wave.astype(np.float32), format="flt", layout="mono")
                if v["webm"]
                else av.AudioFrame.from_ndarray(
                    np.round(wave * 32767).astype(np.int16), format="s16p", layout="mono"
                )
            )
            frame.sample_rate, frame.pts = rate, 0
            for packet in [*aus.encode(frame), *aus.encode(None)]:
                out.mux(packet)
    return buf.getvalue()


def make_video_mini(out: Path) -> dict:
    """``video_mini/clips/video_NNN.{mp4,webm}`` + ``video_NNN.txt`` (two captions, one per line)
    and ``video_mini/manifest.csv`` with WebVid's ``videoid,name,path`` columns for the same clips."""
    import csv

    root = out / "video_mini"
    (root / "clips").mkdir(parents=True)
    rows = []
    plan = _video_plan(random.Random(SEED + 3))
    for v in plan:
        name = f"{v['id']}.{'webm' if v['webm'] else 'mp4'}"
        (root / "clips" / name).write_bytes(encode_video_file(v))
        captions = _video_captions(v)
        (root / "clips" / f"{v['id']}.txt").write_text("\n".join(captions) + "\n", encoding="utf-8")
        rows.append({"videoid": v["id"], "name": captions[0], "path": f"clips/{name}"})
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=["videoid", "name", "path"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    (root / "manifest.csv").write_text(text.getvalue(), encoding="utf-8")
    return {
        "n_videos": len(plan),
        "n_webm": sum(v["webm"] for v in plan),
        "n_tone": sum(v["tone"] for v in plan),
        "seconds": sum(v["frames"] for v in plan) / VIDEO_FPS,
    }
