"""Run configs (what ``energon-platform train --config`` reads) built from the tests' defaults.

:func:`loader_config` is the data, encoder and loader sections a loader needs; :func:`run_config`
adds a tiny model and a short training run. Each section's keyword overrides update the defaults
(a key set to a new value replaces it; other keys stay), so a test names only what it varies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.helpers import REPO

SMALL_IMAGE_TEXT = str(REPO / "configs/encoders/image_text_small.yaml")
"""The small image-text encoder config (16 px patches, short sequences)."""

LOADER = {"global_batch_size": 4, "num_workers": 0, "seed": 3}
MODEL = {"dim": 16, "layers": 1, "heads": 2, "patch": 16}
TRAIN = {"steps": 4, "checkpoint_every": 2, "warmup": 1}


def loader_config(
    data: Path | str | dict, encoder: Path | str | dict = SMALL_IMAGE_TEXT, **loader: Any
) -> dict:
    """``data`` (a dataset path, or a whole ``data`` section), ``encoder`` (a config file, or an
    encoder config itself) and :data:`LOADER` updated by ``loader``."""
    section = dict(data) if isinstance(data, dict) else {"path": str(data)}
    encoder = encoder if isinstance(encoder, dict) else str(encoder)
    return {"data": section, "encoder": encoder, "loader": {**LOADER, **loader}}


def run_config(
    data: Path | str | dict,
    encoder: Path | str | dict = SMALL_IMAGE_TEXT,
    *,
    loader: dict | None = None,
    model: dict | None = None,
    train: dict | None = None,
) -> dict:
    """:func:`loader_config` with :data:`MODEL` and :data:`TRAIN`, each section updated by the
    dict given for it."""
    return {
        **loader_config(data, encoder, **(loader or {})),
        "model": {**MODEL, **(model or {})},
        "train": {**TRAIN, **(train or {})},
    }


def write_config(path: Path, config: dict) -> Path:
    """``config`` written to ``path`` as YAML; returns ``path``."""
    path.write_text(yaml.safe_dump(config))
    return path
