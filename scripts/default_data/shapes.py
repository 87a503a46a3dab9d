"""coco_mini's generated shape images, and the shape drawing the videos share."""

from __future__ import annotations

import math
import random
from pathlib import Path

from PIL import Image, ImageDraw

from .common import SEED, article

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
                f"{article(col)} {col} and {bg_name} checkerboard pattern",
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
                c1 = f"{article(size)} {size} {col} {shape} on {article(bg_name)} {bg_name} background"
            elif t == 1:
                c1 = (
                    f"{article(size)} {size} {col} {shape} {POS_PHRASES[pos]} "
                    f"on {article(bg_name)} {bg_name} background"
                )
            else:
                c1 = f"{article(col)} {col} {shape} {POS_PHRASES[pos]}, {bg_name} background"
            caps = [c1, f"{col} {shape}, {pos}"]
        else:
            (s1, c1_, sh1, p1), (s2, c2_, sh2, p2) = objs
            caps = [
                f"{article(s1)} {s1} {c1_} {sh1} and {article(s2)} {s2} {c2_} {sh2} "
                f"on {article(bg_name)} {bg_name} background",
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
