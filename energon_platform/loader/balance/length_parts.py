"""Building the length index shard by shard: a shard is the unit of work, of resume and of reuse.

A *part* is one shard's facts and keys, ``{parts}/{shard}.{stamp}.npz``, where the stamp is the
shard file's size and modification time (or ETag on object storage): a killed build keeps the
parts it wrote, a dataset that gained shards indexes only the new ones, and a shard rewritten
since is indexed again (its stamp, so its part's name, changed). The parts of one encoder
configuration live in one folder per (dataset root, encoder), whatever the dataset's version.

`index_shard` is the worker: it runs in local processes (forked, dying with the process that
started them) or as Ray tasks (`converters.executor.run_ray`), each opening the dataset and
building the encoder from its config once per process. `assemble` streams the parts, in the
dataset's shard order, into the index files (``facts.i32``, ``keys.bin``, ``keys.off``): its
memory is one part's, whatever the number of samples.

Parts are a cache: `part_damage` checks a part's zip directory and array headers against its
shard (cheap: no array is read), and `assemble` raises `DamagedPart` for a part that does not
read whole, so the builder indexes that shard again instead of reusing it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.executor import check_ray_address, run_ray
from energon_platform.loader.balance.lengths import FORMAT
from energon_platform.loader.light_sample import light_sample
from energon_platform.loader.processes import die_with_parent
from energon_platform.loader.source import SampleSource
from storage import DatasetError
from task_encoders.registry import get_encoder


@dataclass(frozen=True)
class IndexSpec:
    """What a worker needs to open the dataset and build the encoder in its own process."""

    dataset: str
    split: str
    subflavors_json: str  #: the subflavors as sorted JSON
    encoder_digest: str  #: the digest of the encoder's config
    encoder_config: Any  #: the encoder's config (`get_encoder` builds the encoder from it)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.dataset, self.split, self.subflavors_json, self.encoder_digest)


@dataclass(frozen=True)
class ShardJob:
    """One shard of the split: its position, name, first dataset index, samples, and stamp."""

    shard: int
    name: str
    start: int
    count: int
    stamp: str

    @property
    def part(self) -> str:
        """The file name of this shard's part (the shard's name made a file name, its stamp)."""
        return f"{re.sub(r'[^A-Za-z0-9._-]', '_', self.name)}.{self.stamp}.npz"


def shard_stamp(meta: Any) -> str:
    """``{size}-{version}`` of a shard file from its metadata (`SampleSource.shard_files`): the
    modification time in microseconds on a local disk, the ETag (else the modification time) on
    object storage."""
    version = getattr(meta, "etag", None)
    if not version:
        modified = getattr(meta, "last_modified", None)
        version = str(round(modified.timestamp() * 1e6)) if modified is not None else "0"
    return f"{int(meta.content_length)}-{re.sub(r'[^A-Za-z0-9]', '', str(version))[:40]}"


def shard_jobs(source: Any) -> list[ShardJob]:
    """Every shard of ``source``'s split as a `ShardJob`, in dataset-index order; the stamps (which
    parts are still valid) come from the listing the source read to check its shards."""
    jobs, start = [], 0
    for k, (shard, meta) in enumerate(zip(source._factory.shards, source.shard_files())):
        jobs.append(ShardJob(k, shard.name, start, shard.count, shard_stamp(meta)))
        start += shard.count
    return jobs


# --- checking parts -----------------------------------------------------------------------------

#: what reading a damaged part raises (a truncated zip, a bad CRC, a member or header missing)
PART_ERRORS = (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error)


class DamagedPart(ValueError):
    """A part that `assemble` could not read whole: ``job`` is its shard's, ``str()`` the cause."""

    def __init__(self, job: ShardJob, why: str):
        super().__init__(why)
        self.job = job


def part_damage(path: Path, job: ShardJob, width: int) -> str | None:
    """What is wrong with the part ``path`` of ``job`` (a line naming it), or None when its zip
    directory reads and its arrays' headers say ``(count, width)`` int32 facts and a byte string of
    keys. Reads the zip's directory and two array headers, never the arrays."""
    try:
        with zipfile.ZipFile(path) as z:
            headers = {}
            for name in ("facts", "keys"):
                with z.open(f"{name}.npy") as f:
                    version = np.lib.format.read_magic(f)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    headers[name] = read(f)
    except PART_ERRORS as e:
        return f"{path}: unreadable ({type(e).__name__}: {e})"
    (facts_shape, _, facts_type), (keys_shape, _, keys_type) = headers["facts"], headers["keys"]
    if facts_shape != (job.count, width) or facts_type != np.int32:
        return (
            f"{path}: facts of shape {facts_shape} ({facts_type}), not ({job.count}, {width}) int32"
        )
    if len(keys_shape) != 1 or keys_type != np.uint8:
        return f"{path}: keys of shape {keys_shape} ({keys_type}), not bytes"
    return None


# --- the worker -----------------------------------------------------------------------------------

#: this process's opened (source, encoder) per `IndexSpec`: a worker builds them once
_OPENED: dict[tuple, tuple[Any, Any]] = {}


def opened(spec: IndexSpec, source: Any = None, encoder: Any = None) -> tuple[Any, Any]:
    """``(source, encoder)`` of ``spec`` in this process, opened on first use (or the given ones,
    remembered: a parent sets them before it forks, so forked workers build nothing)."""
    if source is not None:
        _OPENED[spec.key] = (source, encoder)
    if spec.key not in _OPENED:
        subflavors = json.loads(spec.subflavors_json)
        _OPENED[spec.key] = (
            SampleSource(spec.dataset, spec.split, subflavors),
            get_encoder(spec.encoder_config),
        )
    return _OPENED[spec.key]


