"""Where a length index lives, and when it is built.

**Stored with the data.** A local dataset's index is written beside its shards, in
``DATASET/.energon-platform/lengths/``: every node and every later run opens it instead of
building, and a loader that finds it writes nothing into its own cache. A dataset whose folder
this user cannot write keeps its index in the cache folder the run names (``loader.length_cache``:
a shared folder every node sees) or else the local cache (``$ENERGON_PLATFORM_CACHE/lengths``).
A dataset on object storage (``msc://``) has its index built in such a cache folder and published
beside its shards (``msc://.../DATASET/.energon-platform/lengths/{digest}/``, ``meta.json``
last); a node that finds it there makes a ranged copy of it in its cache (one process per node,
under a lock; `ranged_copy`): a block of a file is fetched the first time a process of the node
reads from it, so opening costs ``meta.json`` and three sizes, not the index. Inside a place:

* ``{digest}/``: one complete index (`LengthIndex`'s files and ``meta.json``, which also lists
  each shard's stamp); ``digest`` covers the dataset's identity (Energon's index uuid, the split,
  its shards and counts), the encoder's class, config digest and facts width: an index of another
  encoder configuration is never read;
* ``parts-{encoder}/``: the per-shard parts (`length_parts`) the indexes of that encoder
  configuration are assembled from, kept for reuse (a dataset that gains shards indexes only the
  new ones).

An index whose shard stamps no longer match the files (a shard rewritten since) is stale: it is
built again, reusing the parts of every unchanged shard. An index or a part is a cache, so one
found damaged (a ``meta.json`` that does not read, a file of another size than its meta says: see
`lengths.check_index`; a part whose zip or array headers do not read: `length_parts.part_damage`)
is never used nor counted as reused: it is built again, as a missing one is, and ``require``
refuses it naming the file.

**When.** ``energon-platform index --config CFG`` builds every dataset's index ahead of training.
A loader that finds none builds it at start-up after one line naming that command and the time it
will take (``loader.length_index: build``, the default), or stops with that line
(``loader.length_index: require``). The time is measured (`estimate`), not guessed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import multistorageclient as msc
from tqdm import tqdm

from converters.remote import upload_file
from energon_platform.loader.balance.length_parts import (
    DamagedPart,
    IndexSpec,
    ShardJob,
    assemble,
    opened,
    part_damage,
    run_jobs,
    shard_jobs,
)
from energon_platform.loader.balance.lengths import (
    FORMAT,
    LengthIndex,
    LengthIndexDamaged,
    check_index,
    default_cache_dir,
    meta_sizes,
    parse_meta,
)
from energon_platform.loader.balance.ranged_copy import SOURCE_FILE, write_source
from energon_platform.loader.light_sample import light_sample
from storage import storage_errors
from storage.paths import DERIVED_FOLDER, dataset_root, is_remote
from task_encoders.abilities import StatesFacts

#: the folder beside a local dataset's shards that holds its indexes
WITH_DATA = Path(DERIVED_FOLDER) / "lengths"
#: spots over the dataset where `estimate` times consecutive samples, and samples timed at each
PROBE_SPOTS, PROBE_RUN = 16, 8
#: seconds `estimate` spends timing at most (once two spots are timed)
PROBE_SECONDS = 0.5
#: why an index found is not used: its shards changed since it was built
STALE = "stale: shards changed since it was built"
#: an index's files; ``meta.json`` last, written or copied once the others are whole
INDEX_FILES = ("facts.i32", "keys.bin", "keys.off", "meta.json")


class IndexedEncoder(StatesFacts, Protocol):
    """An encoder whose length index `build` makes: its facts, and the config each worker process
    builds the same encoder from (`length_parts.IndexSpec`)."""

    @property
    def config(self) -> object: ...


class LengthIndexMissing(RuntimeError):
    """No usable index of a dataset under ``loader.length_index: require`` (none, stale, or
    damaged: naming the file): one line, naming the command that builds it and how long it will
    take."""


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


def encoder_key(encoder: StatesFacts, encoder_digest: str) -> dict:
    """What an index's facts depend on, on the encoder's side."""
    return {
        "format": FORMAT,
        "encoder": type(encoder).__name__,
        "config": encoder_digest,
        "width": int(encoder.facts_width),
    }


def index_digest(source: Any, encoder: StatesFacts, encoder_digest: str) -> str:
    """The name of ``source``'s index under ``encoder`` in any place (module doc)."""
    return _digest({**encoder_key(encoder, encoder_digest), "dataset": source.identity()})


