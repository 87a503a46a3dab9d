"""One conversion end to end: read → plan units → run the pending ones → finish.

Resume contract: ``OUT/.convert/state.json`` holds the fingerprint of (source, options, records:
ids, captions, media names and each media file's size and modification time). Running again with
the same arguments skips every unit whose stats file exists and whose shard has its recorded size,
and ends with the same bytes as an uninterrupted run. A finished output is left untouched when all
its shards and index files are there; a missing or resized shard is rewritten (and reported), never
"nothing to do". A different input or option on an existing output is refused
(`ConvertError`) unless ``overwrite``, which removes only what a conversion wrote
(`converters.output`). The whole run holds OUT's lock. For ``--out msc://...`` the same
contract holds with the prefix as OUT (`converters.remote_target`).

A manifest or folder holding nothing is an ``InputError`` (not "0 skipped of 0"). Videos cut to
``--max-seconds`` are counted in ``report.json`` (``cut_to_max_seconds``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from converters import executor, remote, remote_target
from converters.energon_meta import META, META_FILES, prepare
from converters.media import AudioOptions, ImageOptions, VideoOptions
from converters.output import (
    STATE_FILE,
    ConvertError,
    OutputLock,
    check_not_foreign,
    check_target,
    different,
    removal_plan,
    remove,
    stale_tmp_files,
    state_diff,
)
from converters.readers import (
    InputError,
    audio_manifest,
    coco,
    folder,
    librispeech,
    llava,
    manifest,
    shapes3d,
    text,
    video,
)
from converters.records import ReadResult, drop_duplicates
from converters.units import WorkUnit, plan_units
from converters.writer import STATS_DIR, WriteOptions, atomic_write_bytes, load_stats
from storage.outputs import READERS_FILE

__all__ = [
    "ConvertError",
    "ConvertOptions",
    "Outcome",
    "run_conversion",
    "summarize",
    "reason_counts",
]

READERS: dict[str, Callable[..., ReadResult]] = {
    "coco": coco.read,
    "folder": folder.read,
    "manifest": manifest.read,
    "librispeech": librispeech.read,
    "audio-manifest": audio_manifest.read,
    "video": video.read,
    "text": text.read,
    "llava": llava.read,
    "3d": shapes3d.read,
}
#: Reader arguments that are input paths (resolved in the state; never inside OUT).
INPUT_ARGS = ("annotations", "images", "root", "manifest", "json_file")
#: Files a finished output has besides its shards (the shards' ``.tar.idx`` are checked too).
FINISHED_FILES = ("report.json", "skipped.jsonl")
N_EXAMPLES = 5


@dataclass
class ConvertOptions:
    out: str
    samples_per_shard: int = 512
    val_fraction: float = 0.0
    image: ImageOptions = field(default_factory=ImageOptions)
    audio: AudioOptions = field(default_factory=AudioOptions)
    video: VideoOptions = field(default_factory=VideoOptions)
    workers: int = 1
    executor: str = "local"  #: "local" or "ray"
    ray_address: str | None = None
    max_error_fraction: float = 0.1
    overwrite: bool = False
    progress: bool = True

    def output_affecting(self, modality: str) -> dict:
        """Options that change the output bytes of a ``modality`` conversion (workers and executor
        do not; a text conversion writes no media, so the media options are not among them)."""
        media = (
            {} if modality == "text" else {"image": asdict(self.image), "audio": asdict(self.audio)}
        )
        return {
            "samples_per_shard": self.samples_per_shard,
            "val_fraction": self.val_fraction,
            **media,
            # only when set: the fingerprints of image/audio conversions stay what they were
            **({"video": asdict(self.video)} if self.video != VideoOptions() else {}),
        }


@dataclass
class Outcome:
    report: dict
    already_done: bool
    ok: bool  #: False when the skipped fraction exceeds ``max_error_fraction``
    #: shards of a finished output found missing/changed
    repaired: list[str] = field(default_factory=list)
    uploaded_to: str | None = None  #: the object-storage prefix the conversion was copied to


def _write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(
        path, lambda f: f.write((json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())
    )


def _media_stat(path: str | None) -> list[int]:
    """Size and modification time: a changed file is a different input (content is not hashed)."""
    try:
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    except (OSError, TypeError):
        return [-1, -1]


def _records_digest(result: ReadResult) -> str:
    h = hashlib.sha256()
    for r in result.records:
        h.update(
            json.dumps(
                [
                    r.key,
                    r.source_id,
                    r.media.name,
                    r.media.parquet_cell,
                    _media_stat(r.media.path),
                    r.texts,
                ]
            ).encode()
        )
    for p in result.problems:
        h.update(json.dumps(p.to_json()).encode())
    return h.hexdigest()


def _read(kind: str, reader_args: dict) -> ReadResult:
    try:
        result = READERS[kind](**reader_args)
    except OSError as e:  # e.g. an unreadable folder met while listing the input
        raise InputError(
            f"cannot read the input{f' {e.filename}' if e.filename else ''}: {e.strerror or e}"
        ) from e
    if not result.records and not result.problems:
        inputs = [str(v) for k, v in reader_args.items() if k in INPUT_ARGS and v]
        converted = [i for i in inputs if (Path(i) / ".nv-meta").is_dir()]
        if converted:
            raise InputError(
                f"{converted[0]}: a converted dataset already (it holds .nv-meta/); convert reads "
                f"raw corpora: train on it, or look at it with energon-platform preview or info"
            )
        raise InputError(
            f"{' and '.join(inputs) or 'the input'}: empty: no record to convert "
            f"(no line, row or file found)"
        )
    result.records, dup_problems = drop_duplicates(result.records)
    result.problems += dup_problems
    return result


def _load_state(path: Path) -> dict:
    """A state file's content; ``{}`` when unreadable (then it matches no conversion)."""
    try:
        old = json.loads(path.read_text())
    except ValueError:
        return {}
    return old if isinstance(old, dict) else {}


