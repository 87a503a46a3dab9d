"""The spikes of a step log in the form :func:`energon_platform.tools.report.build_report` takes,
found by the spike finder (:func:`energon_platform.training.spikes.find_spikes`), with each spike's
samples read from its own log row (no trace: for report tests that need no checkpoints)."""

from __future__ import annotations

from energon_platform.training.spikes import find_spikes, spike_rows


def spikes_of(rows: list[dict], z: float = 4.0, window: int = 50) -> list[dict]:
    """The spikes of ``rows``, worst first, as ``{"step", "loss", "z", "samples"}``; each logged key
    is a sample (``DATASET:KEY`` in a blend), with its ``loss`` when the row has ``sample_losses``."""
    out = []
    for spike in spike_rows(find_spikes(rows, z, window)):
        row = spike.pop("row")
        out.append({**spike, "samples": _samples(row)})
    return out


def _samples(row: dict) -> list[dict]:
    losses = row.get("sample_losses") or [None] * len(row.get("keys", []))
    samples = []
    for key, loss in zip(row.get("keys", []), losses):
        sample = {"dataset": key.partition(":")[0], "key": key} if ":" in key else {"key": key}
        samples.append({**sample, "loss": loss} if loss is not None else sample)
    return samples
