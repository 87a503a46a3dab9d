"""3D corpora: meshes and point clouds with captions, from a folder or a manifest (Cap3D style).

``read(root=DIR)``: every ``*.obj``/``.ply``/``.off``/``.stl``/``.glb``/``.gltf``/``.npy`` under
``DIR`` with its ``.txt`` or ``.json`` caption sidecar, exactly as `converters.readers.folder`
reads images (same sidecar rules, sorted paths, key = relative path without extension).

``read(manifest=FILE)``: JSONL, CSV, TSV or Parquet rows, read by
`converters.readers.manifest`: the 3D file's path (relative to the manifest, or its bytes in a
Parquet binary column, whose format is then recognised by content) in ``path_column`` (default
``path``), the caption in ``text_column`` (default ``caption``, Cap3D's) and the sample id in
``id_column`` (default ``uid``, Cap3D's; ``None``/empty: the path without extension). The reader
never looks inside the files: the writer parses each one (`converters.mesh3d.encode_3d`).
"""

from __future__ import annotations

import dataclasses

from converters.mesh3d import EXTENSIONS
from converters.readers import InputError, folder
from converters.readers import manifest as manifest_reader
from converters.records import ReadResult

#: What ``convert 3d`` output's samples are (``.nv-meta/dataset.yaml``, the media part names).
MODALITY = "pointcloud"


def read(
    root: str | None = None,
    manifest: str | None = None,
    path_column: str = "path",
    text_column: str = "caption",
    id_column: str | None = "uid",
    fmt: str | None = None,
) -> ReadResult:
    if (root is None) == (manifest is None):
        raise InputError(
            "convert 3d needs exactly one of --root (a folder with caption sidecars) "
            "or --manifest (JSONL/CSV/TSV/Parquet)"
        )
    if root is not None:
        return folder.read(root, extensions=set(EXTENSIONS), modality=MODALITY, what="3D folder")
    result = manifest_reader.read(
        manifest,
        image_column=path_column,
        text_column=text_column,
        id_column=id_column or None,
        fmt=fmt,
    )
    return dataclasses.replace(result, modality=MODALITY)
