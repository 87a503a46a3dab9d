"""Video corpora: a folder of videos with caption sidecars, or a manifest (WebVid style).

``read(root=DIR)``: every ``*.mp4``/``.webm``/``.mkv``/``.mov``/``.avi``/... under ``DIR`` with its
``.txt`` or ``.json`` sidecar, exactly as `converters.readers.folder` reads images (same
sidecar rules, sorted paths, key = relative path without extension).

``read(manifest=FILE)``: JSONL, CSV, TSV or Parquet rows, read by
`converters.readers.manifest` with the video path (relative to the manifest, or video bytes
in a Parquet binary column) in ``video_column`` (default ``path``), the caption in
``text_column`` (default ``name``, WebVid's caption column) and the sample id in ``id_column``
(default ``videoid``; ``None``/empty: the video path without extension). The reader never looks
inside the videos: the writer decodes each one (`converters.media.encode_video`).
"""

from __future__ import annotations

import dataclasses

from converters.readers import InputError, folder
from converters.readers import manifest as manifest_reader
from converters.records import ReadResult

#: File extensions the folder form picks up (any case).
VIDEO_EXTENSIONS = {".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi", ".flv", ".ts"}


def read(
    root: str | None = None,
    manifest: str | None = None,
    video_column: str = "path",
    text_column: str = "name",
    id_column: str | None = "videoid",
    fmt: str | None = None,
) -> ReadResult:
    if (root is None) == (manifest is None):
        raise InputError(
            "convert video needs exactly one of --root (a folder with caption sidecars) "
            "or --manifest (JSONL/CSV/TSV/Parquet)"
        )
    if root is not None:
        return folder.read(root, extensions=VIDEO_EXTENSIONS, modality="video", what="video folder")
    result = manifest_reader.read(
        manifest,
        image_column=video_column,
        text_column=text_column,
        id_column=id_column or None,
        fmt=fmt,
    )
    return dataclasses.replace(result, modality="video")
