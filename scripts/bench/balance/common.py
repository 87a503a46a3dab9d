"""What every section shares: the synthetic stream of per-position sample lengths
(`SyntheticLengths`), the encoders' packer, per-step max/mean (`Recorder`) and a target's report line.
"""

from __future__ import annotations

import numpy as np

from scripts.bench.common import REPO  # noqa: F401 (the sections import it from here)

KINDS = ("image_text", "audio", "text")


#: what `SyntheticLengths.draw_parts` draws per sample
PART_FIELDS = ("kind", "tiles", "frames", "length")


CHUNK = 1 << 16


TARGET_RATIO, TARGET_PADDING, TARGET_RANKS = 1.05, 0.02, 8


class SyntheticLengths:
    """Per-position sample lengths of the synthetic blend, drawn lazily in seeded chunks (position
    ``p`` always has the same length, whoever reads it first)."""

    def __init__(self, args, seed: int | None = None):
        self.args, self.seed = args, args.seed if seed is None else seed
        w = np.array([args.weights[k] for k in KINDS], dtype=float)
        self.p = w / w.sum()
        self._parts: dict[int, dict[str, np.ndarray]] = {}

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.draw_parts(rng, n)["length"]

    def draw_parts(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        """``n`` samples: ``kind`` (index into KINDS), ``tiles`` (image_text), ``frames`` (audio)
        and ``length`` (the row length, clipped to ``--seq-len``)."""
        a = self.args
        kind = rng.choice(len(KINDS), size=n, p=self.p)
        caption = rng.lognormal(a.caption_mu, a.caption_sigma, n)
        tiles = rng.integers(1, 13, n)
        frames = rng.uniform(1.0, 30.0, n) * a.audio_fps
        text = rng.lognormal(a.text_mu, a.text_sigma, n)
        length = np.select(
            [kind == 0, kind == 1], [tiles * a.tokens_per_tile + caption, frames + caption], text
        )
        length = np.clip(length.astype(np.int64), 2, a.seq_len)
        return {"kind": kind, "tiles": tiles, "frames": frames.astype(np.int64), "length": length}

    def part_arrays(self, positions, fields=PART_FIELDS) -> dict[str, np.ndarray]:
        """Per position (as arrays): its ``fields`` of ``kind``, ``tiles``, ``frames`` and
        ``length`` (as :meth:`draw_parts`; each chunk of positions drawn once)."""
        positions = np.asarray(positions, dtype=np.int64)
        chunk = positions // CHUNK
        out = {k: np.empty(len(positions), dtype=np.int64) for k in fields}
        for c in np.unique(chunk).tolist():
            if c not in self._parts:
                self._parts[c] = self.draw_parts(np.random.default_rng([self.seed, c]), CHUNK)
            sel = chunk == c
            for k in fields:
                out[k][sel] = self._parts[c][k][positions[sel] % CHUNK]
        return out

    def parts(self, positions) -> list[dict]:
        """Per position: its ``kind``, ``tiles``, ``frames`` and ``length`` (as :meth:`draw_parts`)."""
        arrays = self.part_arrays(positions)
        return [dict(zip(PART_FIELDS, v)) for v in zip(*(arrays[k].tolist() for k in PART_FIELDS))]

    def __getitem__(self, positions) -> np.ndarray:
        """The ``length`` of each position (as :meth:`part_arrays`)."""
        return self.part_arrays(positions, ("length",))["length"]

    def lookup(self, positions) -> list[tuple[int, int]]:
        """The planner's ``lengths(positions)``: ``(row_length, work_length)`` per position."""
        return [(n, n) for n in self[positions].tolist()]


def ffd(lengths: list[int], keys: list[int], capacity: int) -> list[list[int]]:
    """The encoders' packer (``select_samples_to_pack``): first-fit decreasing, ties by key."""
    from task_encoders.sequences import first_fit_decreasing

    return first_fit_decreasing(lengths, [f"{k:012d}" for k in keys], capacity)


def spread(values) -> dict:
    v = np.asarray(values, dtype=float)
    return {
        "p50": float(np.percentile(v, 50)),
        "p90": float(np.percentile(v, 90)),
        "max": float(v.max()),
    }


def ratio(costs) -> float:
    """max/mean of one step's rank costs."""
    return max(costs) / (sum(costs) / len(costs))


def target_line(t: dict, width: int) -> str:
    """A target (``{"target", "value", "met"}``) as a report line, its text ``width`` wide."""
    return f"  {t['target']:<{width}} {t['value']:.4f}  {'met' if t['met'] else 'NOT met'}"


class Recorder:
    """Per-step rank costs, rows per rank and padding of one variant."""

    def __init__(self, seq_len: int):
        self.seq_len, self.ratios, self.row_counts, self.used, self.rows, self.samples = (
            seq_len,
            [],
            [],
            0,
            0,
            0,
        )

    def step(self, costs, rows_per_rank=None, used: int = 0, samples: int = 0):
        self.ratios.append(ratio(costs))
        if rows_per_rank is not None:
            self.row_counts.append(rows_per_rank)
            self.rows += sum(rows_per_rank)
            self.used += used
        self.samples += samples

    def result(self, **extra) -> dict:
        out = {
            "max_over_mean": spread(self.ratios),
            "samples_per_step": self.samples / len(self.ratios),
        }
        if self.row_counts:
            counts = np.asarray(self.row_counts)
            out.update(
                rows_per_rank_min=int(counts.min()),
                rows_per_rank_max=int(counts.max()),
                rows_max_over_min_per_step=spread(counts.max(1) / np.maximum(counts.min(1), 1)),
                padding=1.0 - self.used / (self.rows * self.seq_len),
            )
        return {**out, **extra}


#: what the measured sections keep of a calibration report (``calibrate``'s, without its rows)
CALIBRATION_KEYS = (
    "coefficients",
    "overhead",
    "r2",
    "share",
    "overhead_share",
    "p50_error",
    "p90_error",
    "micro_batches",
)
