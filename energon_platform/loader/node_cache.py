"""This node's cache folder, and copies of object-storage files made once per node.

``$ENERGON_PLATFORM_CACHE``, else ``~/.cache/energon-platform``: the length indexes a run cannot
store with its data (`balance.length_store`) and `node_copy`'s copies (Energon's
``index.sqlite`` of a dataset on object storage, which sqlite can read only from a file).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """``$ENERGON_PLATFORM_CACHE``, else ``~/.cache/energon-platform``."""
    return Path(
        os.environ.get("ENERGON_PLATFORM_CACHE") or Path.home() / ".cache" / "energon-platform"
    )


def node_copy(path: Any, kind: str) -> Path:
    """A local copy of the object ``path`` (an Energon ``EPath`` on object storage) in
    ``cache_root()/kind``, named by its URL and its version (size and ETag or modification time):
    made by the first process of the node that asks (under a lock; the others wait and reuse it),
    and made again only when the object changed."""
    meta = path.stat()
    version = getattr(meta, "etag", None) or getattr(meta, "last_modified", "")
    name = hashlib.sha256(f"{path.url}|{meta.content_length}|{version}".encode()).hexdigest()[:24]
    folder = cache_root() / kind
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / f"{name}{Path(str(path.name)).suffix}"
    if copy.is_file():
        return copy
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        if not copy.is_file():
            tmp = folder / f".{name}.{os.getpid()}.tmp"
            with path.open("rb") as source, open(tmp, "wb") as out:
                while block := source.read(1 << 22):
                    out.write(block)
            os.replace(tmp, copy)
    return copy
