"""Put a conversion on object storage (``msc://PROFILE/prefix``) through MSC.

A conversion to a prefix uploads shard by shard (`ShardUploader`: write, upload, check,
delete; `put_checked` retries with backoff), then the index and report with
`upload_dataset`, which also copies a whole finished local conversion:

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
- `upload_file` is a module-level function of plain arguments, so a Ray task can run it
  (``ray.remote(upload_file).remote(local, url)``); that worker resolves the profile from its own
  ``MSC_CONFIG`` (pass it with ``runtime_env={"env_vars": {"MSC_CONFIG": ...}}``).

Storage failures (credentials, connection after MSC's and botocore's retries) raise
`StorageError` (one line).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from converters.output import ConvertError
from storage import RetriesExhausted, storage_errors, with_retries

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
    """The relative paths `upload_dataset` copies, in upload order (sorted, commit files last).
    Raises ``ConvertError`` unless ``local_dir`` holds a finished conversion."""
    root = Path(local_dir)
    if (
        not (root / ".nv-meta" / ".info.json").is_file()
        or not (root / ".nv-meta" / "dataset.yaml").is_file()
    ):
        raise ConvertError(
            f"{root}: not a finished conversion (no .nv-meta/.info.json or dataset.yaml); "
            f"run `energon-platform convert` to the end first"
        )
    rel = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file()
        and not p.name.endswith(".tmp")
        and p.relative_to(root).parts[0] not in _EXCLUDED_DIRS
    )
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
    import tempfile

    parent = Path(
        os.environ.get("ENERGON_PLATFORM_STAGING")
        or Path(tempfile.gettempdir()) / "energon-platform-staging"
    )
    return parent / hashlib.sha256(url.encode()).hexdigest()[:16]


class UploadError(ConvertError):
    """An object could not be put (and checked) after every try (`storage.retry`); names it.
    ``retries`` counts the retries made before giving up (kept when pickled: a worker raises it)."""

    def __init__(self, message: str, retries: int = 0):
        super().__init__(message)
        self.retries = retries


def put_checked(
    local_path: str, url: str, name: str, attempts: int | None = None, backoff: float | None = None
) -> tuple[UploadResult, int]:
    """`upload_file`, then check the stored object's size and ``sha256`` against the local
    file; a failure of either is retried with backoff (`storage.with_retries`; a refused
    credential is not). Returns the result and the number of retries; raises `UploadError`
    naming ``name`` when every try failed."""
    import multistorageclient as msc

    def put_and_check() -> UploadResult:
        result = upload_file(local_path, url)
        with storage_errors(url, "the uploaded object"):
            client, key = msc.resolve_storage_client(url)
            meta = client.info(key)
        if (
            meta.content_length != result.size
            or (meta.metadata or {}).get("sha256") != result.sha256
        ):
            raise OSError(
                f"stored object has {meta.content_length} bytes and another checksum than "
                f"the {result.size} bytes written"
            )
        return result

    try:
        return with_retries(put_and_check, attempts, backoff)
    except (RetriesExhausted, OSError, RuntimeError, ValueError) as e:
        tries = e.tries if isinstance(e, RetriesExhausted) else 1
        message = " ".join(str(e).split())
        raise UploadError(
            f"cannot upload {name} to {url} after {tries} {'try' if tries == 1 else 'tries'} "
            f"({message}); the shards already uploaded stay on the prefix: run the same command "
            "again to continue",
            tries - 1,
        ) from e


def work_dir(url: str) -> Path:
    """Where this process writes a shard before uploading it: under this machine's staging folder
    for ``url`` (resolved where it runs, so each Ray node uses its own), one folder per process."""
    import socket

    return staging_dir(url) / ".convert" / "work" / f"{socket.gethostname()}-{os.getpid()}"


def record_bytes(stats: dict) -> bytes:
    """A unit's record as stored (``.convert/units/NAME.json``, locally and on the prefix)."""
    return json.dumps(stats, sort_keys=True).encode()


class ShardUploader:
    """A work unit's writer for ``--out msc://...`` with bounded local disk: write the shard into
    `work_dir`, take its index record (`converters.shard_index`), put the shard, its
    ``.tar.idx`` and then its record (stats plus ``index``) on the prefix, each checked
    (`put_checked`), and delete the local copies, so a process holds at most one shard.
    The record goes last: on the prefix, a record whose shard has its recorded size marks the unit
    done for any machine. Picklable (local processes and Ray tasks). Returns the stats with
    ``index`` and ``upload`` (``retries``, ``bytes`` sent, ``seconds``) added; an
    `UploadError` it raises counts in ``retries`` every retry the unit made."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def __call__(self, unit, out_dir: str, opts) -> dict:
        from converters.shard_index import file_record, tar_idx_bytes
        from converters.writer import STATS_DIR, write_unit

        work = work_dir(self.url)
        stats = write_unit(unit, str(work), opts)
        shard, record = work / unit.name, work / STATS_DIR / unit.stats_name
        index = shard.with_name(shard.name + ".idx")
        start, retries, sent = time.monotonic(), 0, 0
        try:
            puts = []
            if stats["samples"]:
                stats["index"] = file_record(shard)
                index.write_bytes(tar_idx_bytes(stats["index"]))
                puts = [(shard, unit.name), (index, unit.name + ".idx")]
            record.write_bytes(record_bytes(stats))
            for path, rel in puts + [(record, f"{STATS_DIR}/{unit.stats_name}")]:
                result, tries = put_checked(str(path), f"{self.url}/{rel}", rel)
                retries, sent = retries + tries, sent + (result.size if result.uploaded else 0)
        except UploadError as e:
            e.retries += retries
            raise
        finally:
            for path in (shard, index, record):
                path.unlink(missing_ok=True)
        return {
            **stats,
            "upload": {"retries": retries, "bytes": sent, "seconds": time.monotonic() - start},
        }