def _open_state(out: Path, state: dict, overwrite: bool, lock: OutputLock) -> bool:
    """Under the lock: make ``out`` hold this conversion's state; True when it holds it finished."""
    if overwrite:
        plan = removal_plan(out)  # decides everything first; removes nothing unless all is ours
        lock.announce()
        remove(plan)
    state_path = out / STATE_FILE
    if state_path.is_file():
        old = _load_state(state_path)
        diff = state_diff(old, state)
        if diff:
            raise ConvertError(
                f"{out} holds {different(diff)}; use another --out or pass --overwrite to "
                f"replace it"
            )
        return bool(old.get("finished"))
    lock.announce()
    _write_json(state_path, state)
    (out / READERS_FILE).touch()  # the loaders reading this dataset lock it (storage.outputs)
    return False


def _finish_files_present(out: Path, stats: dict[str, dict]) -> bool:
    shards = [s["shard"] for s in stats.values() if s["samples"]]
    needed = [out / n for n in FINISHED_FILES] + [out / (s + ".idx") for s in shards]
    needed += [out / META / n for n in META_FILES] if shards else []
    return all(p.is_file() for p in needed)


def _progress(
    opts: ConvertOptions, total_samples: int, n_units: int, done_units: int, done_samples: int
):
    from tqdm import tqdm

    bar = tqdm(
        total=total_samples,
        initial=done_samples,
        unit="sample",
        disable=not opts.progress,
        desc="convert",
        dynamic_ncols=True,
    )
    bar.set_postfix_str(f"shards {done_units}/{n_units}")
    return bar


def build_report(
    result_modality: str,
    state: dict,
    units: list[WorkUnit],
    stats: dict[str, dict],
    read_problems: list[dict],
    opts: ConvertOptions,
) -> dict:
    """Merge per-shard stats and reader problems. Deterministic: no timestamps, no worker counts."""
    problems = read_problems + [p for u in units for p in stats[u.name]["problems"]]
    by_reason = defaultdict(list)
    for p in problems:
        by_reason[p["reason"]].append(p["id"])
    written = sum(s["samples"] for s in stats.values())
    seen = written + len(problems)
    fraction = len(problems) / seen if seen else 1.0
    splits = {}
    for u in units:
        s = splits.setdefault(u.split, {"shards": 0, "samples": 0})
        s["shards"] += stats[u.name]["samples"] > 0
        s["samples"] += stats[u.name]["samples"]
    ok = fraction <= opts.max_error_fraction and written > 0
    cut = [i for u in units for i in stats[u.name].get("cut", [])]
    cuts = (
        {
            "cut_to_max_seconds": {
                "count": len(cut),
                "max_seconds": opts.video.max_seconds,
                "examples": cut[:N_EXAMPLES],
            }
        }
        if opts.video.max_seconds
        else {}
    )
    return {
        **cuts,
        "modality": result_modality,
        "source": state["source"],
        "options": state["options"],
        "totals": {
            "seen": seen,
            "written": written,
            "skipped": len(problems),
            "skipped_fraction": round(fraction, 6),
        },
        "splits": splits,
        "skipped_by_reason": {
            r: {"count": len(ids), "examples": ids[:N_EXAMPLES]}
            for r, ids in sorted(by_reason.items())
        },
        "shards": [
            {k: stats[u.name][k] for k in ("shard", "samples", "bytes", "sha256")}
            for u in units
            if stats[u.name]["samples"]
        ],
        "status": "ok"
        if ok
        else (
            "no sample could be converted"
            if not written
            else f"skipped fraction {fraction:.3f} exceeds --max-error-fraction {opts.max_error_fraction}"
        ),
    }


