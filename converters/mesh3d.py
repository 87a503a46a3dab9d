"""3D geometry: parse, validate and store meshes and point clouds; load and sample stored ones.

Formats: meshes as OBJ (triangles or polygons, fan-triangulated by trimesh), PLY (ASCII or
binary, with a face element), OFF, STL (ASCII or binary), GLB and glTF (every mesh of the scene,
node transforms applied); point clouds as PLY without faces (``red``/``green``/``blue`` colours
optional) and NPY arrays ``(N, 3)`` or ``(N, 6)`` (xyz, then rgb in [0, 1] or [0, 255]).
Parsers: numpy for NPY, trimesh (``process=False``: the file's own vertices and faces, nothing
merged or dropped) for the rest; the converter also reads a PLY with plyfile, which knows how many
elements the header declares.

`encode_3d` (the converter) parses a file fully and raises
`MediaError` with one of: ``empty_file``; ``not_a_3d_file`` (no known 3D
format, or an NPY of pickled objects); ``truncated_3d`` (fewer elements or bytes than the header or
the file's own references declare); ``corrupt_3d`` (a complete file whose structure contradicts
itself, e.g. GLB chunk lengths that do not add up to its length); ``no_geometry`` (no vertex, or a
mesh format without a face); ``degenerate_3d`` (non-finite coordinates, every point equal, or zero
total surface area). The bytes are stored
as they are, except glTF, whose buffers may live in other files: it is re-encoded as one GLB
(trimesh's exporter, deterministic). `load` (the encoder) reads stored bytes again without
the checks; `sample_surface` draws area-weighted surface points from a caller's generator.
"""

from __future__ import annotations

import io
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from converters.media import MediaError

#: File extension → format name. The converter picks files up by these.
EXTENSIONS = {
    ".obj": "obj",
    ".ply": "ply",
    ".off": "off",
    ".stl": "stl",
    ".glb": "glb",
    ".gltf": "gltf",
    ".npy": "npy",
}
#: Formats whose geometry is a triangle mesh by nature (a point-only file of these is ``no_geometry``).
MESH_ONLY = {"off", "stl", "glb", "gltf"}


@dataclass(frozen=True)
class Geometry:
    """``vertices``: float64 ``(V, 3)``; ``faces``: int64 ``(F, 3)`` triangles, or None for a point
    cloud; ``colors``: uint8 ``(V, 3)`` per-vertex colours, or None."""

    vertices: np.ndarray
    faces: np.ndarray | None
    colors: np.ndarray | None

    @property
    def kind(self) -> str:
        return "points" if self.faces is None else "mesh"

    def triangles(self) -> np.ndarray:
        """float64 ``(F, 3, 3)``."""
        return self.vertices[self.faces]

    def area(self) -> float:
        return float(triangle_areas(self.triangles()).sum()) if self.faces is not None else 0.0


def triangle_areas(tri: np.ndarray) -> np.ndarray:
    return 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)


def sniff(data: bytes) -> str | None:
    """The format by content (for bytes without a file name, e.g. a Parquet cell); None if unknown."""
    head = data[:256]
    if head.startswith(b"ply"):
        return "ply"
    if head.startswith(b"glTF"):
        return "glb"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if re.match(rb"\s*C?N?OFF\b", head):
        return "off"
    if head.lstrip().startswith(b"{") and b'"asset"' in data[:4096]:
        return "gltf"
    if head.startswith(b"solid") or (
        len(data) >= 84 and len(data) == 84 + 50 * struct.unpack("<I", data[80:84])[0]
    ):
        return "stl"
    if re.search(rb"(?m)^v\s", data[:65536]):
        return "obj"
    return None


def format_of(name: str, data: bytes) -> str | None:
    """By the file name's extension, else by content (`sniff`)."""
    return EXTENSIONS.get(Path(name).suffix.lower()) or sniff(data)


# --- loading (no checks) ---------------------------------------------------------------------


def _colors_u8(rgb: np.ndarray) -> np.ndarray:
    rgb = np.asarray(rgb, dtype=np.float64)
    if rgb.size and rgb.max() <= 1.0:
        rgb = rgb * 255.0
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def _load_npy(data) -> Geometry:
    arr = data if isinstance(data, np.ndarray) else np.load(io.BytesIO(data), allow_pickle=False)
    if arr.ndim != 2 or arr.shape[1] not in (3, 6) or arr.dtype.kind not in "fiu":
        raise ValueError(
            f"an NPY array of shape {arr.shape} and dtype {arr.dtype}, not (N, 3|6) numbers"
        )
    return Geometry(
        arr[:, :3].astype(np.float64), None, _colors_u8(arr[:, 3:6]) if arr.shape[1] == 6 else None
    )


