#!/usr/bin/env python3
"""Regenerate the project's embedded default corpora, byte for byte.

Writes five small corpora under ``--out`` (default: ``<repo>/data``):

``coco_mini/``
    COCO-captions layout: ``images/`` plus ``captions.json`` with ``info``, ``licenses``,
    ``images`` (``id``, ``file_name``, ``width``, ``height``) and ``annotations`` (``id``,
    ``image_id``, ``caption``).

    * Real photographs (and three graphics) bundled with scikit-image, read straight from the
      files that ship inside the installed ``skimage/data`` folder (never through pooch, so never
      from the network); a photo whose file is missing is skipped and its id left unused. Each is
      downscaled so its longest side is at most 512 px and stored as baseline JPEG quality 90;
      grayscale sources stay grayscale (mode ``L``). Ids 1..99, 2-5 hand-written captions each.
    * Exactly one of them (the cat, ``chelsea``) is stored with its pixels rotated 90 degrees
      counter-clockwise and an EXIF Orientation tag of 6, so a reader that applies the EXIF
      transposition (``PIL.ImageOps.exif_transpose``) gets the upright landscape photo back.
      ``info["exif_rotated_image_id"]`` names it; its ``width``/``height`` entries, like every
      other image's, are those of the upright (displayed) image, i.e. after the transposition.
    * 300 generated PNG images (64-128 px a side, ids 101..400) with one or two simple shapes or a
      stripe/checker pattern, drawn from a seeded RNG, each with 2 captions computed from the
      drawing itself (colour, shape, size class and the third of the image the shape's centre
      lies in), so every caption is true of its picture.
    * ``conversations.json``: 27 hand-written conversations about the photos in LLaVA's instruction
      format (``{"id", "image" | "images", "conversations": [{"from": "human" | "gpt" | "system",
      "value"}]}``, image paths relative to ``images/``): single- and multi-turn questions, two
      with two photos, two text only (``CONVERSATIONS`` in ``default_data/conversations.py``).
      ``energon-platform convert llava --json data/coco_mini/conversations.json --images
      data/coco_mini/images`` converts it.

``librispeech_mini/``
    LibriSpeech layout ``SPK/CHAP/SPK-CHAP-UTT.flac`` + ``SPK/CHAP/SPK-CHAP.trans.txt``:
    3 speakers x 2 chapters x 8 utterances of synthesised musical notes, 16 kHz mono FLAC
    (PCM_16), 0.6-2.5 s each. The transcript spells out what is played ("NOTE C NOTE E NOTE G",
    "THREE RISING NOTES C E G", "A C MAJOR CHORD", "NOTE A PAUSE NOTE D", ...). A speaker is a
    timbre (its harmonic mix) and an octave; a chapter is a tempo.

``text_mini/``
    ``documents.jsonl``: one JSON object ``{"id", "topic", "text"}`` per line, about 80 short
    plain-English documents (1-5 sentences) built from fixed templates and word lists: what the
    coco_mini photos and generated shapes show, the notes, speakers, chapters, chords and
    transcripts of librispeech_mini (frequencies and chord spellings computed, not typed), and
    how shards, loaders and checkpoints work. Converted with ``energon-platform convert text
    --manifest data/text_mini/documents.jsonl --id-column id``. No RNG, no network, no model.

``video_mini/``
    36 generated videos of moving shapes, 96x72 at 12 fps, 2-3 s (four of 8 s):
    ``clips/video_NNN.mp4`` (H.264) or ``.webm`` (VP9, every sixth) with ``video_NNN.txt`` (two
    captions, one per line), and ``manifest.csv`` with WebVid's ``videoid,name,path`` columns. A
    circle, square or triangle of a named colour crosses a plain background left to right, right
    to left, down, up or along a diagonal; in some a second shape travels the opposite way, some
    carry a steady 440 Hz tone (ALAC or Opus). The captions are computed from those choices, so they
    say truthfully what moves, its colour and its direction. Encoded with one thread, fixed
    settings and bitexact muxing (no dates, no random ids).

``mesh_mini/``
    30 generated 3D shapes in ``shapes/shape_NNN.<ext>`` with ``shape_NNN.txt`` (two captions),
    and a Cap3D-style ``captions.csv`` (``uid,caption,path``) naming the same files: cubes, slabs
    and columns (OBJ with quads), spheres and ellipsoids (binary PLY with vertex colours),
    cylinders (OFF), cones (binary STL), pyramids (ASCII STL), rings (GLB), and point clouds:
    sphere shells (ASCII PLY with colours), helices (NPY ``(N, 6)``) and flat squares (NPY
    ``(N, 3)``). The captions are computed from the shape, its proportions and (where the file
    has them) its colours, so they survive normalisation to the unit sphere. Meshes come from
    ``trimesh.creation``; every file except the GLB is written by the small writers of
    ``default_data/mesh.py`` (fixed number formatting), the GLB by trimesh's exporter.

Everything is deterministic: fixed seeds, fixed lists, no timestamps in any file (JPEG carries
no EXIF except the single orientation tag, PNG has no tIME chunk, FLAC has no date). Output is
byte-identical across runs with the same library versions (Pillow, libjpeg, zlib, libsndfile
and scikit-image's bundled files); ``tests/project/test_default_data.py`` checks that.

This file is the command line; the generators live in ``scripts/default_data/``, one module per
corpus (``coco`` with ``photos``, ``shapes`` and ``conversations``; ``librispeech``, ``text``,
``video``, ``mesh``) and ``common`` (the seed, English helpers).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from default_data.coco import make_coco
from default_data.librispeech import make_librispeech
from default_data.mesh import make_mesh_mini
from default_data.text import TEXT_FILE, make_text
from default_data.video import make_video_mini

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "data"

#: ``--only`` choice -> (folder under ``--out``, the generator that writes it and returns its summary)
GENERATORS = {
    "coco": ("coco_mini", make_coco),
    "librispeech": ("librispeech_mini", make_librispeech),
    "text": ("text_mini", make_text),
    "video": ("video_mini", make_video_mini),
    "3d": ("mesh_mini", make_mesh_mini),
}


def _dir_size(p: Path) -> tuple[int, int]:
    files = [f for f in p.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\n\nWrites coco_mini/ (scikit-image photos + "
        "300 generated shape images, COCO captions json) and librispeech_mini/ (48 synthesised "
        "note sequences, FLAC + trans.txt) and text_mini/ (short documents, JSONL) and "
        "video_mini/ (36 generated videos of moving shapes with captions) and mesh_mini/ "
        "(30 generated 3D shapes with captions) under --out. "
        "Deterministic: two runs give "
        "byte-identical files. See the module docstring for details.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"output folder (default: {DEFAULT_OUT.relative_to(REPO_ROOT)}/ in the repo)",
    )
    ap.add_argument(
        "--only",
        choices=list(GENERATORS),
        default=None,
        help="regenerate only one of the corpora",
    )
    return ap


def generate(out: Path, only: str | None) -> dict:
    """Regenerate every corpus (or ``only`` that one) under ``out``, each folder rewritten from
    scratch, in ``GENERATORS`` order; returns each generator's summary by its ``--only`` name."""
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, (folder, make) in GENERATORS.items():
        if only in (None, name):
            if (out / folder).exists():
                shutil.rmtree(out / folder)
            summary[name] = make(out)
    return summary