def run_conversion(kind: str, reader_args: dict, opts: ConvertOptions) -> Outcome:
    """Convert one corpus. Raises ``InputError``/``ConvertError`` before writing anything when the
    input or output is unusable (and ``ConvertError`` when writing fails); bad records never raise.

    ``opts.out`` may be ``msc://PROFILE/prefix``: every work unit writes its shard into a local
    staging folder, uploads and checks it with its index record, and deletes it (local disk stays
    bounded by a shard per worker); the index is built from the records and goes up last, so a
    half-uploaded prefix never looks like a dataset. The prefix itself, not the staging folder,
    says whether it holds another conversion, which units are done, or that it is finished
    (`converters.remote_target`); a killed conversion resumes from any machine."""
    if remote.is_remote(opts.out):
        return _convert_to_object_storage(kind, reader_args, opts)
    out = Path(opts.out)
    check_target(out, [Path(v) for k, v in reader_args.items() if k in INPUT_ARGS and v])
    if opts.executor == "ray":
        executor.check_ray_address(opts.ray_address)
    result, state = _read_with_state(kind, reader_args, opts)
    return _convert_local(out, kind, result, state, opts)


def _read_with_state(kind: str, reader_args: dict, opts: ConvertOptions) -> tuple[ReadResult, dict]:
    """The input's records and the conversion's fingerprint (module doc)."""
    result = _read(kind, reader_args)
    state = {
        "source": {
            "kind": kind,
            **{
                k: (str(Path(v).resolve()) if k in INPUT_ARGS and v else v)
                for k, v in reader_args.items()
            },
        },
        "options": opts.output_affecting(result.modality),
        "records": _records_digest(result),
        "modality": result.modality,
    }
    return result, state


def _convert_local(
    out: Path, kind: str, result: ReadResult, state: dict, opts: ConvertOptions
) -> Outcome:
    check_not_foreign(out)
    try:
        with OutputLock(out) as lock:
            return _convert(out, kind, result, state, opts, lock)
    except OSError as e:
        raise ConvertError(
            f"cannot write to --out {out}: {e.strerror or e}"
            + (f" ({e.filename})" if e.filename else "")
        ) from e


