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
      with two photos, two text only (``CONVERSATIONS`` below). ``energon-platform convert llava
      --json data/coco_mini/conversations.json --images data/coco_mini/images`` converts it.

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
    carry a steady 440 Hz tone (AAC or Opus). The captions are computed from those choices, so they
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
    ``trimesh.creation``; every file except the GLB is written by the small writers below (fixed
    number formatting), the GLB by trimesh's exporter.

Everything is deterministic: fixed seeds, fixed lists, no timestamps in any file (JPEG carries
no EXIF except the single orientation tag, PNG has no tIME chunk, FLAC has no date). Output is
byte-identical across runs with the same library versions (Pillow, libjpeg, zlib, libsndfile
and scikit-image's bundled files); ``tests/project/test_default_data.py`` checks that.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import random
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
from PIL import Image, ImageDraw

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "data"

SEED = 20240611
MAX_SIDE = 512
JPEG_OPTS = dict(quality=90, optimize=False, progressive=False, subsampling=2)
EXIF_ORIENTATION_TAG = 0x0112

# --------------------------------------------------------------------------------------------
# Real photos from skimage/data
# --------------------------------------------------------------------------------------------
# (image id, file inside skimage/data, kind, captions). Captions were written by looking at the
# pictures. kind: "photo" (camera, microscope or telescope image) or "graphic" (drawn image).
PHOTOS: list[tuple[int, str, str, list[str]]] = [
    (
        1,
        "astronaut.png",
        "photo",
        [
            "A smiling astronaut in an orange spacesuit posing beside an American flag.",
            "Portrait of a woman astronaut in an orange flight suit with a helmet in front of her.",
            "An astronaut with short hair smiling, with a model of the space shuttle behind her.",
            "Official portrait of an astronaut next to a flag and a space shuttle model.",
        ],
    ),
    (
        2,
        "brick.png",
        "photo",
        [
            "A black and white close-up of a brick wall with light mortar lines.",
            "Long narrow bricks laid in staggered rows, seen at an angle.",
            "Grayscale texture of a brick surface.",
        ],
    ),
    (
        3,
        "camera.png",
        "photo",
        [
            "A black and white photo of a man looking through a camera on a tripod.",
            "A man in a dark coat filming with a camera mounted on a tripod in a grassy field.",
            "A cameraman standing on a lawn with buildings far in the background.",
        ],
    ),
    (
        4,
        "cell.png",
        "photo",
        [
            "A microscope image of a single round cell floating in liquid.",
            "A bright round cell on a gray background, seen under a microscope.",
            "Grayscale microscopy of one cell to the right of the frame.",
        ],
    ),
    (
        5,
        "chelsea.png",
        "photo",
        [
            "A close-up of a tabby cat's face with green eyes.",
            "A brown striped cat looking slightly to the side.",
            "The face of a tabby cat with a pink nose and long white whiskers.",
        ],
    ),
    (
        6,
        "clock_motion.png",
        "photo",
        [
            "A round wall clock blurred by motion against a plain gray wall.",
            "A grayscale photo of a clock smeared sideways by camera motion.",
            "A blurry bright round object in the middle of a gray background.",
        ],
    ),
    (
        7,
        "coffee.png",
        "photo",
        [
            "A cup of espresso on a red saucer with a small spoon.",
            "A red and white coffee cup on a wooden table.",
            "An espresso with golden crema in a red cup, seen from above.",
        ],
    ),
    (
        8,
        "coins.png",
        "photo",
        [
            "Ancient coins arranged in four rows on a dark background.",
            "A black and white photo of twenty four old coins.",
            "Rows of ancient coins showing heads and standing figures.",
        ],
    ),
    (
        9,
        "color.png",
        "graphic",
        [
            "A colour wheel with a white centre and every hue around it, on a black background.",
            "A circular chart of hues that fade from white in the middle to dark at the edge.",
            "A rainbow coloured disc showing red, yellow, green, cyan, blue and magenta.",
        ],
    ),
    (
        10,
        "grass.png",
        "photo",
        [
            "A grayscale close-up of grass and small leaves.",
            "Black and white texture of a lawn seen from above.",
            "Dense blades of grass photographed from above.",
        ],
    ),
    (
        11,
        "gravel.png",
        "photo",
        [
            "A grayscale image of small gravel stones.",
            "A close-up texture of crushed rock.",
            "A dense layer of angular gravel seen from above.",
        ],
    ),
    (
        12,
        "horse.png",
        "graphic",
        [
            "A black silhouette of a horse on a white background.",
            "The side view of a standing horse drawn in solid black.",
            "A horse shape facing right.",
        ],
    ),
    (
        13,
        "hubble_deep_field.jpg",
        "photo",
        [
            "A deep space telescope image full of distant galaxies.",
            "A black sky dotted with many small colourful galaxies.",
            "The Hubble deep field showing thousands of faint galaxies.",
        ],
    ),
    (
        14,
        "ihc.png",
        "photo",
        [
            "A microscope image of tissue stained brown and blue.",
            "A stained tissue sample with brown cell membranes and blue nuclei.",
            "Immunohistochemistry slide of glands in tissue under a microscope.",
        ],
    ),
    (
        15,
        "logo.png",
        "graphic",
        [
            "The scikit-image logo, a green and orange circle with a snake.",
            "A round logo split into green and orange halves by a white curved line.",
            "A circular emblem showing the head of a snake in orange and green.",
        ],
    ),
    (
        16,
        "microaneurysms.png",
        "photo",
        [
            "A small grayscale crop of a retina with blood vessels and two dark spots.",
            "A close-up retinal image with dark vessel lines and small round dots.",
        ],
    ),
    (
        17,
        "moon.png",
        "photo",
        [
            "A grayscale image of the surface of the moon with small craters.",
            "A close-up of gray lunar terrain with a bright crater in the upper left.",
            "The surface of the moon seen from above.",
        ],
    ),
    (
        18,
        "motorcycle_left.png",
        "photo",
        [
            "A red motorcycle parked in a garage.",
            "A red motorbike standing on its stand in front of shelves.",
            "A red and black motorcycle in a cluttered workshop.",
        ],
    ),
    (
        19,
        "page.png",
        "photo",
        [
            "A photo of a printed page about region-based segmentation.",
            "A grayscale picture of a book page with a heading and a line of code.",
            "Printed text explaining how to find markers of coins and background.",
        ],
    ),
    (
        20,
        "retina.jpg",
        "photo",
        [
            "A colour photo of the back of a human eye showing blood vessels.",
            "A retina image with red vessels and a bright optic disc on the left.",
            "An orange-red retina on a black background.",
        ],
    ),
    (
        21,
        "rocket.jpg",
        "photo",
        [
            "A rocket on a launch pad at dusk between tall towers.",
            "A white rocket standing upright under a dark blue evening sky.",
            "A launch pad with bright lights and tall towers around a rocket.",
        ],
    ),
    (
        22,
        "text.png",
        "photo",
        [
            "Handwritten mathematical notes photographed at an angle.",
            "A grayscale image of handwritten equations on paper.",
            "A close-up of pen writing with fractions and symbols.",
        ],
    ),
]
EXIF_ROTATED_SOURCE = "chelsea.png"
EXIF_ORIENTATION = 6  # "rotate 90 degrees clockwise to display"


def skimage_data_dir() -> Path | None:
    """The folder of sample files shipped inside the installed scikit-image (no pooch cache)."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("skimage")
    except Exception:  # pragma: no cover - scikit-image missing or broken
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "data"
    return d if d.is_dir() else None


def skimage_registry() -> dict[str, str]:
    """sha256 of scikit-image's data files, to make sure a local file is the canonical one."""
    try:
        from skimage.data._registry import registry  # private, but only used as a check

        return dict(registry)
    except Exception:  # pragma: no cover
        return {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_photo(path: Path) -> Image.Image:
    """Open a sample file as a fresh image (no metadata carried over), mode L or RGB."""
    with Image.open(path) as src:
        src.load()
        im = src.copy()
    if im.mode in ("RGBA", "LA", "P"):
        im = im.convert("RGBA")
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        white.alpha_composite(im)
        im = white.convert("RGB")
    elif im.mode not in ("L", "RGB"):
        im = im.convert("RGB")
    if im.mode == "RGB":
        a = np.asarray(im)
        if np.array_equal(a[..., 0], a[..., 1]) and np.array_equal(a[..., 0], a[..., 2]):
            im = im.convert("L")  # a gray picture stored as RGB(A): keep it grayscale
    # Rebuild from raw pixels so nothing of the source's info dict (icc, dpi, exif) survives.
    im = Image.frombytes(im.mode, im.size, im.tobytes())
    w, h = im.size
    if max(w, h) > MAX_SIDE:
        s = MAX_SIDE / max(w, h)
        im = im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.Resampling.LANCZOS)
    return im


def write_photos(img_dir: Path, images: list, annotations: list, info: dict) -> list[str]:
    ddir = skimage_data_dir()
    reg = skimage_registry()
    used = []
    for image_id, fname, kind, captions in PHOTOS:
        path = ddir / fname if ddir is not None else None
        if path is None or not path.is_file():
            print(f"  skip {fname}: not in the installed scikit-image", file=sys.stderr)
            continue
        want = reg.get(f"data/{fname}")
        if want is not None and _sha256(path) != want:
            print(f"  skip {fname}: sha256 differs from scikit-image's registry", file=sys.stderr)
            continue
        im = load_photo(path)
        width, height = im.size  # upright size, recorded in captions.json
        out_name = f"COCO_mini_{image_id:012d}.jpg"
        opts = dict(JPEG_OPTS)
        if fname == EXIF_ROTATED_SOURCE:
            # Store the pixels rotated 90 degrees counter-clockwise; orientation 6 tells a viewer
            # to rotate them 90 degrees clockwise, which gives the upright photo back.
            im = im.transpose(Image.Transpose.ROTATE_90)
            exif = Image.Exif()
            exif[EXIF_ORIENTATION_TAG] = EXIF_ORIENTATION
            opts["exif"] = exif.tobytes()
            info["exif_rotated_image_id"] = image_id
            info["exif_orientation"] = EXIF_ORIENTATION
        im.save(img_dir / out_name, format="JPEG", **opts)
        images.append(
            {
                "id": image_id,
                "file_name": out_name,
                "width": width,
                "height": height,
                "license": 1,
                "source": f"skimage.data/{fname}",
                "kind": kind,
            }
        )
        for cap in captions:
            annotations.append({"image_id": image_id, "caption": cap})
        used.append(fname)
    return used


# --------------------------------------------------------------------------------------------
# Generated shape images
# --------------------------------------------------------------------------------------------
N_GENERATED = 300
FIRST_GENERATED_ID = 101
SUPERSAMPLE = 4

COLOURS = {  # name -> RGB, all clearly that colour
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (245, 215, 30),
    "orange": (245, 135, 20),
    "purple": (130, 50, 170),
    "pink": (245, 130, 190),
    "cyan": (40, 200, 220),
    "brown": (125, 75, 35),
    "black": (15, 15, 15),
    "white": (250, 250, 250),
    "gray": (128, 128, 128),
}
BACKGROUNDS = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "light blue": (180, 210, 240),
    "light gray": (210, 210, 210),
    "light green": (190, 235, 190),
    "beige": (240, 225, 195),
    "dark blue": (20, 30, 85),
    "dark gray": (60, 60, 60),
    "light yellow": (255, 250, 200),
    "dark green": (20, 70, 30),
}
SHAPES = ["circle", "square", "triangle", "star", "diamond", "hexagon", "cross", "ring"]
PATTERNS = ["horizontal stripes", "vertical stripes", "checkerboard"]
SIZES = {"small": (0.13, 0.17), "medium": (0.20, 0.25), "large": (0.30, 0.40)}  # radius / min side
NUM_WORDS = {3: "three", 4: "four", 5: "five", 6: "six"}
POS_NAMES = [
    ["top left", "top", "top right"],
    ["left", "center", "right"],
    ["bottom left", "bottom", "bottom right"],
]
POS_PHRASES = {
    "top left": "in the top left corner",
    "top": "at the top",
    "top right": "in the top right corner",
    "left": "on the left",
    "center": "in the center",
    "right": "on the right",
    "bottom left": "in the bottom left corner",
    "bottom": "at the bottom",
    "bottom right": "in the bottom right corner",
}