def index_shard(job: ShardJob, parts: str, spec: IndexSpec) -> dict:
    """Compute ``job``'s shard's facts and keys into ``parts/job.part`` (written whole, then
    renamed into place); returns ``{"samples", "unreadable"}``. A sample that cannot be read or
    stated gets facts ``-1`` (the loader replaces it when it fails); a storage or dataset error
    (not the sample's fault) is raised and nothing is written."""
    source, encoder = opened(spec)
    facts = np.zeros((job.count, encoder.facts_width), np.int32)
    keys, unreadable = [], 0
    for k in range(job.count):
        i = job.start + k
        try:
            sample = light_sample(source, i)
            facts[k] = encoder.sample_facts(sample)
            keys.append(sample.__key__)
        except (OSError, DatasetError, NotImplementedError):
            raise
        except Exception as e:  # an unreadable sample, never the build's end
            facts[k] = -1
            keys.append(getattr(e, "sample_key", None) or f"#{i}")
            unreadable += 1
    folder = Path(parts)
    tmp = folder / f".{job.part}.{os.getpid()}.tmp.npz"
    blob = np.frombuffer("\n".join(keys).encode(), np.uint8)  # keys hold no newline
    np.savez(tmp, facts=facts, keys=blob)
    os.replace(tmp, folder / job.part)
    return {"samples": job.count, "unreadable": unreadable}


def run_jobs(
    jobs: Sequence[ShardJob],
    parts: Path,
    spec: IndexSpec,
    on_done: Callable[[ShardJob, dict], None],
    workers: int = 1,
    ray_address: str | None = None,
    use_ray: bool = False,
) -> None:
    """Index ``jobs``: in this process, in ``workers`` forked processes that die with this one,
    or as Ray tasks (a local Ray of ``workers`` CPUs, or the cluster at ``ray_address``, whose
    nodes must see ``parts``); ``on_done(job, stats)`` as each finishes."""
    if use_ray or ray_address:
        check_ray_address(ray_address)
        return run_ray(jobs, str(parts), spec, on_done, workers, ray_address, writer=index_shard)
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            on_done(job, index_shard(job, str(parts), spec))
        return

    context = multiprocessing.get_context("fork")
    with context.Pool(workers, initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        results = pool.imap_unordered(_index_job, [(job, str(parts), spec) for job in jobs])
        for job, stats in results:
            on_done(job, stats)


def _index_job(args: tuple) -> tuple[ShardJob, dict]:
    job, parts, spec = args
    return job, index_shard(job, parts, spec)


# --- assembling -----------------------------------------------------------------------------------

NEWLINE = ord("\n")


def assemble(folder: Path, parts: Path, jobs: Sequence[ShardJob], width: int, meta: dict) -> None:
    """Write the index files of ``jobs``' parts (in their order) into ``folder``, streaming one
    part at a time, then ``meta.json`` (``meta`` plus the format, samples, width and key bytes)
    last: a folder with ``meta.json`` is complete. Ranks that assemble at once write the same
    bytes. A part that does not read whole, or holds other than its shard's count of facts, is
    `DamagedPart` (nothing is replaced in ``folder`` then)."""
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    names = ("facts.i32", "keys.bin", "keys.off")
    tmp = {name: folder / f".{name}.{pid}.tmp" for name in names}
    total, samples = 0, 0
    try:
        with (
            open(tmp["facts.i32"], "wb") as facts_out,
            open(tmp["keys.bin"], "wb") as keys_out,
            open(tmp["keys.off"], "wb") as offsets_out,
        ):
            offsets_out.write(np.zeros(1, np.int64).tobytes())
            for job in jobs:
                path = parts / job.part
                try:
                    with open(path, "rb") as f, np.load(f) as z:
                        facts, blob = z["facts"], z["keys"]
                except PART_ERRORS as e:
                    raise DamagedPart(job, f"{path}: {type(e).__name__}: {e}") from None
                newlines = np.flatnonzero(blob == NEWLINE) if blob.ndim == 1 else None
                if (
                    facts.shape != (job.count, width)
                    or newlines is None
                    or (job.count and len(newlines) != job.count - 1)
                ):
                    raise DamagedPart(job, f"{path}: not the facts and keys of {job.count} samples")
                facts_out.write(np.ascontiguousarray(facts, np.int32).tobytes())
                if (
                    job.count
                ):  # keys joined by newlines: each key's end, less the newlines before it
                    ends = np.append(newlines, len(blob)) - np.arange(job.count)
                    keys_out.write(blob[blob != NEWLINE].tobytes())
                    offsets_out.write((total + ends).astype(np.int64).tobytes())
                    total += int(ends[-1])
                samples += job.count
    except BaseException:
        for path in tmp.values():
            path.unlink(missing_ok=True)
        raise
    for name in names:
        os.replace(tmp[name], folder / name)
    record = {**meta, "format": FORMAT, "samples": samples, "width": width, "key_bytes": total}
    meta_tmp = folder / f".meta.json.{pid}.tmp"
    meta_tmp.write_text(json.dumps(record))
    os.replace(meta_tmp, folder / "meta.json")
