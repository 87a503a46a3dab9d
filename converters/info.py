"""``energon-platform info OUT``: what a converted dataset holds, read from its own files, and
whether it is still whole: every shard Energon indexed must exist, with its ``.tar.idx``, and
have the size the conversion report recorded (cheap: no content is read). ``healthy`` is False
and ``problems`` names each missing or changed file otherwise (the CLI then exits 1)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from braceexpand import braceexpand

from converters.convert import summarize
from converters.readers import InputError
from converters.writer import shard_problem
from storage import check_there, dataset_root, is_remote, storage_errors


def dataset_info(path: str) -> dict:
    """Shards and samples per split (from Energon's ``.nv-meta``), the sample type, the
    modalities (media parts), the conversion report and the health check (``healthy``,
    ``problems``). ``text`` is the printable summary.
    ``path``: a folder or ``msc://PROFILE/prefix`` (read through Energon's ``EPath``; a store that
    refuses or fails raises ``StorageError``, one line)."""
    with storage_errors(path, "the dataset's metadata"):
        return _dataset_info(path)


def _dataset_info(path: str) -> dict:
    out = dataset_root(path)
    where = str(out) if is_remote(path) else str(Path(path).resolve())
    meta = out / ".nv-meta"
    if not (meta / ".info.json").is_file():
        check_there(path)
        raise InputError(f"{out}: not an Energon dataset (no .nv-meta/.info.json)")
    try:
        shard_counts = json.loads((meta / ".info.json").read_text())["shard_counts"]
        splits = yaml.safe_load((meta / "split.yaml").read_text())["split_parts"]
        dataset = yaml.safe_load((meta / "dataset.yaml").read_text())
        report = (
            json.loads((out / "report.json").read_text())
            if (out / "report.json").is_file()
            else None
        )
        if not (
            isinstance(shard_counts, dict)
            and isinstance(splits, dict)
            and isinstance(dataset, dict)
        ):
            raise TypeError("unexpected structure")
    except (ValueError, KeyError, TypeError, yaml.YAMLError) as e:
        raise InputError(
            f"{out}: corrupt dataset metadata ({type(e).__name__}: {str(e)[:200]})"
        ) from e
    per_split = {
        name: {"shards": len(files), "samples": sum(shard_counts.get(f, 0) for f in files)}
        for name, patterns in splits.items()
        for files in [[f for p in patterns for f in braceexpand(p)]]
    }
    try:  # a report.json edited or cut short: one line naming it, not a KeyError
        sizes = {s["shard"]: s["bytes"] for s in report["shards"]} if report is not None else {}
        report_text = summarize(report) if report is not None else None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(
            f"{out / 'report.json'}: corrupt conversion report ({type(e).__name__}: {str(e)[:200]}); "
            f"run the same convert command again to rewrite it"
        ) from None
    problems = []
    for shard in shard_counts:
        problem = (
            shard_problem(out, shard, sizes[shard])
            if shard in sizes
            else (None if (out / shard).is_file() else f"{shard}: missing")
        )
        if problem is None and not (out / (shard + ".idx")).is_file():
            problem = f"{shard}.idx: missing (Energon's shard index)"
        if problem:
            problems.append(problem)
    sample_type = dataset.get("sample_type", {}).get("__class__", "?")
    parts = sorted({v.split("[")[0] for v in dataset.get("field_map", {}).values()}) or [
        "(sample_loader.py)"
    ]
    lines = [f"dataset: {where}", f"sample type: {sample_type}   parts: {', '.join(parts)}"]
    lines += [
        f"  {n}: {s['samples']} samples in {s['shards']} shards"
        for n, s in sorted(per_split.items())
    ]
    if report_text is not None:
        lines += ["conversion report:", report_text]
    if problems:
        lines += [
            f"UNHEALTHY: {len(problems)} of {len(shard_counts)} shards missing or changed since the conversion "
            f"(run the same convert command again to rewrite them):"
        ] + [f"  {p}" for p in problems]
    return {
        "path": where,
        "sample_type": sample_type,
        "parts": parts,
        "splits": per_split,
        "report": report,
        "healthy": not problems,
        "problems": problems,
        "text": "\n".join(lines),
    }
