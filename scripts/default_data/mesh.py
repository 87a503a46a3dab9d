"""``mesh_mini/``: generated 3D shapes with computed captions."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np

from .common import SEED

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
