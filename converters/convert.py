"""One conversion end to end: read → plan units → run the pending ones → finish.

Resume contract: ``OUT/.convert/state.json`` holds the fingerprint of (source, options, records).
Running again with the same arguments skips every unit whose stats file exists and ends with the
same bytes as an uninterrupted run; a finished output is left untouched; a different input or
option on an existing output is refused (:class:`ConvertError`) unless ``overwrite``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from converters import executor
from converters.energon_meta import prepare
from converters.media import AudioOptions, ImageOptions
from converters.readers import audio_manifest, coco, folder, librispeech, manifest
from converters.records import ReadResult, drop_duplicates
from converters.units import WorkUnit, plan_units
from converters.writer import WriteOptions, atomic_write_bytes, load_stats

READERS: dict[str, Callable[..., ReadResult]] = {
    "coco": coco.read,
    "folder": folder.read,
    "manifest": manifest.read,
    "librispeech": librispeech.read,
    "audio-manifest": audio_manifest.read,
}
STATE_FILE = ".convert/state.json"
N_EXAMPLES = 5


class ConvertError(Exception):
    """The conversion cannot start (output holds something else); a one-line message."""


@dataclass
class ConvertOptions:
    out: str
    samples_per_shard: int = 512
    val_fraction: float = 0.0
    image: ImageOptions = field(default_factory=ImageOptions)
    audio: AudioOptions = field(default_factory=AudioOptions)
    workers: int = 1
    executor: str = "local"  #: "local" or "ray"
    ray_address: str | None = None
    max_error_fraction: float = 0.1
    overwrite: bool = False
    progress: bool = True

    def output_affecting(self) -> dict:
        """Options that change output bytes (workers and executor do not)."""
        return {"samples_per_shard": self.samples_per_shard, "val_fraction": self.val_fraction,
                "image": asdict(self.image), "audio": asdict(self.audio)}


@dataclass
class Outcome:
    report: dict
    already_done: bool
    ok: bool  #: False when the skipped fraction exceeds ``max_error_fraction``


def _write_json(path: Path, obj: dict) -> None:
    atomic_write_bytes(path, lambda f: f.write((json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()))


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
        h.update(json.dumps([r.key, r.source_id, r.media.name, r.media.parquet_cell, _media_stat(r.media.path),
                             r.texts]).encode())
    for p in result.problems:
        h.update(json.dumps(p.to_json()).encode())
    return h.hexdigest()


#: Everything a conversion writes into OUT; ``--overwrite`` removes these and nothing else.
OUTPUT_ENTRIES = ("train", "val", ".nv-meta", ".convert", "report.json", "skipped.jsonl")


def remove_conversion(out: Path) -> None:
    for name in OUTPUT_ENTRIES:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def _check_output(out: Path, state: dict, overwrite: bool) -> bool:
    """Prepare ``out`` for this conversion; True when it already holds this finished conversion."""
    state_path = out / STATE_FILE
    if overwrite:
        remove_conversion(out)
    if state_path.is_file():
        old = json.loads(state_path.read_text())
        diff = [k for k in ("source", "options", "records") if old.get(k) != state[k]]
        if diff:
            raise ConvertError(
                f"{out} holds a conversion of a different {' and '.join(diff)}; "
                f"use another --out or pass --overwrite to replace it"
            )
        return bool(old.get("finished"))
    if out.exists() and any(out.iterdir()):
        foreign = sorted(p.name for p in out.iterdir() if p.name not in OUTPUT_ENTRIES)
        raise ConvertError(
            f"{out} is not empty and holds no energon-platform conversion"
            + (f" (found {', '.join(foreign[:3])}); choose an empty --out" if foreign else "; pass --overwrite to replace it")
        )
    state_path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(state_path, state)
    return False


def _progress(opts: ConvertOptions, total_samples: int, n_units: int, done_units: int, done_samples: int):
    from tqdm import tqdm

    bar = tqdm(total=total_samples, initial=done_samples, unit="sample", disable=not opts.progress,
               desc="convert", dynamic_ncols=True)
    bar.set_postfix_str(f"shards {done_units}/{n_units}")
    return bar


def build_report(result_modality: str, state: dict, units: list[WorkUnit], stats: dict[str, dict],
                 read_problems: list[dict], opts: ConvertOptions) -> dict:
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
    return {
        "modality": result_modality,
        "source": state["source"],
        "options": state["options"],
        "totals": {"seen": seen, "written": written, "skipped": len(problems), "skipped_fraction": round(fraction, 6)},
        "splits": splits,
        "skipped_by_reason": {r: {"count": len(ids), "examples": ids[:N_EXAMPLES]} for r, ids in sorted(by_reason.items())},
        "shards": [{k: stats[u.name][k] for k in ("shard", "samples", "bytes", "sha256")} for u in units
                   if stats[u.name]["samples"]],
        "status": "ok" if ok else (
            "no sample could be converted" if not written else
            f"skipped fraction {fraction:.3f} exceeds --max-error-fraction {opts.max_error_fraction}"),
    }


def run_conversion(kind: str, reader_args: dict, opts: ConvertOptions) -> Outcome:
    """Convert one corpus. Raises ``InputError``/``ConvertError`` before writing anything when the
    input or output is unusable; bad records never raise."""
    result = READERS[kind](**reader_args)
    result.records, dup_problems = drop_duplicates(result.records)
    result.problems += dup_problems
    out = Path(opts.out)
    state = {
        "source": {"kind": kind, **{k: (str(Path(v).resolve()) if k in ("annotations", "images", "root", "manifest") else v)
                                    for k, v in reader_args.items()}},
        "options": opts.output_affecting(),
        "records": _records_digest(result),
        "modality": result.modality,
    }
    finished = _check_output(out, state, opts.overwrite)
    if finished:
        report = json.loads((out / "report.json").read_text())
        return Outcome(report, already_done=True, ok=report["status"] == "ok")

    units = plan_units(result.records, opts.samples_per_shard, opts.val_fraction)
    stats = {u.name: s for u in units if (s := load_stats(opts.out, u)) is not None}
    pending = [u for u in units if u.name not in stats]
    write_opts = WriteOptions(result.modality, kind, opts.image, opts.audio)
    bar = _progress(opts, len(result.records), len(units), len(stats),
                    sum(len(u.records) for u in units if u.name in stats))

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

    read_problems = [p.to_json() for p in result.problems]
    report = build_report(result.modality, state, units, stats, read_problems, opts)
    shards = [s["shard"] for s in report["shards"]]
    if shards:
        media_parts = sorted({e for u in units for e in stats[u.name]["extensions"] if e != "text.json"})
        # the dataset's identity is its content: options and every shard's checksum
        identity = hashlib.sha256(json.dumps([state["options"], [[s["shard"], s["sha256"]] for s in report["shards"]]],
                                             sort_keys=True).encode()).hexdigest()
        prepare(opts.out, shards, result.modality, media_parts, identity)
    skipped = read_problems + [p for u in units for p in stats[u.name]["problems"]]
    atomic_write_bytes(out / "skipped.jsonl", lambda f: f.write("".join(
        json.dumps(p, sort_keys=True) + "\n" for p in skipped).encode()))
    _write_json(out / "report.json", report)
    _write_json(out / STATE_FILE, {**state, "finished": True})
    return Outcome(report, already_done=False, ok=report["status"] == "ok")


def summarize(report: dict) -> str:
    """A few terminal lines: totals, splits, skipped by reason with examples, status."""
    t = report["totals"]
    lines = [f"{t['written']} samples written, {t['skipped']} skipped of {t['seen']} "
             f"({100 * t['skipped_fraction']:.1f}%)"]
    for split, s in sorted(report["splits"].items()):
        lines.append(f"  {split}: {s['samples']} samples in {s['shards']} shards")
    for reason, r in report["skipped_by_reason"].items():
        lines.append(f"  skipped {reason}: {r['count']} (e.g. {', '.join(map(str, r['examples'][:3]))})")
    lines.append(f"status: {report['status']}")
    return "\n".join(lines)


def reason_counts(report: dict) -> Counter:
    return Counter({r: v["count"] for r, v in report["skipped_by_reason"].items()})