def _convert_to_object_storage(kind: str, reader_args: dict, opts: ConvertOptions) -> Outcome:
    """Bounded staging (module `converters.remote`): the prefix decides (refused, done, or
    claimed) before anything is written; the units it does not hold done
    (`remote_target.done_units`) are written, uploaded and deleted one by one by
    `remote.ShardUploader` (local processes or Ray tasks, each on its own machine's staging
    folder); the driver keeps only the records, builds Energon's index from them, uploads it with
    the report and marks the prefix finished. The staging folder is a cache, removed at the end."""
    url = opts.out.rstrip("/")
    prefix = remote_target.open_prefix(url)
    local = remote.staging_dir(url)
    check_target(local, [Path(v) for k, v in reader_args.items() if k in INPUT_ARGS and v])
    if opts.executor == "ray":
        executor.check_ray_address(opts.ray_address)
    result, state = _read_with_state(kind, reader_args, opts)
    claimed = remote_target.claim(prefix, state, opts.overwrite)
    if claimed.done is not None:
        done = claimed.done
        return Outcome(done, already_done=True, ok=done.get("status") == "ok", uploaded_to=url)
    try:
        with OutputLock(local) as lock:
            lock.announce()
            cached = _load_state(local / STATE_FILE) if (local / STATE_FILE).is_file() else {}
            remove(
                # another conversion's cache
                [p for p in sorted(local.iterdir()) if p.name != ".convert"]
                + [p for p in sorted((local / ".convert").iterdir()) if p.name != "lock"]
                if state_diff(cached, state)
                else [p for p in (local / ".convert" / "work", local / META)]
            )
            _write_json(local / STATE_FILE, state)
            report = _convert_units_to_prefix(
                local, url, prefix, kind, result, state, opts, claimed.retries
            )
    except OSError as e:
        raise ConvertError(
            f"cannot write to the staging folder {local}: {e.strerror or e}"
            + (f" ({e.filename})" if e.filename else "")
        ) from e
    try:
        remote.upload_dataset(local, url)
    except (OSError, RuntimeError, ValueError) as e:
        raise ConvertError(
            f"cannot upload the index and report to {url}: {type(e).__name__}: {e} "
            f"(run the same command again to resume)"
        ) from e
    remote_target.finish(prefix, state, report["uploads"]["retries"])
    shutil.rmtree(local, ignore_errors=True)
    return Outcome(report, already_done=False, ok=report["status"] == "ok", uploaded_to=url)


def _convert_units_to_prefix(
    local: Path,
    url: str,
    prefix,
    kind: str,
    result: ReadResult,
    state: dict,
    opts: ConvertOptions,
    earlier_retries: int,
) -> dict:
    """Run the units the prefix lacks; write the index, skipped list and report into ``local``.
    Upload retries count over every run of the conversion: ``earlier_retries`` (recorded on the
    prefix by killed or failed runs) plus this run's, recorded again whenever a shard needed one."""
    units = plan_units(result.records, opts.samples_per_shard, opts.val_fraction)
    records_dir = local / STATS_DIR
    stats = remote_target.done_units(prefix, units, records_dir)
    pending = [u for u in units if u.name not in stats]
    write_opts = WriteOptions(result.modality, kind, opts.image, opts.audio, opts.video)
    bar = _progress(
        opts,
        len(result.records),
        len(units),
        len(stats),
        sum(len(u.records) for u in units if u.name in stats),
    )
    up = {"retries": earlier_retries, "bytes": 0, "shards": 0, "start": time.monotonic()}

    def on_done(unit: WorkUnit, unit_stats: dict) -> None:
        sent = unit_stats.pop("upload")
        records_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(
            records_dir / unit.stats_name, lambda f: f.write(remote.record_bytes(unit_stats))
        )
        unit_stats.pop("index", None)
        stats[unit.name] = unit_stats
        up["retries"] += sent["retries"]
        if sent["retries"]:  # kept on the prefix at once: a later kill must not lose the count
            remote_target.record_retries(prefix, state, up["retries"])
        up["bytes"] += sent["bytes"]
        up["shards"] += 1
        rate = up["bytes"] / max(time.monotonic() - up["start"], 1e-6) / 1e6
        bar.update(len(unit.records))
        bar.set_postfix_str(
            f"shards {len(stats)}/{len(units)} written+uploaded, {rate:.1f} MB/s up, "
            f"{up['retries']} upload retries"
        )

    writer = remote.ShardUploader(url)
    try:
        if opts.executor == "ray":
            executor.run_ray(
                pending, str(local), write_opts, on_done, opts.workers, opts.ray_address, writer
            )
        else:
            executor.run_local(pending, str(local), write_opts, on_done, opts.workers, writer)
    except remote.UploadError as e:  # its retries count too: the run that completes reports them
        remote_target.record_retries_of_failed_run(
            prefix, state, up["retries"] + getattr(e, "retries", 0)
        )
        raise
    finally:
        bar.close()

    record_files = {u.name: records_dir / u.stats_name for u in units}

    def record(shard: str) -> dict:
        return json.loads(record_files[shard].read_text())["index"]

    return _finish(
        local,
        result,
        state,
        units,
        stats,
        opts,
        records=record,
        extra={"uploads": {"retries": up["retries"]}},
    )