def _dist(a, b) -> float:
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _polygon(cx, cy, r, n, phase, inner=None):
    pts = []
    k = 2 * n if inner else n
    for i in range(k):
        rr = r if (inner is None or i % 2 == 0) else inner
        t = phase + 2 * math.pi * i / k
        pts.append((cx + rr * math.cos(t), cy + rr * math.sin(t)))
    return pts


def draw_shape(
    d: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill, bg
) -> None:
    """Draw `shape` inside the disc of radius r around (cx, cy) (image y axis points down)."""
    up = -math.pi / 2
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "ring":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        ri = r * 0.55
        d.ellipse([cx - ri, cy - ri, cx + ri, cy + ri], fill=bg)  # the hole shows the background
    elif shape == "square":
        h = r * 0.7
        d.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    elif shape == "triangle":
        d.polygon(_polygon(cx, cy, r, 3, up), fill=fill)
    elif shape == "star":
        d.polygon(_polygon(cx, cy, r, 5, up, inner=r * 0.42), fill=fill)
    elif shape == "diamond":
        d.polygon([(cx, cy - r), (cx + 0.7 * r, cy), (cx, cy + r), (cx - 0.7 * r, cy)], fill=fill)
    elif shape == "hexagon":
        d.polygon(_polygon(cx, cy, r, 6, 0.0), fill=fill)
    elif shape == "cross":
        a, b = r * 0.95, r * 0.3
        d.rectangle([cx - a, cy - b, cx + a, cy + b], fill=fill)
        d.rectangle([cx - b, cy - a, cx + b, cy + a], fill=fill)
    else:  # pragma: no cover
        raise ValueError(shape)


def _pick_colour(rng: random.Random, bg_name: str, avoid: set[str]) -> str:
    """A colour that stands out from the background and whose name is not part of the
    background's name (no "blue on light blue")."""
    bg_rgb = BACKGROUNDS[bg_name]
    names = [
        n
        for n in COLOURS
        if n not in avoid and n not in bg_name.split() and _dist(COLOURS[n], bg_rgb) > 150
    ]
    return rng.choice(names)


def _place(rng: random.Random, w: int, h: int, size: str, taken: list) -> tuple | None:
    """Pick a centre in a random ninth of the image, keep the disc inside, avoid other discs."""
    lo, hi = SIZES[size]
    r = min(w, h) * rng.uniform(lo, hi)
    for _ in range(200):
        gx, gy = rng.randrange(3), rng.randrange(3)
        cx = (gx + 0.5) * w / 3 + rng.uniform(-0.1, 0.1) * w
        cy = (gy + 0.5) * h / 3 + rng.uniform(-0.1, 0.1) * h
        cx = min(max(cx, r + 1), w - r - 1)
        cy = min(max(cy, r + 1), h - r - 1)
        if _near_boundary(cx / w) or _near_boundary(cy / h):
            continue  # keep the position label unambiguous
        if all(_dist((cx, cy), (ox, oy)) > r + orr + 3 for ox, oy, orr in taken):
            return cx, cy, r
    return None


def _near_boundary(f: float, margin: float = 0.08) -> bool:
    """True if a relative coordinate is within `margin` of a third-line of the image."""
    return abs(f - 1 / 3) < margin or abs(f - 2 / 3) < margin


def _pos_name(cx: float, cy: float, w: int, h: int) -> str:
    """Which ninth of the image the point lies in -- computed from the drawing, so always true."""
    return POS_NAMES[min(2, int(3 * cy / h))][min(2, int(3 * cx / w))]


