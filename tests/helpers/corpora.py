"""Small raw corpora for converter tests, built on the fly (images drawn with PIL, audio
synthesised with numpy and encoded with PyAV), including every kind of bad input."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

COLORS = ["red", "green", "blue", "yellow", "purple", "orange"]
RGB = {
    "red": (220, 30, 30),
    "green": (30, 180, 60),
    "blue": (40, 60, 220),
    "yellow": (240, 220, 40),
    "purple": (140, 50, 170),
    "orange": (250, 140, 20),
}


def image_bytes(i: int, size=(40, 32), fmt="PNG", exif_orientation: int | None = None) -> bytes:
    """A small deterministic image: a coloured square on grey, shifted by ``i``."""
    img = Image.new("RGB", size, (128, 128, 128))
    color = RGB[COLORS[i % len(COLORS)]]
    x = (i * 7) % (size[0] - 10)
    for dx in range(10):
        for dy in range(10):
            img.putpixel((x + dx, 5 + dy), color)
    buf = io.BytesIO()
    kwargs = {}
    if exif_orientation:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        kwargs["exif"] = exif
    img.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def caption(i: int) -> str:
    return f"a {COLORS[i % len(COLORS)]} square on a grey background, number {i}"


def tone_bytes(i: int, seconds=0.3, rate=16000, fmt="flac") -> bytes:
    """A sine tone encoded with PyAV (``flac`` or ``wav``)."""
    import av

    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * (220 + 20 * i) * t) * 32767).astype(np.int16)[None, :]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream("flac" if fmt == "flac" else "pcm_s16le", rate=rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = rate
        for p in stream.encode(frame):
            out.mux(p)
        for p in stream.encode(None):
            out.mux(p)
    return buf.getvalue()


BAD_IMAGES = {
    "zero": (b"", "empty_file"),
    "text": (b"this is not an image at all\n" * 4, "not_an_image"),
    "truncated": (None, "undecodable_image"),  # filled in by make_coco
}


def make_coco(root: Path, n_good: int = 20, bad: bool = False) -> tuple[Path, Path, dict]:
    """A COCO-captions corpus. With ``bad``: zero-byte, non-image, truncated, missing file, an
    image without captions, a duplicate image id. Returns (annotations, images_dir, expected
    skip counts by reason)."""
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    img_rows, anns = [], []
    for i in range(1, n_good + 1):
        name = f"img_{i:04d}.png"
        (images / name).write_bytes(image_bytes(i))
        img_rows.append({"id": i, "file_name": name, "width": 40, "height": 32})
        anns += [
            {"id": 10 * i, "image_id": i, "caption": caption(i)},
            {"id": 10 * i + 1, "image_id": i, "caption": f"picture {i}"},
        ]
    expected = {}
    if bad:
        bad_files = {
            "zero.png": b"",
            "text.png": b"this is not an image at all\n" * 4,
            "truncated.png": image_bytes(3, size=(64, 64))[:120],
        }
        for j, (name, data) in enumerate(bad_files.items(), start=1001):
            (images / name).write_bytes(data)
            img_rows.append({"id": j, "file_name": name})
            anns.append({"id": 10 * j, "image_id": j, "caption": "broken"})
        img_rows.append({"id": 1004, "file_name": "missing.png"})
        anns.append({"id": 10040, "image_id": 1004, "caption": "missing"})
        (images / "nocap.png").write_bytes(image_bytes(5))
        img_rows.append({"id": 1005, "file_name": "nocap.png"})
        anns.append({"id": 10050, "image_id": 1005, "caption": "   "})
        img_rows.append({"id": 1, "file_name": "img_0002.png"})  # duplicate id
        expected = {
            "empty_file": 1,
            "not_an_image": 1,
            "undecodable_image": 1,
            "missing_file": 1,
            "empty_text": 1,
            "duplicate_id": 1,
        }
    ann_path = root / "captions.json"
    ann_path.write_text(json.dumps({"images": img_rows, "annotations": anns}))
    return ann_path, images, expected


def make_librispeech(
    root: Path, speakers=(19, 26), chapters=(198, 227), utts=3, bad: bool = False
) -> tuple[Path, dict]:
    """LibriSpeech layout with flac tones. With ``bad``: an undecodable flac, a transcript line
    without audio, an audio file without transcript, an empty transcript, a zero-byte file."""
    n = 0
    for spk in speakers:
        for chap in chapters:
            d = root / str(spk) / str(chap)
            d.mkdir(parents=True, exist_ok=True)
            lines = []
            for u in range(utts):
                utt = f"{spk}-{chap}-{u:04d}"
                (d / f"{utt}.flac").write_bytes(tone_bytes(n))
                lines.append(f"{utt} TONE NUMBER {n}")
                n += 1
            (d / f"{spk}-{chap}.trans.txt").write_text("\n".join(lines) + "\n")
    expected = {}
    if bad:
        d = root / str(speakers[0]) / str(chapters[0])
        trans = d / f"{speakers[0]}-{chapters[0]}.trans.txt"
        extra = []
        (d / f"{speakers[0]}-{chapters[0]}-0100.flac").write_bytes(b"fLaC" + b"\x00" * 50)
        extra.append(f"{speakers[0]}-{chapters[0]}-0100 BROKEN AUDIO")
        extra.append(f"{speakers[0]}-{chapters[0]}-0101 NO AUDIO FILE")
        # no transcript line
        (d / f"{speakers[0]}-{chapters[0]}-0102.flac").write_bytes(tone_bytes(1))
        (d / f"{speakers[0]}-{chapters[0]}-0103.flac").write_bytes(tone_bytes(2))
        extra.append(f"{speakers[0]}-{chapters[0]}-0103 ")
        (d / f"{speakers[0]}-{chapters[0]}-0104.flac").write_bytes(b"")
        extra.append(f"{speakers[0]}-{chapters[0]}-0104 EMPTY FILE")
        trans.write_text(trans.read_text() + "\n".join(extra) + "\n")
        expected = {"undecodable_audio": 1, "missing_file": 1, "empty_text": 2, "empty_file": 1}
    return root, expected


def make_image_files(root: Path, n: int, fmt: str = "PNG") -> list[str]:
    """``n`` image files under ``root/img``; returns their paths relative to ``root``."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    ext = {"PNG": "png", "JPEG": "jpg"}[fmt]
    rels = []
    for i in range(n):
        rel = f"img/{i:05d}.{ext}"
        (root / rel).write_bytes(image_bytes(i, fmt=fmt))
        rels.append(rel)
    return rels


def folder_corpus(root: Path, n: int = 6) -> Path:
    """``n`` images with a ``.txt`` caption beside each, as the folder converter reads them."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"{i:03d}.png").write_bytes(image_bytes(i))
        (root / f"{i:03d}.txt").write_text(caption(i))
    return root


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
    """``files`` (name → audio bytes) written under ``root`` with a JSONL manifest naming each; the
    manifest's path."""
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, data in files.items():
        (root / name).write_bytes(data)
        lines.append(
            json.dumps({"audio_filepath": name, "text": f"clip {name}", "id": name.split(".")[0]})
        )
    (root / "m.jsonl").write_text("\n".join(lines) + "\n")
    return str(root / "m.jsonl")


def numbered_docs(path: Path, n: int = 5) -> Path:
    """``n`` JSON lines ``{"id": i, "text": "document number i"}`` written to ``path``; returns it."""
    path.write_text(
        "".join(json.dumps({"id": i, "text": f"document number {i}"}) + "\n" for i in range(n))
    )
    return path