def _convert(
    out: Path, kind: str, result: ReadResult, state: dict, opts: ConvertOptions, lock: OutputLock
) -> Outcome:
    finished = _open_state(out, state, opts.overwrite, lock)
    units = plan_units(result.records, opts.samples_per_shard, opts.val_fraction)
    stats = {u.name: s for u in units if (s := load_stats(opts.out, u)) is not None}
    pending = [u for u in units if u.name not in stats]
    if finished and not pending and _finish_files_present(out, stats):
        report = json.loads((out / "report.json").read_text())
        return Outcome(report, already_done=True, ok=report["status"] == "ok")
    lock.announce()
    remove(stale_tmp_files(out))
    repaired = [u.name for u in pending] if finished else []
    if finished:  # a kill while repairing must not leave it marked finished
        _write_json(out / STATE_FILE, state)

    write_opts = WriteOptions(result.modality, kind, opts.image, opts.audio, opts.video)
    bar = _progress(
        opts,
        len(result.records),
        len(units),
        len(stats),
        sum(len(u.records) for u in units if u.name in stats),
    )

    def on_done(unit: WorkUnit, unit_stats: dict) -> None:
        stats[unit.name] = unit_stats
        bar.update(len(unit.records))
        bar.set_postfix_str(f"shards {len(stats)}/{len(units)}")

    try:
        if opts.executor == "ray":
            executor.run_ray(pending, opts.out, write_opts, on_done, opts.workers, opts.ray_address)
        else:
            executor.run_local(pending, opts.out, write_opts, on_done, opts.workers)
    finally:
        bar.close()

    report = _finish(out, result, state, units, stats, opts)
    return Outcome(report, already_done=False, ok=report["status"] == "ok", repaired=repaired)


def _finish(
    out: Path,
    result: ReadResult,
    state: dict,
    units: list[WorkUnit],
    stats: dict[str, dict],
    opts: ConvertOptions,
    records=None,
    extra: dict | None = None,
) -> dict:
    """Energon's index (from the shards in ``out``, or from their ``records``), ``skipped.jsonl``,
    ``report.json`` (with ``extra`` keys) and the state marked finished; returns the report."""
    read_problems = [p.to_json() for p in result.problems]
    report = {
        **build_report(result.modality, state, units, stats, read_problems, opts),
        **(extra or {}),
    }
    shards = [s["shard"] for s in report["shards"]]
    if shards:
        media_parts = sorted(
            {e for u in units for e in stats[u.name]["extensions"] if e != "text.json"}
        )
        # the dataset's identity is its content: options and every shard's checksum
        identity = hashlib.sha256(
            json.dumps(
                [state["options"], [[s["shard"], s["sha256"]] for s in report["shards"]]],
                sort_keys=True,
            ).encode()
        ).hexdigest()
        prepare(str(out), shards, result.modality, media_parts, identity, records)
    skipped = read_problems + [p for u in units for p in stats[u.name]["problems"]]
    atomic_write_bytes(
        out / "skipped.jsonl",
        lambda f: f.write("".join(json.dumps(p, sort_keys=True) + "\n" for p in skipped).encode()),
    )
    _write_json(out / "report.json", report)
    _write_json(out / STATE_FILE, {**state, "finished": True})
    return report


def summarize(report: dict) -> str:
    """A few terminal lines: totals, splits, skipped by reason with examples, status."""
    t = report["totals"]
    lines = [
        f"{t['written']} samples written, {t['skipped']} skipped of {t['seen']} "
        f"({100 * t['skipped_fraction']:.1f}%)"
    ]
    for split, s in sorted(report["splits"].items()):
        lines.append(f"  {split}: {s['samples']} samples in {s['shards']} shards")
    for reason, r in report["skipped_by_reason"].items():
        lines.append(
            f"  skipped {reason}: {r['count']} (e.g. {', '.join(map(str, r['examples'][:3]))})"
        )
    if report.get("cut_to_max_seconds", {}).get("count"):
        c = report["cut_to_max_seconds"]
        lines.append(
            f"  cut to --max-seconds {c['max_seconds']:g}: {c['count']} "
            f"(e.g. {', '.join(map(str, c['examples'][:3]))}; original durations in their text.json)"
        )
    lines.append(f"status: {report['status']}")
    return "\n".join(lines)


def reason_counts(report: dict) -> Counter:
    return Counter({r: v["count"] for r, v in report["skipped_by_reason"].items()})