def places(source: Any, cache_dir: str | Path | None) -> list[Path]:
    """Where an index of ``source`` is looked for, in order: with the data (a local dataset),
    the run's cache folder when it names one, the local cache."""
    found = []
    if not is_remote(source.path):
        found.append(Path(str(dataset_root(source.path))) / WITH_DATA)
    if cache_dir:
        found.append(Path(cache_dir))
    found.append(default_cache_dir())
    return list(dict.fromkeys(found))


def writable_place(source: Any, cache_dir: str | Path | None) -> Path:
    """The first place of `places` this process can write to (creating it if missing)."""
    for place in places(source, cache_dir):
        try:
            place.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(place, os.W_OK):
            return place
    raise PermissionError(f"no writable place for the length index of {source.path}")


@dataclass
class Located:
    """A complete index found in ``folder``: ``why`` it cannot be used (`why_not_fresh`), None when
    it can."""

    folder: Path
    why: str | None = None

    @property
    def fresh(self) -> bool:
        """Whether it can be used as it is (whole, and its shard stamps match the files)."""
        return self.why is None


def locate(source: Any, encoder: StatesFacts, encoder_digest: str, cache_dir=None, jobs=None):
    """The first fresh whole index of ``source`` under ``encoder`` among `places`, else the first
    one found, with why it cannot be used (``jobs``: the shards' stamps, `shard_jobs` when not
    given); None when there is none."""
    digest = index_digest(source, encoder, encoder_digest)
    found = [place / digest for place in places(source, cache_dir)]
    found = [folder for folder in found if (folder / "meta.json").is_file()]
    if not found:
        return None
    jobs = shard_jobs(source) if jobs is None else jobs
    located = [Located(folder, why_not_fresh(folder, jobs)) for folder in found]
    return next((one for one in located if one.fresh), located[0])


def why_not_fresh(folder: Path, jobs: list[ShardJob]) -> str | None:
    """None when ``folder`` holds a whole index (`check_index`) whose shard stamps are ``jobs``';
    else why not: ``"none found"``, ``"damaged: FILE: ..."`` or `STALE`."""
    if not (folder / "meta.json").is_file():
        return "none found"
    try:
        meta = check_index(folder)
    except LengthIndexDamaged as e:
        return f"damaged: {e}"
    return None if meta.get("stamps") == [j.stamp for j in jobs] else STALE


def open_index(
    source: Any,
    encoder: IndexedEncoder,
    encoder_digest: str,
    cache_dir: str | Path | None = None,
    workers: int = 1,
    progress: bool = True,
    require: bool = False,
    command: str = "energon-platform index --config CONFIG",
) -> LengthIndex:
    """The fresh whole length index of ``source`` under ``encoder``: found in a place (module
    doc), or built now into the first writable one after one line on stderr saying why (none,
    stale, or damaged, naming the file) and naming ``command`` and the estimated time; with
    ``require``, `LengthIndexMissing` with that line instead of building. Ranks of one job that
    find none at once: one builds, the others wait for it (a record lock that forked workers do
    not inherit)."""
    jobs = shard_jobs(source)
    found = locate(source, encoder, encoder_digest, cache_dir, jobs)
    if found is not None and found.fresh:
        return LengthIndex(found.folder)
    why = (found.why if found is not None else None) or "none found"  # a found one is stale
    try:
        fetched = fetch_published(
            source, index_digest(source, encoder, encoder_digest), jobs, cache_dir
        )
    except LengthIndexDamaged as e:  # the published one: built here, and published again
        fetched, why = None, f"damaged: {e}"
    if fetched is not None:
        return LengthIndex(fetched)
    again = "re" if why.startswith("damaged") else ""
    line = (
        f"length index of {source.path} ({len(source):,} samples): {why}; "
        f"`{command}` {again}builds it ahead of training, about "
        f"{estimate(source, encoder, workers)}"
    )
    if require:
        raise LengthIndexMissing(line)
    print(f"{line} ({again}building it now)", file=sys.stderr, flush=True)
    place = writable_place(source, cache_dir)
    built = build(source, encoder, encoder_digest, place, workers, progress, jobs)
    publish(source, Path(built["folder"]))
    return LengthIndex(Path(built["folder"]))


