#!/usr/bin/env python3
"""Regenerate the project's embedded default corpora, byte for byte.

Writes two small corpora under ``--out`` (default: ``<repo>/data``):

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

``librispeech_mini/``
    LibriSpeech layout ``SPK/CHAP/SPK-CHAP-UTT.flac`` + ``SPK/CHAP/SPK-CHAP.trans.txt``:
    3 speakers x 2 chapters x 8 utterances of synthesised musical notes, 16 kHz mono FLAC
    (PCM_16), 0.6-2.5 s each. The transcript spells out what is played ("NOTE C NOTE E NOTE G",
    "THREE RISING NOTES C E G", "A C MAJOR CHORD", "NOTE A PAUSE NOTE D", ...). A speaker is a
    timbre (its harmonic mix) and an octave; a chapter is a tempo.

Everything is deterministic: fixed seeds, fixed lists, no timestamps in any file (JPEG carries
no EXIF except the single orientation tag, PNG has no tIME chunk, FLAC has no date). Output is
byte-identical across runs with the same library versions (Pillow, libjpeg, zlib, libsndfile
and scikit-image's bundled files); ``tests/test_default_data.py`` checks that.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
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
    (1, "astronaut.png", "photo", [
        "A smiling astronaut in an orange spacesuit posing beside an American flag.",
        "Portrait of a woman astronaut in an orange flight suit with a helmet in front of her.",
        "An astronaut with short hair smiling, with a model of the space shuttle behind her.",
        "Official portrait of an astronaut next to a flag and a space shuttle model.",
    ]),
    (2, "brick.png", "photo", [
        "A black and white close-up of a brick wall with light mortar lines.",
        "Long narrow bricks laid in staggered rows, seen at an angle.",
        "Grayscale texture of a brick surface.",
    ]),
    (3, "camera.png", "photo", [
        "A black and white photo of a man looking through a camera on a tripod.",
        "A man in a dark coat filming with a camera mounted on a tripod in a grassy field.",
        "A cameraman standing on a lawn with buildings far in the background.",
    ]),
    (4, "cell.png", "photo", [
        "A microscope image of a single round cell floating in liquid.",
        "A bright round cell on a gray background, seen under a microscope.",
        "Grayscale microscopy of one cell to the right of the frame.",
    ]),
    (5, "chelsea.png", "photo", [
        "A close-up of a tabby cat's face with green eyes.",
        "A brown striped cat looking slightly to the side.",
        "The face of a tabby cat with a pink nose and long white whiskers.",
    ]),
    (6, "clock_motion.png", "photo", [
        "A round wall clock blurred by motion against a plain gray wall.",
        "A grayscale photo of a clock smeared sideways by camera motion.",
        "A blurry bright round object in the middle of a gray background.",
    ]),
    (7, "coffee.png", "photo", [
        "A cup of espresso on a red saucer with a small spoon.",
        "A red and white coffee cup on a wooden table.",
        "An espresso with golden crema in a red cup, seen from above.",
    ]),
    (8, "coins.png", "photo", [
        "Ancient coins arranged in four rows on a dark background.",
        "A black and white photo of twenty four old coins.",
        "Rows of ancient coins showing heads and standing figures.",
    ]),
    (9, "color.png", "graphic", [
        "A colour wheel with a white centre and every hue around it, on a black background.",
        "A circular chart of hues that fade from white in the middle to dark at the edge.",
        "A rainbow coloured disc showing red, yellow, green, cyan, blue and magenta.",
    ]),
    (10, "grass.png", "photo", [
        "A grayscale close-up of grass and small leaves.",
        "Black and white texture of a lawn seen from above.",
        "Dense blades of grass photographed from above.",
    ]),
    (11, "gravel.png", "photo", [
        "A grayscale image of small gravel stones.",
        "A close-up texture of crushed rock.",
        "A dense layer of angular gravel seen from above.",
    ]),
    (12, "horse.png", "graphic", [
        "A black silhouette of a horse on a white background.",
        "The side view of a standing horse drawn in solid black.",
        "A horse shape facing right.",
    ]),
    (13, "hubble_deep_field.jpg", "photo", [
        "A deep space telescope image full of distant galaxies.",
        "A black sky dotted with many small colourful galaxies.",
        "The Hubble deep field showing thousands of faint galaxies.",
    ]),
    (14, "ihc.png", "photo", [
        "A microscope image of tissue stained brown and blue.",
        "A stained tissue sample with brown cell membranes and blue nuclei.",
        "Immunohistochemistry slide of glands in tissue under a microscope.",
    ]),
    (15, "logo.png", "graphic", [
        "The scikit-image logo, a green and orange circle with a snake.",
        "A round logo split into green and orange halves by a white curved line.",
        "A circular emblem showing the head of a snake in orange and green.",
    ]),
    (16, "microaneurysms.png", "photo", [
        "A small grayscale crop of a retina with blood vessels and two dark spots.",
        "A close-up retinal image with dark vessel lines and small round dots.",
    ]),
    (17, "moon.png", "photo", [
        "A grayscale image of the surface of the moon with small craters.",
        "A close-up of gray lunar terrain with a bright crater in the upper left.",
        "The surface of the moon seen from above.",
    ]),
    (18, "motorcycle_left.png", "photo", [
        "A red motorcycle parked in a garage.",
        "A red motorbike standing on its stand in front of shelves.",
        "A red and black motorcycle in a cluttered workshop.",
    ]),
    (19, "page.png", "photo", [
        "A photo of a printed page about region-based segmentation.",
        "A grayscale picture of a book page with a heading and a line of code.",
        "Printed text explaining how to find markers of coins and background.",
    ]),
    (20, "retina.jpg", "photo", [
        "A colour photo of the back of a human eye showing blood vessels.",
        "A retina image with red vessels and a bright optic disc on the left.",
        "An orange-red retina on a black background.",
    ]),
    (21, "rocket.jpg", "photo", [
        "A rocket on a launch pad at dusk between tall towers.",
        "A white rocket standing upright under a dark blue evening sky.",
        "A launch pad with bright lights and tall towers around a rocket.",
    ]),
    (22, "text.png", "photo", [
        "Handwritten mathematical notes photographed at an angle.",
        "A grayscale image of handwritten equations on paper.",
        "A close-up of pen writing with fractions and symbols.",
    ]),
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
        images.append({"id": image_id, "file_name": out_name, "width": width, "height": height,
                       "license": 1, "source": f"skimage.data/{fname}", "kind": kind})
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
POS_NAMES = [["top left", "top", "top right"],
             ["left", "center", "right"],
             ["bottom left", "bottom", "bottom right"]]
POS_PHRASES = {
    "top left": "in the top left corner", "top": "at the top", "top right": "in the top right corner",
    "left": "on the left", "center": "in the center", "right": "on the right",
    "bottom left": "in the bottom left corner", "bottom": "at the bottom",
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


def draw_shape(d: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill,
               bg) -> None:
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
    names = [n for n in COLOURS if n not in avoid and n not in bg_name.split()
             and _dist(COLOURS[n], bg_rgb) > 150]
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
                        d.rectangle([i * sx, j * sy, (i + 1) * sx - 1, (j + 1) * sy - 1],
                                    fill=COLOURS[col])
        if pattern == "checkerboard":
            caps = [f"{_article(col)} {col} and {bg_name} checkerboard pattern",
                    f"checkerboard, {col} on {bg_name}, {NUM_WORDS[n]} by {NUM_WORDS[n]} squares"]
        else:
            caps = [f"{col} {pattern} on a {bg_name} background",
                    f"{NUM_WORDS[n]} {col} {pattern.split()[0]} stripes, {bg_name} background"]
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
                c1 = (f"{_article(size)} {size} {col} {shape} {POS_PHRASES[pos]} "
                      f"on {_article(bg_name)} {bg_name} background")
            else:
                c1 = f"{_article(col)} {col} {shape} {POS_PHRASES[pos]}, {bg_name} background"
            caps = [c1, f"{col} {shape}, {pos}"]
        else:
            (s1, c1_, sh1, p1), (s2, c2_, sh2, p2) = objs
            caps = [f"{_article(s1)} {s1} {c1_} {sh1} and {_article(s2)} {s2} {c2_} {sh2} "
                    f"on {_article(bg_name)} {bg_name} background",
                    f"two shapes: {c1_} {sh1} {POS_PHRASES[p1]}, {c2_} {sh2} {POS_PHRASES[p2]}"]
    im = canvas.resize((w, h), Image.Resampling.LANCZOS)
    return im, caps


def write_generated(img_dir: Path, images: list, annotations: list) -> int:
    rng = random.Random(SEED)
    for k in range(N_GENERATED):
        image_id = FIRST_GENERATED_ID + k
        im, caps = make_generated(rng)
        name = f"COCO_mini_{image_id:012d}.png"
        im.save(img_dir / name, format="PNG", optimize=False, compress_level=9)
        images.append({"id": image_id, "file_name": name, "width": im.width, "height": im.height,
                       "license": 2, "source": "generated", "kind": "generated"})
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
    annotations = [{"id": a["id"], "image_id": a["image_id"], "caption": a["caption"]}
                   for a in annotations]
    doc = {
        "info": info,
        "licenses": [
            {"id": 1, "name": "scikit-image sample data (see skimage/data/README and the "
                              "scikit-image documentation for each image's source and licence)",
             "url": "https://scikit-image.org/docs/stable/api/skimage.data.html"},
            {"id": 2, "name": "CC0 (generated by this project)", "url": ""},
        ],
        "images": images,
        "annotations": annotations,
    }
    (root / "captions.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    return {"photos": used, "n_generated": n_gen, "n_images": len(images),
            "n_captions": len(annotations)}


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
    env[n - rel:] = np.linspace(1.0, 0.0, rel)
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
        events = [("note", x) for x in names[:cut]] + [("pause", None)] + \
                 [("note", x) for x in names[cut:]]
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
    return {"n_utterances": n_utt, "total_seconds": total_s,
            "min_seconds": min(durations), "max_seconds": max(durations)}


# --------------------------------------------------------------------------------------------


def _dir_size(p: Path) -> tuple[int, int]:
    files = [f for f in p.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\n\nWrites coco_mini/ (scikit-image photos + "
        "300 generated shape images, COCO captions json) and librispeech_mini/ (48 synthesised "
        "note sequences, FLAC + trans.txt) under --out. Deterministic: two runs give "
        "byte-identical files. See the module docstring for details.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help=f"output folder (default: {DEFAULT_OUT.relative_to(REPO_ROOT)}/ in the repo)")
    ap.add_argument("--only", choices=["coco", "librispeech"], default=None,
                    help="regenerate only one of the two corpora")
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

    if "coco" in summary:
        c = summary["coco"]
        n, size = _dir_size(out / "coco_mini")
        print(f"coco_mini: {c['n_images']} images ({len(c['photos'])} from skimage.data, "
              f"{c['n_generated']} generated), {c['n_captions']} captions, "
              f"{n} files, {size / 1e6:.2f} MB")
        print(f"  photos: {', '.join(c['photos'])}")
    if "librispeech" in summary:
        s = summary["librispeech"]
        n, size = _dir_size(out / "librispeech_mini")
        print(f"librispeech_mini: {s['n_utterances']} utterances, {s['total_seconds']:.1f} s "
              f"({s['min_seconds']:.2f}-{s['max_seconds']:.2f} s each), {n} files, "
              f"{size / 1e6:.2f} MB")
    n, size = _dir_size(out)
    print(f"total under {out}: {n} files, {size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
