"""The encoder's part of the loader fingerprint, and the digest its config is named by.

The fingerprint ([`LoaderState`][energon_platform.loader.state.LoaderState]) is assembled by
`RunPlan` from its components' parts: the encoder (here),
the dataset orders (`describe`), the schedule
(`SCHEDULE_VERSION`) and the batching mode
(`batching`). The length index is keyed by the same digest.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from task_encoders.config_parser import to_plain

if TYPE_CHECKING:
    from task_encoders.base import SeededTaskEncoder


def digest(obj: Any) -> str:
    """16 hex digits of the SHA-256 of ``obj`` as sorted JSON (non-JSON values as ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def encoder_config(encoder: SeededTaskEncoder) -> Any:
    """The encoder's config as plain data, less what does not change the data: the seed (the
    loader's seed is fingerprinted on its own) and the skip limits."""
    config = to_plain(encoder.config)
    if isinstance(config, dict):
        config.pop("seed", None)
        config.pop("errors", None)
    return config


def encoder_digest(encoder: SeededTaskEncoder) -> str:
    """The digest of `encoder_config` (the length index and the fingerprint use it)."""
    return digest(encoder_config(encoder))


def encoder_part(encoder: SeededTaskEncoder) -> dict:
    """``{"name", "config_sha"}``: the fingerprint's ``encoder`` entry. The name is the class's
    ``fingerprint_name`` (its own name unless it sets one): a mode split into a subclass records
    its old name, so checkpoints saved before the split still resume."""
    return {"name": type(encoder).fingerprint_name, "config_sha": encoder_digest(encoder)}