# --- object storage: published beside the shards, read by ranges on each node ------------------


def published_place(source: Any) -> str | None:
    """The ``msc://`` prefix beside a dataset on object storage where its indexes are published;
    None for a local dataset (its index is stored with it already)."""
    if not is_remote(source.path):
        return None
    return f"{str(source.path).rstrip('/')}/{WITH_DATA.as_posix()}"


def publish(source: Any, folder: Path) -> str | None:
    """Upload the complete index ``folder`` beside ``source``'s shards on object storage
    (``meta.json`` last; files already there with the same bytes are skipped); its URL, or None
    for a local dataset."""
    url = published_place(source)
    if url is None:
        return None

    for name in INDEX_FILES:
        upload_file(str(folder / name), f"{url}/{folder.name}/{name}")
    return f"{url}/{folder.name}"


def fetch_published(source: Any, digest: str, jobs: list[ShardJob], cache_dir=None) -> Path | None:
    """The node's copy of ``source``'s published index ``digest`` when it is there and fresh: a
    folder in the first writable cache place whose files are ranged copies (`ranged_copy`: filled
    by ranged reads where they are read, nothing fetched up front but ``meta.json`` and the
    files' sizes), made once per node (the first process under a lock, the others find it);
    None when nothing fresh is published; `LengthIndexDamaged` naming the file when what is
    published does not read or its files' sizes are not those its meta says."""
    url = published_place(source)
    if url is None:
        return None

    with storage_errors(url, "the published length index"):
        client, key = msc.resolve_storage_client(f"{url}/{digest}/meta.json")
        try:
            raw = client.read(key)
        except FileNotFoundError:
            return None
        meta = parse_meta(raw, f"{url}/{digest}/meta.json")
        if meta.get("stamps") != [j.stamp for j in jobs]:
            return None
        place = writable_place(source, cache_dir)
        folder = place / digest
        with open(place / f"{digest}.lock", "w") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)
            if why_not_fresh(folder, jobs) is not None:
                base = key[: -len("meta.json")]
                sizes = {n: client.info(base + n).content_length for n in INDEX_FILES[:-1]}
                for name, size in meta_sizes(meta).items():
                    if size is not None and sizes[name] != size:
                        raise LengthIndexDamaged(
                            f"{url}/{digest}/{name}: {sizes[name]:,} bytes, its meta.json "
                            f"says {size:,}"
                        )
                if folder.is_dir():  # a copy of an earlier publication: none of its blocks is kept
                    shutil.rmtree(folder)
                folder.mkdir(parents=True)
                write_source(folder, f"{url}/{digest}", sizes)
                tmp = folder / f".meta.json.{os.getpid()}.tmp"
                tmp.write_bytes(raw)
                os.replace(tmp, folder / "meta.json")  # last: the copy is complete
    return folder


def estimate(source: Any, encoder: StatesFacts, workers: int = 1) -> str:
    """How long building ``source``'s index takes on ``workers`` processes, as words (``"3 min on
    8 processes"``), from a measured rate: the first sample is read untimed (what a process pays
    once: a tokenizer's loading, the first shard's opening), then `PROBE_RUN` consecutive samples
    (as a build reads them) at each of `PROBE_SPOTS` spots spread over the dataset, for
    `PROBE_SECONDS` at most; the rate is scaled by the processes that can run at once (no more than
    this machine's cores)."""
    n = len(source)
    if n == 0:
        return "no time (no samples)"

    def facts(i: int) -> None:
        try:
            encoder.sample_facts(light_sample(source, i))
        except Exception:
            pass

    facts(0)
    # the spots in an order that spreads the first ones timed over the dataset (bit-reversed)
    bits = (PROBE_SPOTS - 1).bit_length()
    order = sorted(range(PROBE_SPOTS), key=lambda k: int(f"{k:0{bits}b}"[::-1], 2))
    timed, began = 0, time.perf_counter()
    for k, spot in enumerate(order):
        start = 1 + spot * max(0, n - 1 - PROBE_RUN) // max(1, PROBE_SPOTS - 1)
        for i in range(start, min(n, start + PROBE_RUN)):
            facts(i)
            timed += 1
        if k >= 1 and time.perf_counter() - began >= PROBE_SECONDS:
            break
    if not timed:  # a dataset of one sample
        return "no time (1 sample)"
    shards = len(getattr(getattr(source, "_factory", None), "shards", None) or [0])
    parallel = max(1, min(workers, len(os.sched_getaffinity(0)), shards))
    seconds = (time.perf_counter() - began) / timed * n / parallel
    if seconds < 90:
        when = f"{max(1, round(seconds))} s"
    elif seconds < 5400:
        when = f"{seconds / 60:.0f} min"
    else:
        when = f"{seconds / 3600:.1f} h"
    return f"{when} on {workers} process{'es' if workers > 1 else ''}"