def print_summary(out: Path, summary: dict) -> None:
    """One line (or three, for coco_mini) per corpus written, then the total under ``out``."""
    if "coco" in summary:
        c = summary["coco"]
        n, size = _dir_size(out / "coco_mini")
        print(
            f"coco_mini: {c['n_images']} images ({len(c['photos'])} from skimage.data, "
            f"{c['n_generated']} generated), {c['n_captions']} captions, "
            f"{n} files, {size / 1e6:.2f} MB"
        )
        print(f"  photos: {', '.join(c['photos'])}")
        print(
            f"  conversations.json: {c['n_conversations']} hand-written conversations about the photos"
        )
    if "librispeech" in summary:
        s = summary["librispeech"]
        n, size = _dir_size(out / "librispeech_mini")
        print(
            f"librispeech_mini: {s['n_utterances']} utterances, {s['total_seconds']:.1f} s "
            f"({s['min_seconds']:.2f}-{s['max_seconds']:.2f} s each), {n} files, "
            f"{size / 1e6:.2f} MB"
        )
    if "text" in summary:
        t = summary["text"]
        print(
            f"text_mini: {t['n_documents']} documents, {t['n_words']} words, "
            f"{(out / 'text_mini' / TEXT_FILE).stat().st_size / 1e3:.1f} kB"
        )
    if "video" in summary:
        v = summary["video"]
        n, size = _dir_size(out / "video_mini")
        print(
            f"video_mini: {v['n_videos']} videos ({v['n_webm']} WebM, {v['n_tone']} with a tone), "
            f"{v['seconds']:.1f} s in all, {n} files, {size / 1e6:.2f} MB"
        )
    if "3d" in summary:
        n, size = _dir_size(out / "mesh_mini")
        print(f"mesh_mini: {summary['3d']['n_shapes']} shapes, {n} files, {size / 1e3:.0f} kB")
    n, size = _dir_size(out)
    print(f"total under {out}: {n} files, {size / 1e6:.2f} MB")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    print_summary(args.out, generate(args.out, args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
