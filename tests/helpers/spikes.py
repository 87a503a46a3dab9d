"""A small stand-in for the spike finder, for tests and the report's screenshot: the spikes of a
step log in the form :func:`energon_platform.tools.report.build_report` takes."""

from __future__ import annotations

import statistics


def spikes_of(rows: list[dict], z: float = 4.0, window: int = 50) -> list[dict]:
    """Rows whose loss is at least ``z`` standard deviations above the mean of the ``window`` rows
    before it, as ``{"step", "loss", "z", "samples"}``; each logged key is a sample
    (``DATASET:KEY`` in a blend), with its ``loss`` when the row has ``sample_losses``."""
    out = []
    for i in range(2, len(rows)):
        before = [r["loss"] for r in rows[max(0, i - window) : i]]
        spread = statistics.pstdev(before) or 1e-12
        score = (rows[i]["loss"] - statistics.fmean(before)) / spread
        if score >= z:
            out.append({**_spike(rows[i]), "z": score})
    return out


def _spike(row: dict) -> dict:
    losses = row.get("sample_losses") or [None] * len(row.get("keys", []))
    samples = []
    for key, loss in zip(row.get("keys", []), losses):
        sample = {"dataset": key.partition(":")[0], "key": key} if ":" in key else {"key": key}
        samples.append({**sample, "loss": loss} if loss is not None else sample)
    return {"step": row["step"], "loss": row["loss"], "samples": samples}