def build(
    source: Any,
    encoder: IndexedEncoder,
    encoder_digest: str,
    place: Path,
    workers: int = 1,
    progress: bool = True,
    jobs: list[ShardJob] | None = None,
    ray_address: str | None = None,
    use_ray: bool = False,
) -> dict:
    """Build ``source``'s index under ``encoder`` into ``place``, reusing the whole parts there;
    returns ``{"folder", "samples", "shards", "indexed", "reused", "damaged", "unreadable",
    "seconds"}`` (``indexed``: shards computed now; ``damaged``: a line per damaged file found and
    replaced, the index's or a part's, none of them counted as reused). Held under
    ``place/{digest}.lock``; a whole fresh index found there once the lock is had, with whole
    parts, is kept as it is. A ranged copy of a published index found there is replaced."""
    jobs = shard_jobs(source) if jobs is None else jobs
    digest = index_digest(source, encoder, encoder_digest)
    folder = place / digest
    parts = place / f"parts-{_digest(encoder_key(encoder, encoder_digest))}"
    parts.mkdir(parents=True, exist_ok=True)
    width = int(encoder.facts_width)
    began = time.perf_counter()
    stats = {"folder": str(folder), "samples": len(source), "shards": len(jobs), "unreadable": 0}
    with open(place / f"{digest}.lock", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        why = why_not_fresh(folder, jobs)
        damaged = {}  # job -> what is wrong with its part
        for job in jobs:
            if (parts / job.part).is_file():
                damage = part_damage(parts / job.part, job, width)
                if damage is not None:
                    damaged[job] = damage
        if why is None and not damaged:  # built by another rank or node while this one waited
            return {**stats, "indexed": 0, "reused": len(jobs), "damaged": [], "seconds": 0.0}
        notes = [why.removeprefix("damaged: ")] if why and why.startswith("damaged: ") else []
        notes += damaged.values()
        if (folder / SOURCE_FILE).is_file():  # a ranged copy: this one is built whole here
            shutil.rmtree(folder)
        todo = [j for j in jobs if j in damaged or not (parts / j.part).is_file()]
        spec = IndexSpec(
            str(source.path),
            source.split,
            json.dumps(source.subflavors, sort_keys=True),
            encoder_digest,
            encoder.config,
        )

        opened(spec, source, encoder)  # forked workers inherit them: nothing is built again
        bar = tqdm(
            total=len(source),
            initial=len(source) - sum(j.count for j in todo),
            unit="sample",
            desc=f"length index {Path(str(source.path)).name}",
            disable=not progress or not todo or bool(os.environ.get("TQDM_DISABLE")),
        )

        def counted(job: ShardJob, result: dict) -> None:
            stats["unreadable"] += result["unreadable"]

        def done(job: ShardJob, result: dict) -> None:
            counted(job, result)
            bar.update(result["samples"])

        try:
            run_jobs(todo, parts, spec, done, workers, ray_address, use_ray)
        finally:
            bar.close()
        meta = {"stamps": [j.stamp for j in jobs], "shards": [j.name for j in jobs]}
        while True:
            try:
                assemble(folder, parts, jobs, width, meta)
                break
            except DamagedPart as e:  # its headers read, its data does not: indexed again
                if e.job in todo:  # written just now: not a damaged cache
                    raise
                notes.append(str(e))
                todo.append(e.job)
                run_jobs([e.job], parts, spec, counted, 1)
    return {
        **stats,
        "indexed": len(todo),
        "reused": len(jobs) - len(todo),
        "damaged": notes,
        "seconds": time.perf_counter() - began,
    }