def make_generated(rng: random.Random) -> tuple[Image.Image, list[str]]:
    w, h = rng.randint(64, 128), rng.randint(64, 128)
    bg_name = rng.choice(sorted(BACKGROUNDS))
    bg = BACKGROUNDS[bg_name]
    S = SUPERSAMPLE
    canvas = Image.new("RGB", (w * S, h * S), bg)
    d = ImageDraw.Draw(canvas)
    kind = rng.random()

    if kind < 0.12:  # a pattern over the whole image
        pattern = rng.choice(PATTERNS)
        col = _pick_colour(rng, bg_name, set())
        n = rng.randint(3, 6)
        if pattern == "horizontal stripes":
            step = h * S / (2 * n)
            for i in range(n):
                d.rectangle([0, (2 * i) * step, w * S, (2 * i + 1) * step - 1], fill=COLOURS[col])
        elif pattern == "vertical stripes":
            step = w * S / (2 * n)
            for i in range(n):
                d.rectangle([(2 * i) * step, 0, (2 * i + 1) * step - 1, h * S], fill=COLOURS[col])
        else:
            sx, sy = w * S / n, h * S / n
            for i in range(n):
                for j in range(n):
                    if (i + j) % 2 == 0:
                        d.rectangle(
                            [i * sx, j * sy, (i + 1) * sx - 1, (j + 1) * sy - 1], fill=COLOURS[col]
                        )
        if pattern == "checkerboard":
            caps = [
                f"{_article(col)} {col} and {bg_name} checkerboard pattern",
                f"checkerboard, {col} on {bg_name}, {NUM_WORDS[n]} by {NUM_WORDS[n]} squares",
            ]
        else:
            caps = [
                f"{col} {pattern} on a {bg_name} background",
                f"{NUM_WORDS[n]} {col} {pattern.split()[0]} stripes, {bg_name} background",
            ]
    else:
        n_shapes = 2 if kind > 0.75 else 1
        objs, taken, used_cols = [], [], set()
        for _ in range(n_shapes):
            size = rng.choice(["small", "medium"] if n_shapes == 2 else list(SIZES))
            placed = _place(rng, w * S, h * S, size, taken)
            if placed is None:
                continue
            cx, cy, r = placed
            shape = rng.choice(SHAPES)
            col = _pick_colour(rng, bg_name, used_cols)
            used_cols.add(col)
            taken.append(placed)
            draw_shape(d, shape, cx, cy, r, COLOURS[col], bg)
            objs.append((size, col, shape, _pos_name(cx, cy, w * S, h * S)))
        if not objs:  # pragma: no cover - never happens with the fixed seed
            raise RuntimeError("could not place a shape")
        if len(objs) == 1:
            size, col, shape, pos = objs[0]
            t = rng.randrange(3)
            if t == 0:
                c1 = f"{_article(size)} {size} {col} {shape} on {_article(bg_name)} {bg_name} background"
            elif t == 1:
                c1 = (
                    f"{_article(size)} {size} {col} {shape} {POS_PHRASES[pos]} "
                    f"on {_article(bg_name)} {bg_name} background"
                )
            else:
                c1 = f"{_article(col)} {col} {shape} {POS_PHRASES[pos]}, {bg_name} background"
            caps = [c1, f"{col} {shape}, {pos}"]
        else:
            (s1, c1_, sh1, p1), (s2, c2_, sh2, p2) = objs
            caps = [
                f"{_article(s1)} {s1} {c1_} {sh1} and {_article(s2)} {s2} {c2_} {sh2} "
                f"on {_article(bg_name)} {bg_name} background",
                f"two shapes: {c1_} {sh1} {POS_PHRASES[p1]}, {c2_} {sh2} {POS_PHRASES[p2]}",
            ]
    im = canvas.resize((w, h), Image.Resampling.LANCZOS)
    return im, caps


def write_generated(img_dir: Path, images: list, annotations: list) -> int:
    rng = random.Random(SEED)
    for k in range(N_GENERATED):
        image_id = FIRST_GENERATED_ID + k
        im, caps = make_generated(rng)
        name = f"COCO_mini_{image_id:012d}.png"
        im.save(img_dir / name, format="PNG", optimize=False, compress_level=9)
        images.append(
            {
                "id": image_id,
                "file_name": name,
                "width": im.width,
                "height": im.height,
                "license": 2,
                "source": "generated",
                "kind": "generated",
            }
        )
        for cap in caps:
            annotations.append({"image_id": image_id, "caption": cap})
    return N_GENERATED


