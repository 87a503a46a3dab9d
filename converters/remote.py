"""Copy a finished local conversion to object storage (``msc://PROFILE/prefix``) through MSC.

What goes up: every file under the output folder except the converter's own resume state
(``.convert/``) and leftovers of an interrupted write (``*.tmp``): the shards and their
``.tar.idx``, ``.nv-meta/`` (Energon's index, ``split.yaml``, ``dataset.yaml``), ``report.json``,
``skipped.jsonl``. Object keys are the files' paths relative to the folder, under the URL.

Contracts:

- **Deterministic**: the same folder gives the same objects (keys, bytes) whatever the order or
  parallelism of the uploads; each object carries its SHA-256 as user metadata ``sha256``.
- **Idempotent**: an object already there with the same size and ``sha256`` is skipped (one HEAD
  request per file), so a second run, or one resumed after a failure, uploads only what differs.
- **Readers never see a half upload as a dataset**: shards and indices go first, then the files
  that make the folder a dataset for ``info`` and the loader (``.nv-meta/.info.json``, then
  ``.nv-meta/dataset.yaml``), last.
- :func:`upload_file` is a module-level function of plain arguments, so a Ray task can run it
  (``ray.remote(upload_file).remote(local, url)``); that worker resolves the profile from its own
  ``MSC_CONFIG`` (pass it with ``runtime_env={"env_vars": {"MSC_CONFIG": ...}}``).

Storage failures (credentials, connection after MSC's and botocore's retries) raise
:class:`~energon_platform.loader.source.StorageError` (one line).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from converters.output import ConvertError
from energon_platform.loader.source import storage_errors

#: Uploaded last, in this order: their presence is what makes the prefix a dataset.
COMMIT_FILES = (".nv-meta/.info.json", ".nv-meta/dataset.yaml")
_EXCLUDED_DIRS = (".convert",)


@dataclass(frozen=True)
class UploadResult:
    """One file: its object ``url``, ``size`` and ``sha256``; ``uploaded`` False when skipped."""

    url: str
    size: int
    sha256: str
    uploaded: bool


@dataclass(frozen=True)
class UploadReport:
    """A whole dataset: the per-file results in upload order."""

    url: str
    files: tuple[UploadResult, ...]

    @property
    def uploaded(self) -> int:
        return sum(f.uploaded for f in self.files)

    @property
    def skipped(self) -> int:
        return len(self.files) - self.uploaded

    @property
    def bytes_uploaded(self) -> int:
        return sum(f.size for f in self.files if f.uploaded)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def upload_file(local_path: str, url: str) -> UploadResult:
    """Put ``local_path`` at ``url`` unless an object of the same size and ``sha256`` is there."""
    import multistorageclient as msc

    size, digest = Path(local_path).stat().st_size, sha256_file(local_path)
    with storage_errors(url, "the object"):
        client, key = msc.resolve_storage_client(url)
        try:
            meta = client.info(key)
            if meta.content_length == size and (meta.metadata or {}).get("sha256") == digest:
                return UploadResult(url, size, digest, uploaded=False)
        except FileNotFoundError:
            pass
        client.upload_file(key, local_path, attributes={"sha256": digest})
    return UploadResult(url, size, digest, uploaded=True)


def dataset_files(local_dir: str | Path) -> list[str]:
    """The relative paths :func:`upload_dataset` copies, in upload order (sorted, commit files last).
    Raises ``ConvertError`` unless ``local_dir`` holds a finished conversion."""
    root = Path(local_dir)
    if not (root / ".nv-meta" / ".info.json").is_file() or not (root / ".nv-meta" / "dataset.yaml").is_file():
        raise ConvertError(f"{root}: not a finished conversion (no .nv-meta/.info.json or dataset.yaml); "
                           f"run `energon-platform convert` to the end first")
    rel = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                 if p.is_file() and not p.name.endswith(".tmp")
                 and p.relative_to(root).parts[0] not in _EXCLUDED_DIRS)
    return [r for r in rel if r not in COMMIT_FILES] + [r for r in COMMIT_FILES if r in rel]


def upload_dataset(local_dir: str | Path, url: str, workers: int = 4) -> UploadReport:
    """Copy the conversion in ``local_dir`` to the prefix ``url`` (``msc://PROFILE/prefix``):
    everything but the commit files with ``workers`` threads, then the commit files in order."""
    root, base = Path(local_dir), url.rstrip("/")
    rel = dataset_files(root)
    body, commit = [r for r in rel if r not in COMMIT_FILES], [r for r in rel if r in COMMIT_FILES]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda r: upload_file(str(root / r), f"{base}/{r}"), body))
    results += [upload_file(str(root / r), f"{base}/{r}") for r in commit]
    return UploadReport(base, tuple(results))


def is_remote(path: str) -> bool:
    """Whether ``path`` names object storage (``msc://PROFILE/prefix``) rather than a local folder."""
    return "://" in str(path)


def staging_dir(url: str) -> Path:
    """The local folder a conversion to ``url`` is written to before upload: stable per URL, so a
    killed conversion resumes there (``ENERGON_PLATFORM_STAGING`` sets the parent folder)."""
    import hashlib
    import os
    import tempfile

    parent = Path(os.environ.get("ENERGON_PLATFORM_STAGING") or Path(tempfile.gettempdir()) / "energon-platform-staging")
    return parent / hashlib.sha256(url.encode()).hexdigest()[:16]


class UploadingWriter:
    """A work unit's writer that also puts its shard on object storage: ``write_unit`` then
    :func:`upload_file`. Picklable, so local processes and Ray tasks upload what they wrote (the
    final :func:`upload_dataset` then finds those objects present and skips them)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def __call__(self, unit, out_dir: str, opts) -> dict:
        from converters.writer import write_unit

        stats = write_unit(unit, out_dir, opts)
        if stats["samples"]:
            upload_file(str(Path(out_dir) / unit.name), f"{self.url}/{unit.name}")
        return stats