def _ply_elements(data: bytes) -> None:
    """Read every PLY element with plyfile, which raises when the file holds fewer than its header
    declares (trimesh may read a cut binary PLY without complaint)."""
    from plyfile import PlyData

    PlyData.read(io.BytesIO(data))


def _vertex_colors(visual) -> np.ndarray | None:
    """uint8 ``(V, 3)`` vertex colours a loader set, or None. Reads what the loader stored (trimesh
    5.2's ``ColorVisuals._data``) instead of ``visual.kind``, which hashes the whole mesh first
    (about 1 ms for a 5,000-face STL); ``kind`` is the fallback for other visual types."""
    data = getattr(getattr(visual, "_data", None), "data", None)
    if isinstance(data, dict):
        colors = data.get("vertex_colors")
    else:
        colors = visual.vertex_colors if getattr(visual, "kind", None) == "vertex" else None
    return None if colors is None else np.asarray(colors)[:, :3].astype(np.uint8)


def _scene_parts(scene) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Every mesh instance of a scene as (vertices with the node's transform applied, faces,
    colours), in the scene graph's node order: what ``Scene.to_geometry()`` concatenates, without
    its copies and caches. Point clouds and paths in a scene are left out."""
    import trimesh

    parts = []
    for node in scene.graph.nodes_geometry:
        transform, name = scene.graph[node]
        geom = scene.geometry[name]
        if not isinstance(geom, trimesh.Trimesh) or not len(geom.faces):
            continue
        vertices = (
            np.asarray(geom.vertices, dtype=np.float64) @ transform[:3, :3].T + transform[:3, 3]
        )
        parts.append(
            (
                vertices,
                np.asarray(geom.faces, dtype=np.int64).reshape(-1, 3),
                _vertex_colors(geom.visual),
            )
        )
    return parts


def _load_trimesh(data: bytes, fmt: str, resolver=None) -> Geometry:
    import trimesh

    loaded = trimesh.load(io.BytesIO(data), file_type=fmt, process=False, resolver=resolver)
    if isinstance(loaded, trimesh.Scene):
        parts = _scene_parts(loaded)
        if not parts:
            return Geometry(np.zeros((0, 3)), None, None)
        offsets = np.cumsum([0] + [len(v) for v, _, _ in parts[:-1]])
        colors = None
        if all(c is not None for _, _, c in parts):
            colors = np.concatenate([c for _, _, c in parts])
        return Geometry(
            np.concatenate([v for v, _, _ in parts]),
            np.concatenate([f + o for (_, f, _), o in zip(parts, offsets)]),
            colors,
        )
    vertices = np.asarray(loaded.vertices, dtype=np.float64)
    if isinstance(loaded, trimesh.PointCloud):
        colors = loaded.colors if len(getattr(loaded, "colors", [])) else None
        return Geometry(
            vertices,
            None,
            _colors_u8(np.asarray(colors)[:, :3] / 255.0) if colors is not None else None,
        )
    faces = np.asarray(loaded.faces, dtype=np.int64).reshape(-1, 3)
    return Geometry(vertices, faces if len(faces) else None, _vertex_colors(loaded.visual))


def load(data, fmt: str, resolver=None) -> Geometry:
    """The geometry of stored bytes (or of the array Energon decoded an ``.npy`` part into);
    any parser error propagates (``ValueError`` and others): use `check` for reasons."""
    if fmt == "npy":
        return _load_npy(data)
    return _load_trimesh(data, fmt, resolver)


# --- validation (the converter) --------------------------------------------------------------


def _declared_elements(data: bytes, fmt: str) -> str | None:
    """Why the bytes hold fewer elements than their header (or their own face indices) declare;
    None when they hold them all. Cheap: counts, no geometry built."""
    if fmt == "stl" and not data.lstrip().startswith(b"solid"):
        if len(data) < 84:
            return f"{len(data)} bytes, a binary STL header is 84"
        n = struct.unpack("<I", data[80:84])[0]
        return (
            f"{(len(data) - 84) // 50} triangles, {n} declared" if len(data) < 84 + 50 * n else None
        )
    if fmt == "stl":
        return None if b"endsolid" in data[-4096:] else "an ASCII STL without its endsolid line"
    text = data.decode("utf-8", errors="replace")
    if fmt == "off":
        lines = [ln.split("#", 1)[0].split() for ln in text.splitlines()]
        lines = [ln for ln in lines if ln]
        first = lines[0][0] if lines else ""
        counts = lines[0][1:] if len(lines[0]) > 1 else (lines[1] if len(lines) > 1 else [])
        rest = len(lines) - (1 if len(lines[0]) > 1 else 2)
        try:
            nv, nf = int(counts[0]), int(counts[1])
        except (IndexError, ValueError):
            return f"no vertex/face counts after {first!r}"
        return (
            None if rest >= nv + nf else f"{max(rest, 0)} vertex/face lines, {nv} + {nf} declared"
        )
    if fmt == "obj":
        nv = len(re.findall(r"(?m)^v\s", text))
        faces = re.findall(r"(?m)^f\s+(.*)$", text)
        worst = max(
            (
                abs(int(t.split("/")[0]))
                for f in faces
                for t in f.split()
                if t.split("/")[0].lstrip("-").isdigit()
            ),
            default=0,
        )
        return f"a face names vertex {worst}, {nv} vertices given" if worst > nv else None
    return None


def _glb_chunks(data: bytes) -> tuple[str, str] | None:
    """``(reason, detail)`` when a GLB's header and chunk lengths do not describe its bytes, else
    None: ``truncated_3d`` when the file is shorter than the total its header declares,
    ``corrupt_3d`` when that total or a chunk length contradicts the bytes there are (the file
    longer than declared, a chunk running past the end or not ending where the next one starts,
    a first chunk that is not JSON)."""
    if len(data) < 20:
        return "truncated_3d", f"{len(data)} bytes, a GLB header and its first chunk header take 20"
    total = struct.unpack("<I", data[8:12])[0]
    if len(data) != total:
        return (
            "truncated_3d" if len(data) < total else "corrupt_3d"
        ), f"{len(data)} bytes, the header declares {total}"
    at, index = 12, 0
    while at < total:
        if total - at < 8:
            return "corrupt_3d", (
                f"the chunk lengths do not add up to the file length: {total - at} bytes left at byte {at}, "
                "a chunk header takes 8"
            )
        length, kind = struct.unpack("<I4s", data[at : at + 8])
        if index == 0 and kind != b"JSON":
            return "corrupt_3d", f"the first chunk is {kind!r}, not JSON"
        if length > total - at - 8:
            return "corrupt_3d", (
                f"the chunk lengths do not add up to the file length: chunk {index} at byte {at} declares "
                f"{length} bytes, {total - at - 8} follow"
            )
        at, index = at + 8 + length, index + 1
    return None


def _npy_header(data: bytes) -> tuple[str, str] | None:
    """``(reason, detail)`` when an NPY header does not describe a numeric ``(N, 3|6)`` array whose
    bytes are all there, else None: ``not_a_3d_file`` for pickled Python objects (never loaded),
    another shape or a non-numeric dtype, ``truncated_3d`` for fewer data bytes than declared."""
    f = io.BytesIO(data)
    try:
        major, _ = np.lib.format.read_magic(f)
        read_header = (
            np.lib.format.read_array_header_1_0
            if major == 1
            else np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = read_header(f)
    except ValueError as e:
        return "truncated_3d", f"no readable header ({str(e)[:120]})"
    if dtype.hasobject:
        return (
            "not_a_3d_file",
            "an array of pickled Python objects (never loaded); store numbers, shape (N, 3|6)",
        )
    if len(shape) != 2 or shape[1] not in (3, 6) or dtype.kind not in "fiu":
        return "not_a_3d_file", f"an array of shape {shape} and dtype {dtype}, not (N, 3|6) numbers"
    need = int(np.prod(shape)) * dtype.itemsize
    return (
        ("truncated_3d", f"{len(data) - f.tell()} data bytes, {need} declared")
        if len(data) - f.tell() < need
        else None
    )


#: Formats whose lengths are checked in full before parsing: a parse failure then is corruption.
_LENGTHS_CHECKED = {"glb", "npy"}


def _magic(data: bytes, fmt: str) -> bool:
    """Whether the bytes start like a file of ``fmt`` (a failure to parse is then truncation or corruption)."""
    return {
        "ply": data.startswith(b"ply"),
        "glb": data.startswith(b"glTF"),
        "npy": data.startswith(b"\x93NUMPY"),
        "off": bool(re.match(rb"\s*C?N?OFF", data)),
        "gltf": data.lstrip().startswith(b"{"),
        "stl": data.lstrip().startswith(b"solid") or len(data) >= 80,
        "obj": b"\0" not in data[:4096] and bool(re.search(rb"(?m)^(v|f|o|g|#)\s", data[:65536])),
    }.get(fmt, False)


def check(data: bytes, fmt: str | None, resolver=None) -> Geometry:
    """Parse fully and validate (module doc); `MediaError` with the reason otherwise."""
    if not data:
        raise MediaError("empty_file", "zero bytes")
    if fmt is None or not _magic(data, fmt):
        raise MediaError("not_a_3d_file", f"not a {fmt.upper() if fmt else 'known 3D'} file")
    wrong = {"glb": _glb_chunks, "npy": _npy_header}.get(fmt, lambda _: None)(data)
    if wrong:
        raise MediaError(wrong[0], f"{fmt}: {wrong[1]}")
    short = _declared_elements(data, fmt)
    if short:
        raise MediaError("truncated_3d", f"{fmt}: {short}")
    try:
        if fmt == "ply":
            _ply_elements(data)
        geom = load(data, fmt, resolver)
    except Exception as e:  # parsers raise anything from ValueError to struct.error on cut files
        reason = "corrupt_3d" if fmt in _LENGTHS_CHECKED else "truncated_3d"
        raise MediaError(
            reason, f"{fmt}: cannot be parsed ({type(e).__name__}: {str(e)[:120]})"
        ) from e
    if not len(geom.vertices):
        raise MediaError("no_geometry", f"{fmt}: no vertex")
    if geom.faces is None and fmt in MESH_ONLY:
        raise MediaError("no_geometry", f"{fmt}: no face")
    if geom.faces is not None and (geom.faces.min() < 0 or geom.faces.max() >= len(geom.vertices)):
        raise MediaError("truncated_3d", f"{fmt}: a face names a vertex the file does not have")
    if not np.isfinite(geom.vertices).all():
        raise MediaError("degenerate_3d", f"{fmt}: non-finite coordinates")
    if not np.ptp(geom.vertices, axis=0).any():
        raise MediaError("degenerate_3d", f"{fmt}: every point is the same")
    if geom.faces is not None and geom.area() <= 0.0:
        raise MediaError("degenerate_3d", f"{fmt}: zero surface area")
    return geom


def info(geom: Geometry, fmt: str, stored: str) -> dict:
    """Provenance for ``text.json``: counts, bounds, colours, area (meshes), formats."""
    lo, hi = geom.vertices.min(axis=0), geom.vertices.max(axis=0)
    out = {
        "format": stored,
        "kind": geom.kind,
        "vertices": int(len(geom.vertices)),
        "faces": int(len(geom.faces)) if geom.faces is not None else 0,
        "colors": geom.colors is not None,
        "bounds": [[round(float(x), 6) for x in lo], [round(float(x), 6) for x in hi]],
    }
    if geom.faces is not None:
        out["area"] = round(geom.area(), 6)
    if stored != fmt:
        out["source_format"] = fmt
    return out


def encode_3d(data: bytes, name: str, path: str | None = None) -> tuple[str, bytes, dict]:
    """Validate one 3D file (`check`) and return ``(extension, bytes to store, info)``.
    ``name``: its file name (the format comes from its extension, else from the content);
    ``path``: where it lies, for the external buffers of a glTF file."""
    fmt = format_of(name, data) if data else None
    resolver = None
    if fmt == "gltf" and path:
        import trimesh

        resolver = trimesh.resolvers.FilePathResolver(path)
    geom = check(data, fmt, resolver)
    if fmt != "gltf":
        return fmt, data, info(geom, fmt, fmt)
    import trimesh

    mesh = trimesh.Trimesh(
        geom.vertices,
        geom.faces,
        process=False,
        vertex_colors=geom.colors if geom.colors is not None else None,
    )
    return "glb", trimesh.Scene(mesh).export(file_type="glb"), info(geom, fmt, "glb")


# --- sampling (the encoder) ------------------------------------------------------------------


def sample_surface(
    geom: Geometry, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray | None]:
    """``count`` points on the surface, faces chosen with probability proportional to their area
    and a uniform point in each (trimesh's `trimesh.sample.sample_surface`, with ``rng``);
    colours interpolated from the vertices' by the barycentric weights. A point cloud gives
    ``count`` of its points: a draw without replacement when it has that many, else every point
    and a draw with replacement for the rest. Returns float64 ``(count, 3)``, uint8 ``(count, 3)`` or None."""
    if geom.faces is None:
        n = len(geom.vertices)
        if n >= count:
            idx = rng.choice(n, size=count, replace=False)
        else:
            idx = np.concatenate([np.arange(n), rng.integers(0, n, size=count - n)])
        return geom.vertices[idx], geom.colors[idx] if geom.colors is not None else None
    from trimesh.sample import sample_surface as trimesh_sample

    points, face_index, bary = trimesh_sample(
        _MeshView(geom), count, seed=rng, return_barycentric=True
    )
    if geom.colors is None:
        return points, None
    rgb = np.einsum("nk,nkc->nc", bary, geom.colors[geom.faces[face_index]].astype(np.float64))
    return points, np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


class _MeshView:
    """What `trimesh.sample.sample_surface` reads of a mesh (``vertices``, ``faces``,
    ``area_faces``), without building a ``Trimesh`` (its caches and checks cost more than the draw)."""

    def __init__(self, geom: Geometry):
        self.vertices, self.faces = geom.vertices, geom.faces
        self.area_faces = triangle_areas(geom.triangles())


__all__ = [
    "EXTENSIONS",
    "Geometry",
    "check",
    "encode_3d",
    "format_of",
    "load",
    "sample_surface",
    "sniff",
]