def make_coco(out: Path) -> dict:
    root = out / "coco_mini"
    img_dir = root / "images"
    img_dir.mkdir(parents=True)
    info = {
        "description": "coco_mini: scikit-image sample photos plus generated shapes, "
        "made by scripts/make_default_data.py",
        "version": "1.0",
        "year": 2024,
        "size_convention": "width/height are of the displayed image, after EXIF orientation",
    }
    images: list = []
    annotations: list = []
    used = write_photos(img_dir, images, annotations, info)
    n_gen = write_generated(img_dir, images, annotations)
    for i, a in enumerate(annotations, start=1):
        a["id"] = i
    annotations = [
        {"id": a["id"], "image_id": a["image_id"], "caption": a["caption"]} for a in annotations
    ]
    doc = {
        "info": info,
        "licenses": [
            {
                "id": 1,
                "name": "scikit-image sample data (see skimage/data/README and the "
                "scikit-image documentation for each image's source and licence)",
                "url": "https://scikit-image.org/docs/stable/api/skimage.data.html",
            },
            {"id": 2, "name": "CC0 (generated by this project)", "url": ""},
        ],
        "images": images,
        "annotations": annotations,
    }
    (root / "captions.json").write_text(
        json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    n_conv = write_conversations(root, images)
    return {
        "photos": used,
        "n_generated": n_gen,
        "n_images": len(images),
        "n_captions": len(annotations),
        "n_conversations": n_conv,
    }


# --------------------------------------------------------------------------------------------
# Conversations about the photos (LLaVA instruction format)
# --------------------------------------------------------------------------------------------
# (id, photo ids, turns). Written by hand while looking at each photo; answers say only what the
# photo shows. "<image>" marks where an image goes; an entry with fewer placeholders than images
# (conv-0025) gets them in front of its first question, one entry has a system turn, and two
# are text only.
CONVERSATIONS: list[tuple[str, list[int], list[tuple[str, str]]]] = [
    (
        "conv-0001",
        [1],
        [
            ("human", "<image>\nWhat is the person wearing?"),
            ("gpt", "An orange spacesuit with mission patches on it."),
            ("human", "Is there a flag in the picture?"),
            ("gpt", "Yes, an American flag on the left."),
            ("human", "What is behind her on the right?"),
            ("gpt", "A model of the space shuttle. A white helmet is in front of her."),
        ],
    ),
    (
        "conv-0002",
        [2],
        [
            ("human", "<image>\nWhat surface is shown here?"),
            ("gpt", "A brick wall, seen close up in black and white."),
            ("human", "How are the bricks laid?"),
            ("gpt", "In staggered rows of long, narrow bricks with light mortar between them."),
        ],
    ),
    (
        "conv-0003",
        [3],
        [
            ("human", "<image>\nWhat is the man doing?"),
            ("gpt", "He is looking through a camera mounted on a tripod."),
            ("human", "Where is he standing?"),
            ("gpt", "On a grassy field, with buildings far away in the background."),
        ],
    ),
    (
        "conv-0004",
        [4],
        [
            ("human", "<image>\nHow many cells can you see?"),
            ("gpt", "One round, bright cell."),
            ("human", "Where is it in the frame?"),
            ("gpt", "A little right of the centre, on a plain gray background."),
        ],
    ),
    (
        "conv-0005",
        [5],
        [
            ("human", "<image>\nWhat animal is this?"),
            ("gpt", "A tabby cat, seen close up."),
            ("human", "What colour are its eyes?"),
            ("gpt", "Green."),
        ],
    ),
    (
        "conv-0006",
        [6],
        [
            ("human", "<image>\nIs the object in focus?"),
            ("gpt", "No. It is a round wall clock, blurred sideways by motion."),
        ],
    ),
    (
        "conv-0007",
        [7],
        [
            ("human", "<image>\nWhat drink is in the cup?"),
            ("gpt", "An espresso with golden crema."),
            ("human", "What colour is the saucer?"),
            ("gpt", "Red, like the cup."),
            ("human", "Is there a spoon?"),
            ("gpt", "Yes, a small metal spoon lies on the saucer."),
        ],
    ),
    (
        "conv-0008",
        [8],
        [
            ("human", "<image>\nHow many coins are there?"),
            ("gpt", "Twenty four, in four rows of six."),
        ],
    ),
    (
        "conv-0009",
        [9],
        [
            ("human", "<image>\nWhat colour is the centre of the wheel?"),
            ("gpt", "White."),
            ("human", "And the background?"),
            ("gpt", "Black."),
        ],
    ),
    (
        "conv-0010",
        [10],
        [
            ("human", "<image>\nIs this photo in colour?"),
            ("gpt", "No, it is a grayscale close-up of grass and small leaves."),
        ],
    ),
    (
        "conv-0011",
        [11],
        [
            ("human", "What is shown in this picture?\n<image>"),
            ("gpt", "Many small gravel stones, in grayscale."),
        ],
    ),
    (
        "conv-0012",
        [12],
        [
            ("human", "<image>\nWhat animal is shown?"),
            ("gpt", "A horse, drawn as a black silhouette on a white background."),
            ("human", "Which way is it facing?"),
            ("gpt", "To the right."),
        ],
    ),
    (
        "conv-0013",
        [13],
        [
            ("human", "<image>\nWhat does this image show?"),
            ("gpt", "A deep space telescope image full of distant galaxies."),
        ],
    ),
    (
        "conv-0014",
        [14],
        [
            ("human", "<image>\nWhat kind of image is this?"),
            ("gpt", "A microscope image of stained tissue."),
            ("human", "Which colours does the stain show?"),
            ("gpt", "Brown and blue."),
        ],
    ),
    (
        "conv-0015",
        [15],
        [
            ("human", "<image>\nWhat is drawn inside the circle?"),
            ("gpt", "A snake."),
            ("human", "Which colours does the logo use?"),
            ("gpt", "Green and orange."),
        ],
    ),
    (
        "conv-0016",
        [16],
        [
            ("human", "<image>\nWhat part of the body is this?"),
            ("gpt", "A small grayscale crop of a retina, with blood vessels and two dark spots."),
        ],
    ),
    (
        "conv-0017",
        [17],
        [
            ("human", "<image>\nWhat surface is this?"),
            ("gpt", "The surface of the moon, with small craters."),
        ],
    ),
    (
        "conv-0018",
        [18],
        [
            ("human", "<image>\nWhat vehicle is this?"),
            ("gpt", "A motorcycle."),
            ("human", "What colour is it?"),
            ("gpt", "Red, with a black seat."),
            ("human", "Where is it parked?"),
            ("gpt", "In a garage, in front of shelves with boxes."),
        ],
    ),
    (
        "conv-0019",
        [19],
        [
            ("human", "<image>\nWhat is the heading of the page?"),
            ("gpt", "Region-based segmentation."),
        ],
    ),
    (
        "conv-0020",
        [20],
        [
            ("human", "<image>\nWhat does this photo show?"),
            (
                "gpt",
                "The back of a human eye, with red blood vessels spreading from a bright spot.",
            ),
        ],
    ),
    (
        "conv-0021",
        [21],
        [
            ("human", "<image>\nWhat stands on the launch pad?"),
            ("gpt", "A rocket, between tall towers."),
            ("human", "Is it day or night?"),
            ("gpt", "Dusk: the sky is dark blue and the lights are on."),
        ],
    ),
    (
        "conv-0022",
        [22],
        [
            ("human", "<image>\nIs the writing printed or handwritten?"),
            ("gpt", "Handwritten. It looks like mathematical notes, photographed at an angle."),
        ],
    ),
    (
        "conv-0023",
        [5, 12],
        [
            ("human", "<image>\n<image>\nWhich of the two pictures shows a cat?"),
            ("gpt", "The first one. The second shows the silhouette of a horse."),
        ],
    ),
    (
        "conv-0024",
        [7, 18],
        [
            (
                "human",
                "<image>\n<image>\nWhat colour do the saucer in the first picture and "
                "the motorcycle in the second share?",
            ),
            ("gpt", "Both are red."),
        ],
    ),
    (
        "conv-0025",
        [13, 17],
        [
            ("human", "Which picture shows distant galaxies, the first or the second?"),
            ("gpt", "The first. The second shows the surface of the moon."),
        ],
    ),
    (
        "conv-0026",
        [],
        [
            ("human", "What does a tripod do for a camera?"),
            ("gpt", "It holds the camera steady on three legs."),
        ],
    ),
    (
        "conv-0027",
        [],
        [
            ("system", "Answer in one short sentence."),
            ("human", "What is an espresso?"),
            ("gpt", "A small, strong coffee made by forcing hot water through ground beans."),
        ],
    ),
]


def write_conversations(root: Path, images: list) -> int:
    """``conversations.json`` (LLaVA instruction format, paths relative to ``images/``) for the
    photos that were written; an entry whose photo is missing is left out."""
    files = {im["id"]: im["file_name"] for im in images if im.get("kind") != "generated"}
    entries = []
    for conv_id, photo_ids, turns in CONVERSATIONS:
        if not all(i in files for i in photo_ids):
            continue
        entry = {"id": conv_id}
        if len(photo_ids) == 1:
            entry["image"] = files[photo_ids[0]]
        elif photo_ids:
            entry["images"] = [files[i] for i in photo_ids]
        entry["conversations"] = [{"from": who, "value": text} for who, text in turns]
        entries.append(entry)
    (root / "conversations.json").write_text(
        json.dumps(entries, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return len(entries)


# --------------------------------------------------------------------------------------------
# LibriSpeech-style tones
# --------------------------------------------------------------------------------------------
SR = 16000
NOTE_SEMITONES = {"C": 0, "D": 2, "E": 4, "F": 5, "G": 7, "A": 9, "B": 11}
NOTE_ORDER = ["C", "D", "E", "F", "G", "A", "B"]
NUMBER_WORDS = {2: "TWO", 3: "THREE", 4: "FOUR", 5: "FIVE", 6: "SIX"}
CHORDS = {  # name -> (root, semitone offsets above the root)
    "MAJOR": (0, 4, 7),
    "MINOR": (0, 3, 7),
}
# speaker id -> (octave of the notes, harmonic amplitudes 1..n: its timbre)
SPEAKERS = {
    9001: (3, (1.0, 0.55, 0.35, 0.25, 0.15)),  # low, bright
    9002: (4, (1.0, 0.0, 0.33, 0.0, 0.2, 0.0, 0.14)),  # middle, hollow (odd harmonics)
    9003: (5, (1.0, 0.12)),  # high, nearly pure
}
CHAPTERS = {100: 0.30, 101: 0.22}  # chapter id -> seconds per note (tempo)
UTTERANCES_PER_CHAPTER = 8
PAUSE_S = 0.15
EDGE_S = 0.05  # silence at both ends


def note_freq(name: str, octave: int) -> float:
    midi = 12 * (octave + 1) + NOTE_SEMITONES[name]
    return 440.0 * 2.0 ** ((midi - 69) / 12.0)


def tone(freqs: list[float], dur: float, harmonics) -> np.ndarray:
    n = int(round(dur * SR))
    t = np.arange(n, dtype=np.float64) / SR
    x = np.zeros(n)
    for f in freqs:
        for k, a in enumerate(harmonics, start=1):
            if a and f * k < SR / 2 - 500:
                x += a * np.sin(2 * np.pi * f * k * t)
    env = np.ones(n)
    att, rel = int(0.01 * SR), int(0.04 * SR)
    env[:att] = np.linspace(0.0, 1.0, att, endpoint=False)
    env[n - rel :] = np.linspace(1.0, 0.0, rel)
    return x * env


def make_utterance(rng: random.Random, note_s: float) -> tuple[list, str]:
    """A list of events ("note", [names]) / ("pause", None) and the transcript saying them."""
    kind = rng.choice(["sequence", "sequence", "rising", "falling", "repeat", "chord", "pause"])
    if kind == "chord":
        root = rng.choice(NOTE_ORDER)
        quality = rng.choice(sorted(CHORDS))
        art = "AN" if root in "AEF" else "A"  # letter names said aloud: "an A", "an E", "an F"
        return [("chord", (root, quality))], f"{art} {root} {quality} CHORD"
    max_notes = max(2, min(6, int((2.5 - 2 * EDGE_S - PAUSE_S) / note_s)))
    if kind == "repeat":
        name, n = rng.choice(NOTE_ORDER), rng.randint(2, min(4, max_notes))
        return [("note", name)] * n, f"NOTE {name} {NUMBER_WORDS[n]} TIMES"
    n = rng.randint(3 if kind in ("rising", "falling") else 2, max_notes)
    if kind in ("rising", "falling"):
        idx = sorted(rng.sample(range(len(NOTE_ORDER)), n))
        names = [NOTE_ORDER[i] for i in (idx if kind == "rising" else idx[::-1])]
        text = f"{NUMBER_WORDS[n]} {kind.upper()} NOTES {' '.join(names)}"
        return [("note", x) for x in names], text
    names = [rng.choice(NOTE_ORDER) for _ in range(n)]
    if kind == "pause":
        cut = rng.randint(1, n - 1)
        events = (
            [("note", x) for x in names[:cut]]
            + [("pause", None)]
            + [("note", x) for x in names[cut:]]
        )
        words = [f"NOTE {x}" for x in names[:cut]] + ["PAUSE"] + [f"NOTE {x}" for x in names[cut:]]
        return events, " ".join(words)
    return [("note", x) for x in names], " ".join(f"NOTE {x}" for x in names)


def render(events, octave: int, harmonics, note_s: float) -> np.ndarray:
    parts = [np.zeros(int(EDGE_S * SR))]
    for ev, arg in events:
        if ev == "pause":
            parts.append(np.zeros(int(PAUSE_S * SR)))
        elif ev == "note":
            parts.append(tone([note_freq(arg, octave)], note_s, harmonics))
        else:  # chord: three notes at once, held for 0.8 s
            root, quality = arg
            f0 = note_freq(root, octave)
            parts.append(tone([f0 * 2.0 ** (s / 12.0) for s in CHORDS[quality]], 0.8, harmonics))
    parts.append(np.zeros(int(EDGE_S * SR)))
    x = np.concatenate(parts)
    peak = np.max(np.abs(x))
    x = x / peak * 0.5 if peak > 0 else x
    return np.round(x * 32767.0).astype(np.int16)


def make_librispeech(out: Path) -> dict:
    root = out / "librispeech_mini"
    rng = random.Random(SEED + 1)
    n_utt, total_s = 0, 0.0
    durations = []
    for spk in sorted(SPEAKERS):
        octave, harmonics = SPEAKERS[spk]
        for chap in sorted(CHAPTERS):
            note_s = CHAPTERS[chap]
            d = root / str(spk) / str(chap)
            d.mkdir(parents=True)
            lines = []
            for u in range(UTTERANCES_PER_CHAPTER):
                while True:
                    events, text = make_utterance(rng, note_s)
                    audio = render(events, octave, harmonics, note_s)
                    dur = len(audio) / SR
                    if 0.6 <= dur <= 2.5:
                        break
                utt = f"{spk}-{chap}-{u:04d}"
                sf.write(d / f"{utt}.flac", audio, SR, format="FLAC", subtype="PCM_16")
                lines.append(f"{utt} {text}")
                n_utt += 1
                total_s += dur
                durations.append(dur)
            (d / f"{spk}-{chap}.trans.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        "n_utterances": n_utt,
        "total_seconds": total_s,
        "min_seconds": min(durations),
        "max_seconds": max(durations),
    }


# --------------------------------------------------------------------------------------------
# A small text corpus: short factual documents about the other two corpora and the platform
# --------------------------------------------------------------------------------------------
TEXT_FILE = "documents.jsonl"

# file inside skimage/data -> a few true sentences about what the photo shows
PHOTO_FACTS = {
    "astronaut.png": "Astronauts train for years before a spaceflight. The bright orange suit is worn for "
    "launch and landing, and its colour makes a crew member easy to find after a landing at sea.",
    "brick.png": "Bricks are blocks of fired clay. Laying each row offset by half a brick from the row below "
    "spreads the load and makes the wall stronger.",
    "camera.png": "This cameraman picture is one of the classic test images of image processing. A tripod holds "
    "a camera steady, so long exposures and slow pans stay sharp.",
    "cell.png": "Cells are the smallest units of living things. A light microscope magnifies them enough to show "
    "their outline and, with staining, parts such as the nucleus.",
    "chelsea.png": "Tabby is not a breed of cat but a coat pattern of stripes, swirls or spots. In coco_mini this "
    "photo is stored sideways with an EXIF orientation tag of 6, so a reader must rotate it to "
    "show the cat upright.",
    "clock_motion.png": "Motion blur appears when the camera or the subject moves while the shutter is open. "
    "Here the round face of the clock is smeared sideways into a streak.",
    "coffee.png": "Espresso is made by forcing hot water through finely ground coffee under pressure. The "
    "golden foam on top is called crema.",
    "coins.png": "People have struck coins from metal for more than two and a half thousand years. This photo "
    "is often used to test how well a program separates objects from their background.",
    "color.png": "A colour wheel arranges the hues in a circle, with red, yellow, green, cyan, blue and magenta "
    "following each other. Two colours opposite each other on the wheel are called complementary.",
    "grass.png": "Grass grows from the base of its leaves rather than from the tips, so a lawn keeps growing "
    "after it is mowed. A texture image like this one has no single object, only a repeating pattern.",
    "gravel.png": "Gravel is made of loose rock fragments, larger than grains of sand and smaller than cobbles. "
    "Crushed gravel has sharp edges, while river gravel is rounded by water.",
    "horse.png": "A silhouette shows only the outline of a shape, filled with one colour. Binary images like "
    "this horse are used to test shape analysis such as skeletonization.",
    "hubble_deep_field.jpg": "The Hubble Deep Field was made from many exposures of one tiny patch of sky, taken "
    "by the Hubble Space Telescope in 1995. Almost every point of light in it is a galaxy.",
    "ihc.png": "Immunohistochemistry uses antibodies to stain chosen proteins in a tissue sample. In this slide "
    "the brown stain marks the protein and the blue stain marks the cell nuclei.",
    "logo.png": "scikit-image is an open source library of image processing algorithms for Python. Its logo "
    "includes a snake, the usual symbol of the Python language.",
    "microaneurysms.png": "Microaneurysms are tiny bulges in the walls of small blood vessels of the retina. "
    "They show up as small dark dots and are an early sign of diabetic retinopathy.",
    "moon.png": "The surface of the Moon is covered with craters left by asteroids and comets. Since the Moon "
    "has almost no air and no weather, its craters stay sharp for a very long time.",
    "motorcycle_left.png": "This photo is the left view of a stereo pair, the same scene taken from two nearby "
    "positions. Comparing the two views lets a program estimate how far away each point is.",
    "page.png": "The page photo shows printed text under uneven lighting. It is used to test thresholding, where "
    "a program decides for every pixel whether it belongs to the ink or to the paper.",
    "retina.jpg": "The retina is the light-sensitive layer at the back of the eye. The bright disc is where the "
    "optic nerve leaves the eye; it has no light receptors, which makes a blind spot.",
    "rocket.jpg": "A rocket carries both its fuel and the oxygen to burn it, so it can fly where there is no "
    "air. Towers next to a launch pad carry fuel lines and cables, and some protect the rocket "
    "from lightning.",
    "text.png": "Handwriting recognition turns pictures of written characters into text that a computer can "
    "search. A page photographed at an angle, like this one, is usually straightened first.",
}
SHAPE_FACTS = {
    "circle": "A circle is the set of points at the same distance from its centre. Its circumference is pi "
    "times its diameter, a little more than three times.",
    "square": "A square has four equal sides and four right angles. Its two diagonals have the same length and "
    "cross at right angles.",
    "triangle": "The triangles are equilateral and point up: all three sides have the same length and every "
    "angle is 60 degrees.",
    "star": "The stars have five points. Their outline has ten corners, alternating between the tips and the "
    "inner corners, which are 42 percent as far from the centre as the tips.",
    "diamond": "A diamond here is a rhombus standing on one corner, taller than it is wide. All four of its "
    "sides have the same length.",
    "hexagon": "A regular hexagon has six equal sides and six angles of 120 degrees. Bees build the cells of "
    "their honeycomb in this shape.",
    "cross": "The crosses are plus signs: two bars of the same length crossing at their middles at a right "
    "angle.",
    "ring": "A ring is a disc with a round hole in the middle. In these images the hole is a little more than "
    "half as wide as the ring and shows the background colour.",
}
PATTERN_FACTS = {
    "horizontal stripes": "Horizontal stripes run from the left edge of the image to the right edge.",
    "vertical stripes": "Vertical stripes run from the top of the image to the bottom.",
    "checkerboard": "A checkerboard alternates squares of two colours in rows and columns, so that no two "
    "squares sharing a side have the same colour.",
}
# What the platform does, in plain words: (id, text). Each entry is a short paragraph.
PLATFORM_FACTS = [
    (
        "shard",
        "A shard is a tar file that holds many samples one after the other. Reading a few large files "
        "is much faster than reading millions of small ones, on local disks and on object storage alike.",
    ),
    (
        "sample-key",
        "Every sample in a shard has a key, and all files of one sample share it, such as KEY.image.png "
        "and KEY.text.json. A key never contains a dot, because the loader splits file names at the "
        "first dot.",
    ),
    (
        "text-json",
        "The text.json part of a sample holds its caption, transcript or document text together with "
        "provenance: the source kind, the source id and the original file name.",
    ),
    (
        "energon-index",
        "The .nv-meta folder of a dataset holds the index that Energon builds over its shards. With "
        "the index, the loader can read any sample directly, without scanning the shards before it.",
    ),
    (
        "dataset-yaml",
        "The dataset.yaml file names the sample type of a dataset and says which part of each sample "
        "fills which field. A text dataset maps the text field to the text entry of text.json.",
    ),
    (
        "work-unit",
        "A conversion is cut into work units, one unit for each output shard. Units are independent, "
        "so they can run in local processes or as Ray tasks and still write the same bytes.",
    ),
    (
        "atomic-write",
        "Each shard is first written under a temporary name and renamed once it is complete. A "
        "reader therefore sees either the whole shard or no shard at all.",
    ),
    (
        "convert-resume",
        "A conversion that is killed can be run again with the same arguments. It writes only the "
        "shards that are missing, and the result is byte for byte the same as an uninterrupted run.",
    ),
    (
        "bad-input",
        "Bad input is skipped and counted, never silently dropped. The report lists each reason, such "
        "as empty text or invalid UTF-8, with examples, and skipped.jsonl lists every skipped record.",
    ),
    (
        "val-split",
        "The validation split is chosen by a hash of each sample key. A sample therefore lands in the "
        "same split whatever else is in the corpus.",
    ),
    (
        "data-loader",
        "A data loader reads samples, turns them into tensors and groups them into batches while the "
        "model trains. Worker processes prepare the next batches in the background.",
    ),
    (
        "global-batch",
        "A global batch is everything one training step consumes across all data-parallel ranks. "
        "Each rank takes its own part of every global batch.",
    ),
    (
        "micro-batch",
        "When a rank cannot fit its whole share in memory, it splits it into micro-batches and adds "
        "up their gradients before the optimizer step.",
    ),
    (
        "epoch",
        "An epoch visits every sample of a dataset once. Here the order of each epoch is a permutation "
        "computed from the seed and the epoch number, so every epoch is shuffled differently but "
        "reproducibly.",
    ),
    (
        "seeded-augmentation",
        "Random augmentations, such as crops and flips, are drawn from a generator seeded by "
        "the run seed, the sample key and the epoch. The same sample in the same epoch always "
        "gets the same tensors, whichever worker encodes it.",
    ),
    (
        "packing",
        "Packing places several short documents into one sequence, so fewer tokens are wasted on "
        "padding. Position ids restart at every document and cu_seqlens marks where each one begins.",
    ),
    (
        "checkpoint",
        "A checkpoint stores the model, the optimizer, the learning rate schedule, the random number "
        "generators and the state of the data loader. It is written to a temporary folder and renamed, "
        "so a crash never leaves half a checkpoint behind.",
    ),
    (
        "loader-state",
        "The state of the loader is a small JSON document: mainly the number of the next global "
        "batch. Restoring it takes as long as starting fresh, because nothing is replayed.",
    ),
    (
        "fingerprint",
        "The loader state carries a fingerprint of the dataset, the encoder configuration, the seed "
        "and the batch size. A state restored into a different setup is refused with an error that "
        "names the difference.",
    ),
    (
        "exact-resume",
        "After a crash, training resumes from the latest checkpoint with the same samples in the same "
        "order. On a CPU the loss after the resume matches an uninterrupted run bit for bit.",
    ),
    (
        "elastic-resume",
        "A run may resume with another number of workers, or another number of ranks that divides "
        "the global batch. The global batches stay the same, because they do not depend on the layout.",
    ),
    (
        "blend",
        "A blend mixes several datasets in one run with given weights. A text corpus such as this one can "
        "join a blend with image-text and audio-text data.",
    ),
]
SEMITONE_NAMES = {0: "C", 2: "D", 4: "E", 5: "F", 7: "G", 9: "A", 11: "B"}
ACCIDENTALS = {-1: " flat", 0: "", 1: " sharp"}
TRANSCRIPT_KINDS = [
    (
        "sequence",
        "NOTE C NOTE E NOTE G",
        "A transcript such as {ex} names each note in the order it is played.",
    ),
    (
        "rising",
        "THREE RISING NOTES C E G",
        "A transcript such as {ex} says how many notes are played and that each "
        "one is higher than the one before.",
    ),
    (
        "falling",
        "FOUR FALLING NOTES B G E C",
        "A transcript such as {ex} lists notes that each sound lower than the one before.",
    ),
    (
        "repeat",
        "NOTE D THREE TIMES",
        "A transcript such as {ex} means that one note is played several times in a row.",
    ),
    (
        "pause",
        "NOTE A PAUSE NOTE D",
        "A transcript such as {ex} marks a silence of {pause} seconds between two groups of notes.",
    ),
]


def _join(items) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _article_text(word: str) -> str:
    return "An" if word[0] in "AEFaeiou" else "A"  # letter names said aloud: "an A", "an E", "an F"


def spell_interval(root: str, letters_up: int, semitones: int) -> str:
    """The name of the note ``semitones`` above ``root`` written ``letters_up`` letters higher
    (a third is two letters up, a fifth four), with the sharp or flat that makes it exact."""
    letter = NOTE_ORDER[(NOTE_ORDER.index(root) + letters_up) % 7]
    diff = (NOTE_SEMITONES[root] + semitones - NOTE_SEMITONES[letter]) % 12
    return letter + ACCIDENTALS[diff - 12 if diff > 6 else diff]


def text_documents() -> list[dict]:
    """All documents, in their fixed order: ``{"id", "topic", "text"}``."""
    docs = []

    def add(doc_id: str, topic: str, *sentences: str) -> None:
        docs.append({"id": doc_id, "topic": topic, "text": " ".join(sentences)})

    kinds = {"photo": "a photograph", "graphic": "a drawn image"}
    for image_id, fname, kind, captions in PHOTOS:
        add(
            f"photo-{Path(fname).stem.replace('_', '-')}",
            "coco_mini photos",
            captions[0],
            f"It is image {image_id} of coco_mini, {kinds[kind]} from the sample data of scikit-image.",
            PHOTO_FACTS[fname],
        )
    for shape in SHAPES:
        add(
            f"shape-{shape}",
            "coco_mini shapes",
            f"Many generated images of coco_mini show {_article(shape)} {shape} in one of {len(COLOURS)} colours on "
            f"one of {len(BACKGROUNDS)} plain backgrounds.",
            SHAPE_FACTS[shape],
        )
    for pattern in PATTERNS:
        add(
            f"pattern-{pattern.replace(' ', '-')}",
            "coco_mini shapes",
            f"Some generated images of coco_mini are covered by {'a ' if pattern == 'checkerboard' else ''}"
            f"{pattern}, with three to six "
            f"{'squares along each side' if pattern == 'checkerboard' else 'stripes'}.",
            PATTERN_FACTS[pattern],
        )
    octaves = {spk: octave for spk, (octave, _) in SPEAKERS.items()}
    for name in NOTE_ORDER:
        freqs = _join(
            f"{note_freq(name, o):.2f} Hz in octave {o}" for o in sorted(set(octaves.values()))
        )
        add(
            f"note-{name}",
            "librispeech_mini notes",
            f"The note {name} has a frequency of {freqs}.",
            "Going up one octave doubles the frequency of a note.",
            f"In librispeech_mini, speakers {_join(sorted(octaves))} play their notes in octaves "
            f"{_join(octaves[s] for s in sorted(octaves))}, in that order.",
        )
    for spk, (octave, harmonics) in sorted(SPEAKERS.items()):
        present = [k for k, a in enumerate(harmonics, start=1) if a]
        odd = all(k % 2 for k in present)
        add(
            f"speaker-{spk}",
            "librispeech_mini speakers",
            f"Speaker {spk} of librispeech_mini is not a person but a synthesised timbre.",
            f"It plays notes in octave {octave} and mixes {len(present)} harmonics of each note"
            + (", only odd ones, which gives a hollow sound." if odd and len(present) > 1 else "."),
            f"The strongest is the fundamental; the weakest has {min(a for a in harmonics if a):.2f} of its "
            f"amplitude.",
        )
    for chap, note_s in sorted(CHAPTERS.items()):
        add(
            f"chapter-{chap}",
            "librispeech_mini chapters",
            f"Chapter {chap} of every speaker in librispeech_mini holds each note for {note_s:.2f} seconds, "
            f"about {1 / note_s:.1f} notes per second.",
            f"Each chapter has {UTTERANCES_PER_CHAPTER} utterances, and every utterance lasts between 0.6 and "
            f"2.5 seconds.",
        )
    for root in NOTE_ORDER:
        for quality in sorted(CHORDS):
            _, third, fifth = CHORDS[quality]
            notes = [root, spell_interval(root, 2, third), spell_interval(root, 4, fifth)]
            add(
                f"chord-{root}-{quality.lower()}",
                "librispeech_mini chords",
                f"{_article_text(root)} {root} {quality.lower()} chord is made of the notes {notes[0]}, {notes[1]} "
                f"and {notes[2]}.",
                f"Its third is {third} semitones above the root and its fifth is {fifth} semitones above it.",
                f"In librispeech_mini a chord is held for 0.8 seconds, and its transcript reads "
                f"{_article_text(root).upper()} {root} {quality} CHORD.",
            )
    for kind, example, template in TRANSCRIPT_KINDS:
        add(
            f"transcript-{kind}",
            "librispeech_mini transcripts",
            "The transcripts of librispeech_mini are written in capital letters and spell out what is played.",
            template.format(ex=example, pause=PAUSE_S),
        )
    for doc_id, text in PLATFORM_FACTS:
        add(f"platform-{doc_id}", "data platform", text)
    return docs


def make_text(out: Path) -> dict:
    root = out / "text_mini"
    root.mkdir(parents=True)
    docs = text_documents()
    (root / TEXT_FILE).write_text(
        "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8"
    )
    return {"n_documents": len(docs), "n_words": sum(len(d["text"].split()) for d in docs)}


# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Generated videos: moving shapes, captions computed from the motion
# --------------------------------------------------------------------------------------------
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
    what = f"{_article(v['colour'])} {v['colour']} {v['shape']}"
    text = f"{what[0].upper()}{what[1:]} {VIDEO_MOTIONS[v['motion']][2]} on a {v['background']} background"
    if v["second"]:
        colour, shape = v["second"]
        text += f", while {_article(colour)} {colour} {shape} moves the opposite way"
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
    a 440 Hz tone as AAC (MP4) or Opus (WebM) when ``v["tone"]``."""
    import io

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
            aus = out.add_stream("libopus" if v["webm"] else "aac", rate=rate, layout="mono")
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
            wave = (0.3 * np.sin(2 * np.pi * 440.0 * np.arange(n) / rate)).astype(np.float32)[None]
            frame = av.AudioFrame.from_ndarray(wave, format="flt", layout="mono")
            frame.sample_rate, frame.pts = rate, 0
            for packet in [*aus.encode(frame), *aus.encode(None)]:
                out.mux(packet)
    return buf.getvalue()


def make_video_mini(out: Path) -> dict:
    """``video_mini/clips/video_NNN.{mp4,webm}`` + ``video_NNN.txt`` (two captions, one per line)
    and ``video_mini/manifest.csv`` with WebVid's ``videoid,name,path`` columns for the same clips."""
    import csv
    import io

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


# --------------------------------------------------------------------------------------------
# mesh_mini: generated 3D shapes with truthful captions
# --------------------------------------------------------------------------------------------
MESH_COLOURS = [
    ("red", (200, 40, 40)),
    ("green", (40, 160, 60)),
    ("blue", (40, 70, 200)),
    ("yellow", (220, 200, 40)),
    ("purple", (130, 50, 160)),
    ("orange", (230, 130, 30)),
]
# (shape, format, [(proportion words, parameters)]) in file order
MESH_PLAN = [
    (
        "box",
        "obj",
        [
            ("a cube", (1.0, 1.0, 1.0)),
            ("a flat square slab", (2.0, 0.3, 2.0)),
            ("a tall square column", (0.5, 2.5, 0.5)),
        ],
    ),
    (
        "sphere",
        "ply",
        [
            ("a sphere", (1.0, 1.0, 1.0)),
            ("a flattened ellipsoid", (1.5, 0.5, 1.5)),
            ("an elongated ellipsoid", (0.6, 2.0, 0.6)),
        ],
    ),
    (
        "cylinder",
        "off",
        [
            ("a tall thin cylinder", (0.3, 2.5)),
            ("a short wide cylinder, like a disc", (1.5, 0.3)),
            ("a cylinder as tall as it is wide", (0.5, 1.0)),
        ],
    ),
    (
        "cone",
        "stl",
        [
            ("a tall pointed cone", (0.5, 2.5)),
            ("a flat wide cone", (1.5, 0.5)),
            ("a cone as tall as it is wide", (0.5, 1.0)),
        ],
    ),
    (
        "pyramid",
        "stl-ascii",
        [
            ("a square pyramid", (1.0, 1.0)),
            ("a tall narrow square pyramid", (0.5, 2.5)),
            ("a low flat square pyramid", (2.0, 0.4)),
        ],
    ),
    (
        "torus",
        "glb",
        [
            ("a thin ring", (1.0, 0.1)),
            ("a thick ring, like a doughnut", (1.0, 0.45)),
            ("a medium ring", (1.0, 0.25)),
        ],
    ),
    (
        "shell",
        "ply-points",
        [
            ("a cloud of points on a sphere", 1.0),
            ("a cloud of points on a flattened sphere", 0.4),
            ("a cloud of points on a stretched sphere", 2.2),
        ],
    ),
    (
        "helix",
        "npy6",
        [
            ("a cloud of points along a helix with three turns", 3),
            ("a cloud of points along a helix with one turn", 1),
            ("a cloud of points along a helix with five turns", 5),
        ],
    ),
    (
        "grid",
        "npy3",
        [
            ("a cloud of points on a flat square", 1.0),
            ("a cloud of points on a flat long strip", 4.0),
            ("a cloud of points on a flat rectangle twice as long as it is wide", 2.0),
        ],
    ),
    (
        "box",
        "ply",
        [
            ("a coloured cube", (1.0, 1.0, 1.0)),
            ("a coloured flat slab", (2.0, 0.3, 2.0)),
            ("a coloured tall column", (0.5, 2.5, 0.5)),
        ],
    ),
]
MESH_POINTS = 512


def _f(x: float) -> str:
    return f"{x:.6f}".rstrip("0").rstrip(".") if x else "0"


def _obj_quad_box(size) -> bytes:
    hx, hy, hz = (s / 2 for s in size)
    v = [(x, y, z) for x in (-hx, hx) for y in (-hy, hy) for z in (-hz, hz)]
    quads = [(1, 2, 4, 3), (5, 7, 8, 6), (1, 5, 6, 2), (3, 4, 8, 7), (1, 3, 7, 5), (2, 6, 8, 4)]
    lines = ["# box made of six quads"] + [f"v {_f(a)} {_f(b)} {_f(c)}" for a, b, c in v]
    lines += ["f " + " ".join(map(str, q)) for q in quads]
    return ("\n".join(lines) + "\n").encode()


def _ply_binary(vertices, faces, colours) -> bytes:
    head = [
        "ply",
        "format binary_little_endian 1.0",
        f"element vertex {len(vertices)}",
        "property float x",
        "property float y",
        "property float z",
    ]
    if colours is not None:
        head += ["property uchar red", "property uchar green", "property uchar blue"]
    if faces is not None:
        head += [f"element face {len(faces)}", "property list uchar int vertex_indices"]
    out = io.BytesIO()
    out.write(("\n".join(head + ["end_header"]) + "\n").encode())
    vt = [("x", "<f4"), ("y", "<f4"), ("z", "<f4")] + (
        [("r", "u1"), ("g", "u1"), ("b", "u1")] if colours is not None else []
    )
    rec = np.zeros(len(vertices), dtype=vt)
    rec["x"], rec["y"], rec["z"] = vertices.T
    if colours is not None:
        rec["r"], rec["g"], rec["b"] = colours.T
    out.write(rec.tobytes())
    if faces is not None:
        fr = np.zeros(len(faces), dtype=[("n", "u1"), ("i", "<i4", (3,))])
        fr["n"], fr["i"] = 3, faces
        out.write(fr.tobytes())
    return out.getvalue()


def _ply_ascii_points(points, colours) -> bytes:
    head = [
        "ply",
        "format ascii 1.0",
        f"element vertex {len(points)}",
        "property float x",
        "property float y",
        "property float z",
        "property uchar red",
        "property uchar green",
        "property uchar blue",
        "end_header",
    ]
    rows = [
        f"{_f(x)} {_f(y)} {_f(z)} {r} {g} {b}"
        for (x, y, z), (r, g, b) in zip(points.tolist(), colours.tolist())
    ]
    return ("\n".join(head + rows) + "\n").encode()


def _off(vertices, faces) -> bytes:
    lines = ["OFF", f"{len(vertices)} {len(faces)} 0"] + [
        " ".join(_f(x) for x in v) for v in vertices.tolist()
    ]
    lines += ["3 " + " ".join(map(str, f)) for f in faces.tolist()]
    return ("\n".join(lines) + "\n").encode()


def _stl_binary(vertices, faces) -> bytes:
    tri = vertices[faces].astype(np.float32)
    normals = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    rec = np.zeros(len(faces), dtype=[("n", "<f4", (3,)), ("v", "<f4", (3, 3)), ("a", "<u2")])
    rec["n"], rec["v"] = normals, tri
    return (
        b"energon-platform mesh_mini".ljust(80, b" ")
        + struct.pack("<I", len(faces))
        + rec.tobytes()
    )


def _stl_ascii_pyramid(base: float, height: float) -> bytes:
    h = base / 2
    apex, corners = (0.0, height, 0.0), [(-h, 0.0, -h), (h, 0.0, -h), (h, 0.0, h), (-h, 0.0, h)]
    tris = [(corners[i], corners[(i + 1) % 4], apex) for i in range(4)] + [
        (corners[0], corners[2], corners[1]),
        (corners[0], corners[3], corners[2]),
    ]
    lines = ["solid pyramid"]
    for t in tris:
        lines += ["  facet normal 0 0 0", "    outer loop"] + [
            f"      vertex {_f(a)} {_f(b)} {_f(c)}" for a, b, c in t
        ]
        lines += ["    endloop", "  endfacet"]
    return ("\n".join(lines + ["endsolid pyramid"]) + "\n").encode()


def _y_up(vertices) -> np.ndarray:
    """trimesh.creation's z-up solids turned y-up (glTF's up axis, as the captions' "tall" means):
    a rotation, so faces keep their winding."""
    v = np.asarray(vertices, dtype=np.float64)
    return np.stack([v[:, 0], v[:, 2], -v[:, 1]], axis=1)


def _shape_file(shape: str, fmt: str, param, colour, rng: np.random.Generator) -> tuple[str, bytes]:
    """(extension, bytes) of one planned shape."""
    import trimesh

    if fmt == "obj":
        return "obj", _obj_quad_box(param)
    if shape == "sphere":
        m = trimesh.creation.icosphere(subdivisions=2)
        v = np.asarray(m.vertices) * np.asarray(param)
        return "ply", _ply_binary(
            v, np.asarray(m.faces), np.tile(np.asarray(colour, np.uint8), (len(v), 1))
        )
    if shape == "box":  # coloured PLY box: vertex colours
        m = trimesh.creation.box(extents=param)
        v = np.asarray(m.vertices)
        return "ply", _ply_binary(
            v, np.asarray(m.faces), np.tile(np.asarray(colour, np.uint8), (len(v), 1))
        )
    if fmt == "off":
        m = trimesh.creation.cylinder(radius=param[0], height=param[1], sections=24)
        return "off", _off(_y_up(m.vertices), np.asarray(m.faces))
    if fmt == "stl":
        m = trimesh.creation.cone(radius=param[0], height=param[1], sections=24)
        return "stl", _stl_binary(_y_up(m.vertices), np.asarray(m.faces))
    if fmt == "stl-ascii":
        return "stl", _stl_ascii_pyramid(*param)
    if fmt == "glb":
        m = trimesh.creation.torus(
            major_radius=param[0], minor_radius=param[1], major_sections=24, minor_sections=12
        )
        return "glb", m.export(file_type="glb")
    if fmt == "ply-points":
        p = rng.normal(size=(MESH_POINTS, 3))
        p = p / np.linalg.norm(p, axis=1, keepdims=True) * np.array([1.0, param, 1.0])
        return "ply", _ply_ascii_points(
            np.round(p, 5), np.tile(np.asarray(colour, np.uint8), (MESH_POINTS, 1))
        )
    if fmt == "npy6":
        t = np.linspace(0.0, 2 * np.pi * param, MESH_POINTS)
        xyz = np.stack([np.cos(t), t / (2 * np.pi), np.sin(t)], axis=1)
        rgb = np.tile(np.asarray(colour, np.float64) / 255.0, (MESH_POINTS, 1))
        buf = io.BytesIO()
        np.save(buf, np.concatenate([xyz, rgb], axis=1).astype(np.float32))
        return "npy", buf.getvalue()
    u, w = rng.random(MESH_POINTS), rng.random(MESH_POINTS)  # grid: a flat rectangle param x 1
    buf = io.BytesIO()
    np.save(
        buf,
        np.stack([(u - 0.5) * param, np.zeros(MESH_POINTS), w - 0.5], axis=1).astype(np.float32),
    )
    return "npy", buf.getvalue()


def _mesh_captions(words: str, fmt: str, colour_name: str) -> list[str]:
    coloured = fmt in ("ply", "ply-points", "npy6")
    if coloured:
        article, rest = words.split(" ", 1)
        first = f"{'an' if colour_name[0] in 'aeiou' else 'a'} {colour_name} {rest}"
        if rest.startswith("coloured "):
            first = f"{'an' if colour_name[0] in 'aeiou' else 'a'} {colour_name} {rest[len('coloured ') :]}"
        return [
            first.capitalize() + ".",
            f"A 3D model: {words.replace('coloured ', '')}, coloured {colour_name}.",
        ]
    return [words.capitalize() + ".", f"A 3D model of {words}, without colour."]


def make_mesh_mini(out: Path) -> dict:
    """``mesh_mini/shapes/shape_NNN.<ext>`` + ``shape_NNN.txt`` and ``mesh_mini/captions.csv``."""
    import csv

    root = out / "mesh_mini"
    (root / "shapes").mkdir(parents=True)
    rng = np.random.default_rng(SEED + 4)
    rows, n = [], 0
    for shape, fmt, variants in MESH_PLAN:
        for words, param in variants:
            colour_name, colour = MESH_COLOURS[n % len(MESH_COLOURS)]
            ext, data = _shape_file(shape, fmt, param, colour, rng)
            uid = f"shape_{n:03d}"
            (root / "shapes" / f"{uid}.{ext}").write_bytes(data)
            captions = _mesh_captions(words, fmt, colour_name)
            (root / "shapes" / f"{uid}.txt").write_text(
                "\n".join(captions) + "\n", encoding="utf-8"
            )
            rows.append({"uid": uid, "caption": captions[0], "path": f"shapes/{uid}.{ext}"})
            n += 1
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=["uid", "caption", "path"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    (root / "captions.csv").write_text(text.getvalue(), encoding="utf-8")
    return {"n_shapes": n}


# --------------------------------------------------------------------------------------------


def _dir_size(p: Path) -> tuple[int, int]:
    files = [f for f in p.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\n\nWrites coco_mini/ (scikit-image photos + "
        "300 generated shape images, COCO captions json) and librispeech_mini/ (48 synthesised "
        "note sequences, FLAC + trans.txt) and text_mini/ (short documents, JSONL) and video_mini/ (36 generated videos of "
        "moving shapes with captions) and mesh_mini/ (30 generated 3D shapes with captions) under --out. "
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
        choices=["coco", "librispeech", "text", "video", "3d"],
        default=None,
        help="regenerate only one of the corpora",
    )
    args = ap.parse_args(argv)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    if args.only in (None, "coco"):
        if (out / "coco_mini").exists():
            shutil.rmtree(out / "coco_mini")
        summary["coco"] = make_coco(out)
    if args.only in (None, "librispeech"):
        if (out / "librispeech_mini").exists():
            shutil.rmtree(out / "librispeech_mini")
        summary["librispeech"] = make_librispeech(out)
    if args.only in (None, "text"):
        if (out / "text_mini").exists():
            shutil.rmtree(out / "text_mini")
        summary["text"] = make_text(out)

    if args.only in (None, "video"):
        if (out / "video_mini").exists():
            shutil.rmtree(out / "video_mini")
        summary["video"] = make_video_mini(out)

    if args.only in (None, "3d"):
        if (out / "mesh_mini").exists():
            shutil.rmtree(out / "mesh_mini")
        summary["3d"] = make_mesh_mini(out)

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
