"""``energon-platform info OUT``: what a converted dataset holds, read from its own files."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from braceexpand import braceexpand

from converters.convert import summarize
from converters.readers import InputError


def dataset_info(path: str) -> dict:
    """Shards and samples per split (from Energon's ``.nv-meta``), the sample type, the
    modalities (media parts) and the conversion report. ``text`` is the printable summary."""
    out = Path(path)
    meta = out / ".nv-meta"
    if not (meta / ".info.json").is_file():
        raise InputError(f"{out}: not an Energon dataset (no .nv-meta/.info.json)")
    shard_counts = json.loads((meta / ".info.json").read_text())["shard_counts"]
    splits = yaml.safe_load((meta / "split.yaml").read_text())["split_parts"]
    dataset = yaml.safe_load((meta / "dataset.yaml").read_text())
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    per_split = {
        name: {"shards": len(files), "samples": sum(shard_counts.get(f, 0) for f in files)}
        for name, patterns in splits.items()
        for files in [[f for p in patterns for f in braceexpand(p)]]
    }
    sample_type = dataset.get("sample_type", {}).get("__class__", "?")
    parts = sorted({v.split("[")[0] for v in dataset.get("field_map", {}).values()}) or ["(sample_loader.py)"]
    lines = [f"dataset: {out.resolve()}", f"sample type: {sample_type}   parts: {', '.join(parts)}"]
    lines += [f"  {n}: {s['samples']} samples in {s['shards']} shards" for n, s in sorted(per_split.items())]
    if report:
        lines += ["conversion report:", summarize(report)]
    return {"path": str(out.resolve()), "sample_type": sample_type, "parts": parts, "splits": per_split,
            "report": report, "text": "\n".join(lines)}
