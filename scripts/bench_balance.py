"""Compute balance across data-parallel ranks: today, a naive sort-and-deal, Energon's packing, ours.

    python scripts/bench_balance.py [--json PATH] [--quick] [--steps 500] [--ranks 8 64] [--rows-per-rank 2]
        [--train | --sections balance train] [--train-steps 40] [--train-rounds 3]

A skewed synthetic blend of per-sample lengths (seeded NumPy, drawn lazily per position, so every
variant reads the *same* stream): ``image_text`` = tiles (uniform 1..12) x ``--tokens-per-tile``
plus a lognormal caption; ``audio`` = a duration uniform in 1..30 s x ``--audio-fps`` frames per
second plus a lognormal transcript; ``text`` = a lognormal document. Every length is clipped to
``--seq-len``; the kinds are mixed i.i.d. by ``--weights``. A sample's row length and work length
are the same number here (image tiles and audio frames count as the positions the model sees).

For each number of simulated ranks R (``--ranks``), K rows (packed) or samples (unpacked) per rank
(``--rows-per-rank``), ``--steps`` steps and both cost models (``tokens``: cost = L; ``attention``:
cost = L² + c·L, c = ``--linear``, default ``--seq-len``), the per-step max/mean of the ranks'
summed cost (reported as p50/p90/max over steps) for:

* ``none`` (today). Unpacked: R·K consecutive samples, sliced contiguously to ranks. Packed: R·K
  pack groups of ``--pack-group`` consecutive samples, each packed first-fit decreasing (the
  encoders' ``select_samples_to_pack``) into a variable number of rows, groups dealt contiguously
  (K per rank), so rows per rank vary.
* ``naive``: the same global batch of samples as ``none``, sorted by cost (longest first) and dealt
  round-robin; packed, each rank then packs its samples first-fit decreasing (rows vary).
* ``energon`` (packed only; unpacked it is ``none``: each rank batches its own consecutive
  samples): Energon's ``PackingDataset`` at the same settings: each rank reads its own contiguous
  blocks of ``--packing-buffer-size`` samples (block j to rank j mod R), packs each block first-fit
  decreasing and batches the packs, K rows per step. Nothing is dropped; no rank sees another's
  samples, so rows per rank are fixed but their cost is not balanced.
* ``ours``: :class:`energon_platform.loader.balance.planner.Planner`, then ``deal_plan``. Packed: R·K rows
  of ``--seq-len`` per global batch, dealt with ``fixed=True``. Unpacked: ``ours`` plans R·K samples of
  like cost around the oldest of a pool of 32 global batches (no budget) and deals them K per rank;
  ``ours-budget`` plans with a cost budget (``budget=`` R·K x the blend's mean cost, measured on a
  calibration draw) and deals with free counts. Also reported: padding (mean ``BatchPlan.padding``), the most carried samples, the
  state size in bytes (``json.dumps(PlanState.to_json())`` after the last step), the planner's
  time per global batch and ``bound``: per step, a lower bound of max/mean that any dealing of that
  batch's rows (samples) must reach (the costliest item plus the K-1 cheapest on one rank), which
  tells a planning limit (which samples and rows form the batch) from a dealing one.

A rank's cost is the sum of its samples' costs (padding is not counted: the cost models measure
useful work). Then ratios ours/none and ours/energon of the p90 max/mean, and whether the balance
targets are met (p90 max/mean <= 1.05 for 8 ranks x 2 rows or samples in both cost models; padding
<= 2%). Every figure is measured in this run; nothing is typed in. ``--check`` exits 1 when a
target is missed. Sections are listed in ``SECTIONS``: a later one (e.g. the reference model's
tokens/s on 2 gloo ranks) adds a function there.

``--train`` (minutes) adds the ``train`` section: the last balance figure, the reference model's
tokens/s on 2 gloo ranks (``torchrun``, one rank per core, ``num_workers: 0``) on a skewed blend of
the embedded corpora (converted into a temporary folder), today (``balance: none``: global batches
of pack groups, rows per rank vary) against ours (``balance: attention``: fixed rows), each global
batch about the same tokens; runs interleaved (today, ours, today, ours, ...) against load drift.
``--sections train`` runs it alone. ``--sections train-measured`` (minutes) trains the two-tower
model on skewed image-caption data (1-12 tiles per image, lognormal captions), today against
``balance: measured`` (its cost file calibrated first, on this data) and ``attention``, and reports
optimizer steps/s. ``--sections llava`` calibrates megatron-core's own ``LLaVAModel``
(tiny, on the CPU) on vision-language micro-batches of the embedded captions: R² and the held-back
p90 error against the same targets as the two-tower model's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from energon_platform.loader.balance.dealing import deal_bound, deal_plan, rank_costs  # noqa: E402
from energon_platform.loader.balance.packer import sample_cost  # noqa: E402
from energon_platform.loader.balance.planned import plans_like_lengths  # noqa: E402
from energon_platform.loader.balance.planner import Planner  # noqa: E402
from scripts.balance_sizes import report_sizes, sizes_section  # noqa: E402
from scripts.bench_run import run_record  # noqa: E402

KINDS = ("image_text", "audio", "text")
#: what `Blend.draw_parts` draws per sample
PART_FIELDS = ("kind", "tiles", "frames", "length")
CHUNK = 1 << 16
TARGET_RATIO, TARGET_PADDING, TARGET_RANKS = 1.05, 0.02, 8


class Blend:
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


def packed_none_naive(blend: Blend, cost, ranks: int, k: int, args) -> dict[str, dict]:
    """``none`` and ``naive`` packed: the same R·K·pack_group samples per step."""
    group, seq_len = args.pack_group, args.seq_len
    none, naive = Recorder(seq_len), Recorder(seq_len)
    per_step = ranks * k * group
    for s in range(args.steps):
        pos = np.arange(s * per_step, (s + 1) * per_step)
        lengths = blend[pos].tolist()
        c = [cost(n) for n in lengths]
        # none: group g = samples [g*group, (g+1)*group); rank r gets groups [r*k, (r+1)*k)
        costs, rows = [], []
        for r in range(ranks):
            lo, hi = r * k * group, (r + 1) * k * group
            costs.append(sum(c[lo:hi]))
            rows.append(
                sum(
                    len(ffd(lengths[g : g + group], pos[g : g + group].tolist(), seq_len))
                    for g in range(lo, hi, group)
                )
            )
        none.step(costs, rows, sum(lengths), per_step)
        # naive: sort by cost (ties: position), deal round-robin, each rank packs its own samples
        ranked = sorted(range(per_step), key=lambda i: (-c[i], i))
        costs, rows = [], []
        for r in range(ranks):
            mine = sorted(ranked[r::ranks])
            costs.append(sum(c[i] for i in mine))
            rows.append(len(ffd([lengths[i] for i in mine], [int(pos[i]) for i in mine], seq_len)))
        naive.step(costs, rows, sum(lengths), per_step)
    return {"none": none.result(), "naive": naive.result()}


def packed_energon(blend: Blend, cost, ranks: int, k: int, args) -> dict:
    """Energon's packing: per rank, blocks of ``packing_buffer_size`` own samples → FFD → K rows a step."""
    buf, seq_len = args.packing_buffer_size, args.seq_len
    rec = Recorder(seq_len)
    queues: list[list[list[int]]] = [[] for _ in range(ranks)]  # rows of sample lengths
    blocks = [0] * ranks  # blocks read per rank; block j of rank r is global block j*ranks + r
    for _ in range(args.steps):
        costs, used, samples = [], 0, 0
        for r in range(ranks):
            while len(queues[r]) < k:
                start = (blocks[r] * ranks + r) * buf
                blocks[r] += 1
                pos = np.arange(start, start + buf)
                lengths = blend[pos].tolist()
                queues[r] += [
                    [lengths[i] for i in row] for row in ffd(lengths, pos.tolist(), seq_len)
                ]
            mine, queues[r] = queues[r][:k], queues[r][k:]
            costs.append(sum(cost(n) for row in mine for n in row))
            used += sum(sum(row) for row in mine)
            samples += sum(len(row) for row in mine)
        rec.step(costs, [k] * ranks, used, samples)
    return rec.result()


def run_ours(
    planner: Planner, ranks: int, fixed: bool, steps: int, seq_len: int, packed: bool
) -> dict:
    rec, pads, bounds, carried, seconds = Recorder(seq_len), [], [], 0, 0.0
    for b in range(steps):
        t = time.perf_counter()
        plan = planner.plan(b)
        seconds += time.perf_counter() - t
        bounds.append(deal_bound(plan.costs, ranks, fixed))
        dealt = deal_plan(plan, ranks, 1, fixed=fixed)
        rows = [sum(len(m) for m in rank) for rank in dealt] if packed else None
        rec.step(
            rank_costs(plan, dealt), rows, sum(plan.used), sum(len(item) for item in plan.items)
        )
        pads.append(plan.padding)
        carried = max(carried, len(plan.next_state.carried))
    state = planner.state_at(steps)
    return rec.result(
        plan_padding_mean=float(np.mean(pads)) if packed else None,
        carried_max=carried,
        batch_bound=spread(bounds),
        state_bytes=len(json.dumps(state.to_json())),
        planner_ms_per_batch=1000 * seconds / steps,
    )


def unpacked_none_naive(blend: Blend, cost, ranks: int, k: int, args) -> dict[str, dict]:
    none, naive = Recorder(args.seq_len), Recorder(args.seq_len)
    per_step = ranks * k
    for s in range(args.steps):
        c = [cost(n) for n in blend[np.arange(s * per_step, (s + 1) * per_step)].tolist()]
        none.step([sum(c[r * k : (r + 1) * k]) for r in range(ranks)], samples=per_step)
        ranked = sorted(range(per_step), key=lambda i: (-c[i], i))
        naive.step([sum(c[i] for i in ranked[r::ranks]) for r in range(ranks)], samples=per_step)
    return {"none": none.result(), "naive": naive.result()}


def balance_section(args) -> dict:
    """Part (1): per-step max/mean rank cost of every variant, packed and unpacked."""
    blend = Blend(args)
    calibration = Blend(args, seed=args.seed + 1).draw(
        np.random.default_rng([args.seed, 2**32 - 1]), 200_000
    )
    mean_len = float(calibration.mean())
    if args.pack_group is None:  # one pack group fills one row on average: K groups ≈ K rows
        args.pack_group = max(2, int(round(args.seq_len / mean_len)))
    if args.packing_buffer_size is None:
        args.packing_buffer_size = args.pack_group
    blend_info = {
        "mean_length": mean_len,
        "p50_length": float(np.median(calibration)),
        "p99_length": float(np.percentile(calibration, 99)),
        "clipped_share": float(np.mean(calibration == args.seq_len)),
        "pack_group": args.pack_group,
        "packing_buffer_size": args.packing_buffer_size,
    }
    results = []
    for mode in ("tokens", "attention"):

        def cost(n, mode=mode):
            return sample_cost(n, mode, args.linear)

        mean_cost = float(np.mean([cost(n) for n in calibration.tolist()]))
        for ranks in args.ranks:
            k = args.rows_per_rank
            t = time.perf_counter()
            packed = packed_none_naive(blend, cost, ranks, k, args)
            packed["energon"] = packed_energon(blend, cost, ranks, k, args)
            packed["ours"] = run_ours(
                Planner(blend.lookup, cost, ranks * k, capacity=args.seq_len, window=args.window),
                ranks,
                True,
                args.steps,
                args.seq_len,
                True,
            )
            unpacked = unpacked_none_naive(blend, cost, ranks, k, args)
            unpacked["ours"] = run_ours(
                Planner(blend.lookup, cost, ranks * k, window=args.window),
                ranks,
                True,
                args.steps,
                args.seq_len,
                False,
            )
            unpacked["ours-budget"] = run_ours(
                Planner(
                    blend.lookup, cost, ranks, budget=ranks * k * mean_cost, window=args.window
                ),
                ranks,
                False,
                args.steps,
                args.seq_len,
                False,
            )
            for layout, variants in (("packed", packed), ("unpacked", unpacked)):
                results.append(
                    {
                        "cost": mode,
                        "ranks": ranks,
                        "per_rank": k,
                        "layout": layout,
                        "variants": variants,
                    }
                )
            print(f"  [{mode}, {ranks} ranks: {time.perf_counter() - t:.1f} s]", file=sys.stderr)
    return {"blend": blend_info, "results": results, "targets": targets(results)}


def targets(results: list[dict]) -> list[dict]:
    """The balance targets, each with the measured value and whether it is met."""
    out = []
    for r in results:
        if r["ranks"] != TARGET_RANKS or r["per_rank"] != 2:
            continue
        ours = r["variants"]["ours"]
        p90 = ours["max_over_mean"]["p90"]
        out.append(
            {
                "target": f"{r['layout']} {r['cost']}: p90 max/mean <= {TARGET_RATIO}",
                "value": p90,
                "met": p90 <= TARGET_RATIO,
                "batch_bound_p90": ours["batch_bound"]["p90"],
            }
        )
        if r["layout"] == "packed":
            pad = ours["plan_padding_mean"]
            out.append(
                {
                    "target": f"packed {r['cost']}: padding <= {TARGET_PADDING:.0%}",
                    "value": pad,
                    "met": pad <= TARGET_PADDING,
                }
            )
    return out


def report_balance(section: dict, args) -> list[str]:
    b = section["blend"]
    lines = [
        f"blend: weights {args.weights}, seq_len {args.seq_len}, {args.tokens_per_tile} tokens/tile, "
        f"{args.audio_fps:g} audio frames/s; mean length {b['mean_length']:.0f} (p50 {b['p50_length']:.0f}, "
        f"p99 {b['p99_length']:.0f}, {100 * b['clipped_share']:.1f}% clipped); pack_group {b['pack_group']}, "
        f"packing_buffer_size {b['packing_buffer_size']}; {args.steps} steps; attention c = {args.linear:g}",
        "",
        f"{'cost':<9} {'ranks':>5} {'layout':<8} {'variant':<10} {'p50':>6} {'p90':>6} {'max':>6} "
        f"{'rows/rank':>9} {'rows max/min':>12} {'padding':>8} {'samples/step':>12} {'carried':>7} "
        f"{'state B':>7} {'plan ms':>7} {'bound p90':>9}",
        "-" * 132,
    ]
    for r in section["results"]:
        for name, v in r["variants"].items():
            m = v["max_over_mean"]
            rows = (
                f"{v['rows_per_rank_min']}-{v['rows_per_rank_max']}"
                if "rows_per_rank_min" in v
                else "-"
            )
            rmm = (
                f"{v['rows_max_over_min_per_step']['max']:.2f}"
                if "rows_max_over_min_per_step" in v
                else "-"
            )
            pad = v.get("plan_padding_mean", v.get("padding"))
            pad = f"{100 * pad:.2f}%" if pad is not None else "-"
            extra = (
                f"{v['carried_max']:>7} {v['state_bytes']:>7} {v['planner_ms_per_batch']:>7.2f} "
                f"{v['batch_bound']['p90']:>9.3f}"
                if "carried_max" in v
                else f"{'-':>7} {'-':>7} {'-':>7} {'-':>9}"
            )
            lines.append(
                f"{r['cost']:<9} {r['ranks']:>5} {r['layout']:<8} {name:<10} {m['p50']:>6.3f} "
                f"{m['p90']:>6.3f} {m['max']:>6.3f} {rows:>9} {rmm:>12} {pad:>8} "
                f"{v['samples_per_step']:>12.1f} {extra}"
            )
    lines += ["", "ratios of p90 max/mean (lower is better for ours):"]
    for r in section["results"]:
        v = r["variants"]
        ours = v["ours"]["max_over_mean"]["p90"]
        parts = [
            f"ours/{name} {ours / v[name]['max_over_mean']['p90']:.3f}"
            for name in ("none", "naive", "energon")
            if name in v
        ]
        lines.append(
            f"  {r['cost']:<9} {r['ranks']:>3} ranks x {r['per_rank']} {r['layout']:<8}: "
            + ", ".join(parts)
        )
    lines += ["", "targets (8 ranks x 2):"]
    for t in section["targets"]:
        why = ""
        if not t["met"] and t.get("batch_bound_p90", 0) > TARGET_RATIO:
            why = f" (the planned batches' own bound is {t['batch_bound_p90']:.3f} at p90: the batch, not the dealing)"
        lines.append(target_line(t, 45) + why)
    return lines


# --- the reference model's tokens/s on 2 gloo ranks (--train) -----------------------------------

#: the embedded corpora as a skewed blend: short captions and utterances (about 14 and 9 tokens)
#: mixed with long documents (about 94 of 128), so a pack group of 16 samples fills 2 to 12 rows.
TRAIN_WEIGHTS = {"coco_mini": 2, "librispeech_mini": 1, "text_mini": 1}
TRAIN_TARGET, TRAIN_WARMUP = 1.15, 2


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


class TrainFailed(Exception):
    """A training run of the ``train`` section exited non-zero (its last stderr line says why)."""


def _train_data(base: Path) -> Path:
    """Convert the embedded corpora (``bench_data.py``) under ``base``; the blend's metadataset."""
    import yaml

    from scripts.bench_data import coco_dataset, librispeech_dataset, text_dataset

    paths = {p.name: p for p in (coco_dataset(base), librispeech_dataset(base), text_dataset(base))}
    mds = base / "blend.yaml"
    mds.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {
                    "train": {
                        "blend": [
                            {"weight": w, "path": str(paths[n])} for n, w in TRAIN_WEIGHTS.items()
                        ]
                    }
                },
            }
        )
    )
    return mds


def _train_config(
    data: Path,
    base: Path,
    balance: str,
    args,
    model: dict | None = None,
    cost: Path | None = None,
    encoder: dict | None = None,
    batch: dict[str, int] | None = None,
) -> Path:
    """A run config on ``data`` (a metadataset or a dataset folder): the packing multimodal encoder
    (or ``encoder``), today (``none``: ``--train-groups`` pack groups per step) or ours
    (``attention`` or ``measured`` with the cost file ``cost``: ``--train-rows`` rows per step;
    ``batch``: the global batch by balance instead), the same model (``model``: the reference
    model's settings, default the tiny model of ``--train-dim`` and ``--train-layers``) and
    settings."""
    import yaml

    gbs = args.train_groups if balance == "none" else args.train_rows
    gbs = (batch or {}).get(balance, gbs)
    model = model or {"dim": args.train_dim, "layers": args.train_layers, "heads": 4, "patch": 16}
    name = f"{model.get('kind', 'tiny')}-{balance}"
    cfg = {
        "data": {"path": str(data), "val_split": None},
        "encoder": encoder or str(REPO / "configs/encoders/multimodal_packed.yaml"),
        "loader": {
            "global_batch_size": gbs,
            "num_workers": 0,
            "seed": 1234,
            "balance": balance,
            "length_cache": str(base / "lengths"),
        },
        "model": model,
        "train": {
            "steps": args.train_steps,
            "lr": 0.003,
            "warmup": 2,
            "checkpoint_every": args.train_steps,
        },
    }
    if cost is not None:
        cfg["loader"]["cost_model"] = str(cost)
    path = base / f"run-{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _train_once(config: Path, out: Path, args) -> dict:
    """One ``torchrun --nproc-per-node 2`` training run; tokens/s after the warm-up steps."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "energon_platform",
        "train",
        "--config",
        str(config),
        "--out",
        str(out),
        "--steps",
        str(args.train_steps),
        "--quiet",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise TrainFailed(
            f"{config.name}: training failed ({proc.returncode}): "
            f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}"
        )
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    timed = rows[TRAIN_WARMUP:]
    seconds = timed[-1]["elapsed_s"] - rows[TRAIN_WARMUP - 1]["elapsed_s"]
    tokens = sum(r["targets"] for r in timed)
    samples = sum(len(r["keys"]) for r in timed)
    return {
        "tokens_per_s": tokens / seconds,
        "samples_per_s": samples / seconds,
        "seconds": seconds,
        "steps": len(timed),
        "tokens_per_step": tokens / len(timed),
        "samples_per_step": samples / len(timed),
        "step_s": [r["elapsed_s"] for r in rows],
        "wall_s": wall,
        "rank_cost": float(np.mean([r["rank_cost"] for r in timed]))
        if "rank_cost" in timed[0]
        else None,
        "padding": float(np.mean([r["padding"] for r in timed])) if "padding" in timed[0] else None,
    }


def _today_stats(config: Path, args) -> dict:
    """Today's per-step rank balance, which its log does not carry: the run's global batches read by
    one loader per rank in this process (world size 2), after the warm-up steps: rows per rank,
    padding (1 - real tokens / rows x seq_len) and max/mean of the ranks' attention cost, as
    ``rank_cost`` in a balanced run's log."""
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    cfg = load_config(str(config))
    loaders = [TrainLoader(cfg, rank=r, world_size=2, num_workers=0) for r in range(2)]
    seq_len = loaders[0].encoder.tokenizer.seq_len
    ratios, rows, used, slots = [], [], 0, 0
    try:
        for step in range(args.train_steps):
            costs, counts = [], []
            for ld in loaders:
                cost, count = 0.0, 0
                for _ in range(ld.accumulation):
                    b = next(ld)
                    lengths = b.doc_lengths.view(-1).tolist()
                    cost += sum(sample_cost(n, "attention", seq_len) for n in lengths)
                    count += b.tokens.shape[0]
                    if step >= TRAIN_WARMUP:
                        used, slots = used + sum(lengths), slots + b.tokens.shape[0] * seq_len
                costs.append(cost)
                counts.append(count)
            if step >= TRAIN_WARMUP:
                ratios.append(ratio(costs))
                rows.append(counts)
    finally:
        for ld in loaders:
            ld.close()
    counts = np.asarray(rows)
    return {
        "rank_cost": float(np.mean(ratios)),
        "padding": 1.0 - used / slots,
        "rows_per_rank_min": int(counts.min()),
        "rows_per_rank_max": int(counts.max()),
    }


def _interleaved_runs(configs: dict[str, Path], base: Path, args) -> tuple[dict, list[float]]:
    """``--train-rounds`` rounds of one `_train_once` per config, interleaved A, B, A, B against
    load drift: ``(runs per name, 1-minute load average before the first run and after each)``;
    a load above ~2 means other processes competed for the 2 cores."""
    load = [os.getloadavg()[0]]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for rnd in range(args.train_rounds):
        for name, config in configs.items():
            runs[name].append(_train_once(config, base / f"out-{name}-{rnd}", args))
            load.append(os.getloadavg()[0])
            r = runs[name][-1]
            print(
                f"  [train {name} round {rnd}: {r['tokens_per_s']:.0f} tokens/s, "
                f"{r['steps'] / r['seconds']:.2f} steps/s, {r['wall_s']:.1f} s]",
                file=sys.stderr,
            )
    return runs, load


def _variants(runs: dict[str, list[dict]], rows: dict[str, int]) -> dict[str, dict]:
    """Per variant, over its runs: tokens/s, samples/s and steps/s (totals over total seconds),
    tokens and samples per step, per-round tokens/s and steps/s, mean ``rank_cost`` and
    ``padding`` of the logs; the rows per rank (2 ranks) of the variants planned with ``rows``
    rows per step (today's vary: not known from its log)."""
    variants = {}
    for name, rs in runs.items():
        tokens = sum(r["tokens_per_step"] * r["steps"] for r in rs)
        samples = sum(r["samples_per_step"] * r["steps"] for r in rs)
        seconds = sum(r["seconds"] for r in rs)
        variants[name] = {
            "tokens_per_s": tokens / seconds,
            "tokens_per_step": tokens / sum(r["steps"] for r in rs),
            "samples_per_s": samples / seconds,
            "samples_per_step": samples / sum(r["steps"] for r in rs),
            "steps_per_s": sum(r["steps"] for r in rs) / seconds,
            "rounds_tokens_per_s": [r["tokens_per_s"] for r in rs],
            "rounds_steps_per_s": [r["steps"] / r["seconds"] for r in rs],
            **{
                k: None if rs[0][k] is None else float(np.mean([r[k] for r in rs]))
                for k in ("rank_cost", "padding")
            },
            "runs": rs,
        }
        if name in rows:
            variants[name]["rows_per_rank_min"] = variants[name]["rows_per_rank_max"] = (
                rows[name] // 2
            )
    return variants


def train_section(args) -> dict:
    """The reference model (``model.dim`` ``--train-dim``, ``--train-layers`` layers) trained on 2
    gloo ranks (one per core, ``num_workers: 0``) on the skewed blend, today (``balance: none``)
    and ours (``balance: attention``), interleaved A, B, A, B (``--train-rounds`` rounds) against
    load drift. Tokens/s = Σ targets / elapsed over the steps after the first ``TRAIN_WARMUP``;
    per variant the total tokens over the total seconds of its runs."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-balance-train-") as tmp:
        base = Path(tmp)
        mds = _train_data(base)
        configs = {
            "none": _train_config(mds, base, "none", args),
            "attention": _train_config(mds, base, "attention", args),
        }
        today = _today_stats(configs["none"], args)
        runs, load = _interleaved_runs(configs, base, args)
    variants = _variants(runs, {"attention": args.train_rows})
    variants["none"].update(today)  # not in today's log: from the same batches, read here
    speedup = variants["attention"]["tokens_per_s"] / variants["none"]["tokens_per_s"]
    pairs = [
        b / a
        for a, b in zip(
            variants["none"]["rounds_tokens_per_s"], variants["attention"]["rounds_tokens_per_s"]
        )
    ]
    return {
        "round_ratios": pairs,
        "round_ratio_median": float(np.median(pairs)),
        "load_during": load,
        "weights": TRAIN_WEIGHTS,
        "global_batch_size": {"none": args.train_groups, "attention": args.train_rows},
        "steps": args.train_steps,
        "warmup": TRAIN_WARMUP,
        "rounds": args.train_rounds,
        "model": {"dim": args.train_dim, "layers": args.train_layers},
        "variants": variants,
        "ratio": speedup,
        "targets": [
            {
                "target": f"2-rank tokens/s ours/today >= {TRAIN_TARGET}",
                "value": speedup,
                "met": speedup >= TRAIN_TARGET,
            }
        ],
    }


def report_train(section: dict, args) -> list[str]:
    m = section["model"]
    lines = [
        f"reference model (dim {m['dim']}, {m['layers']} layers) on 2 gloo ranks x 0 workers, blend "
        f"{section['weights']}; {section['steps']} steps per run ({section['warmup']} warm-up skipped), "
        f"{section['rounds']} interleaved rounds",
        "",
        f"{'variant':<18} {'global batch':>16} {'tokens/step':>11} {'steps/s':>8} {'tokens/s':>9} "
        f"{'per round':>18} {'rows/rank':>9} {'rank_cost':>9} {'padding':>8}",
        "-" * 114,
    ]
    for name, v in section["variants"].items():
        label = "today (none)" if name == "none" else "ours (attention)"
        gbs = section["global_batch_size"][name]
        gbs = f"{gbs} {'groups' if name == 'none' else 'rows'}"
        rounds = " ".join(f"{x:.0f}" for x in v["rounds_tokens_per_s"])
        rows = f"{v['rows_per_rank_min']}-{v['rows_per_rank_max']}"
        lines.append(
            f"{label:<18} {gbs:>16} {v['tokens_per_step']:>11.0f} {v['steps_per_s']:>8.2f} "
            f"{v['tokens_per_s']:>9.0f} {rounds:>18} {rows:>9} {v['rank_cost']:>9.3f} "
            f"{100 * v['padding']:>7.2f}%"
        )
    t = section["targets"][0]
    lines += [
        "(rank_cost: mean over steps of max/mean of the ranks' attention cost; today's rows/rank, rank_cost "
        "and padding from the same batches read in this process, ours from its log)",
        "",
        f"tokens/s ours/today: {section['ratio']:.3f} (all runs); per round "
        f"{' '.join(f'{x:.3f}' for x in section['round_ratios'])}, median {section['round_ratio_median']:.3f}; "
        f"1-minute load average around the runs {' '.join(f'{x:.1f}' for x in section['load_during'])} "
        "(above ~2, other processes share the 2 cores and the ratio is noisy)",
        target_line(t, 45),
    ]
    return lines


# --- the two-tower model's optimizer steps/s on 2 gloo ranks, planned by measured cost ----------

#: the two-tower reference model the ``train-measured`` section calibrates and trains: its vision
#: tower runs 4 blocks 64 wide over the 16 patches of 8 pixels of each 32-pixel tile
TRAIN_TWO_TOWER = dict(
    kind="two_tower", dim=64, layers=2, heads=4, patch=8, vision_dim=64, vision_layers=4
)
MEASURED_TRAIN_TARGET = 1.15
#: its data (`skewed_captions_dataset`): each image an exact grid of 1-12 tiles of this side
SKEW_TILE = 32
#: its global batches: today 2 pack groups of `SKEW_PACK_GROUP` samples (one per rank); ours (by
#: attention or by measured cost) 2 rows of `SKEW_SEQ_LEN` positions (one per rank), which hold
#: about as many samples and tiles as today's step
TRAIN_MEASURED_BATCH = {"none": 2, "attention": 2, "measured": 2}
SKEW_SEQ_LEN = 640
SKEW_PACK_GROUP = 4
SKEW_DATA = (
    f"the embedded COCO captions skewed: 1-12 tiles of {SKEW_TILE} px per image (+ thumbnail), "
    f"lognormal captions (median 12 words), rows of {SKEW_SEQ_LEN}"
)


def skewed_encoder() -> dict:
    """The ``train-measured`` encoder: the small packing vision-language encoder
    (``image_text_vlm_small_packed.yaml``) with tiles of `SKEW_TILE` pixels, up to 12 per image
    (and a thumbnail), and rows of `SKEW_SEQ_LEN` positions after the splice."""
    import yaml

    enc = yaml.safe_load((REPO / "configs/encoders/image_text_vlm_small_packed.yaml").read_text())
    enc["vision"]["image_size"] = SKEW_TILE
    enc["image"]["tiling"]["max_num_tiles"] = 12
    enc["text"]["seq_len"] = SKEW_SEQ_LEN
    enc["packing"]["buffer_size"] = SKEW_PACK_GROUP
    return enc


def train_measured_section(args) -> dict:
    """The two-tower model trained on 2 gloo ranks (``num_workers: 0``) on skewed image-caption
    data (`skewed_captions_dataset`: vision work per sample varies 12-fold, apart from the
    caption's length), today (``balance: none``) against ours (``balance: measured``, planned with
    the cost file that ``calibrate`` first writes for this model on this data from
    ``--calibrate-batches`` micro-batches of planned rows), with ``balance: attention`` beside
    them (planned rows of equal attention cost: what is left is the cost model's own gain),
    interleaved (``--train-rounds`` rounds of ``--train-steps`` steps). Optimizer steps/s,
    samples/s and tokens/s after the first ``TRAIN_WARMUP`` steps."""
    import tempfile

    from energon_platform.config import load_config
    from energon_platform.training.calibrate import calibrate_run, write_report
    from scripts.bench_data import skewed_captions_dataset

    with tempfile.TemporaryDirectory(prefix="bench-balance-train-measured-") as tmp:
        base = Path(tmp)
        data = skewed_captions_dataset(base, SKEW_TILE)
        setup = dict(model=TRAIN_TWO_TOWER, encoder=skewed_encoder(), batch=TRAIN_MEASURED_BATCH)
        configs = {b: _train_config(data, base, b, args, **setup) for b in ("none", "attention")}
        t = time.perf_counter()
        report = calibrate_run(
            load_config(str(configs["attention"])),
            micro_batches=args.calibrate_batches,
            repeats=3,
            progress=False,
        )
        print(f"  [calibrate: {time.perf_counter() - t:.1f} s]", file=sys.stderr)
        write_report(report, base / "cost.json")
        configs["measured"] = _train_config(
            data, base, "measured", args, cost=base / "cost.json", **setup
        )
        runs, load = _interleaved_runs(configs, base, args)
    variants = _variants(runs, {k: TRAIN_MEASURED_BATCH[k] for k in ("attention", "measured")})
    steps = variants["measured"]["steps_per_s"] / variants["none"]["steps_per_s"]
    return {
        "attention_ratio": variants["measured"]["steps_per_s"]
        / variants["attention"]["steps_per_s"],
        "model": TRAIN_TWO_TOWER,
        "data": SKEW_DATA,
        "global_batch_size": TRAIN_MEASURED_BATCH,
        "steps": args.train_steps,
        "warmup": TRAIN_WARMUP,
        "rounds": args.train_rounds,
        "calibration": {k: report[k] for k in CALIBRATION_KEYS},
        "load_during": load,
        "variants": variants,
        "ratio": steps,
        "tokens_ratio": variants["measured"]["tokens_per_s"] / variants["none"]["tokens_per_s"],
        "round_ratios": [
            b / a
            for a, b in zip(
                variants["none"]["rounds_steps_per_s"], variants["measured"]["rounds_steps_per_s"]
            )
        ],
        "targets": [
            {
                "target": f"2-rank two-tower steps/s measured/none >= {MEASURED_TRAIN_TARGET}",
                "value": steps,
                "met": steps >= MEASURED_TRAIN_TARGET,
            }
        ],
    }


def report_train_measured(section: dict, args) -> list[str]:
    c, m = section["calibration"], section["model"]
    lines = [
        f"two-tower model (dim {m['dim']}, {m['layers']} layers; vision tower "
        f"{m['vision_layers']} x {m['vision_dim']}, patches of {m['patch']} px) on 2 gloo ranks x "
        f"0 workers; data: {section['data']}; "
        f"{section['steps']} steps per run ({section['warmup']} warm-up skipped), "
        f"{section['rounds']} interleaved rounds",
        f"calibration on {c['micro_batches']} micro-batches of planned rows: R² {c['r2']:.3f}, "
        f"held-back p50 error {c['p50_error']:.1%}, p90 {c['p90_error']:.1%}; overhead "
        f"{1e3 * c['overhead']:.2f} ms per micro-batch ({c['overhead_share']:.0%} of the time)",
        "",
        f"{'variant':<16} {'global batch':>14} {'samples/step':>12} {'tokens/step':>11} "
        f"{'steps/s':>8} {'samples/s':>9} {'tokens/s':>9} {'steps/s per round':>20}",
    ]
    for name, v in section["variants"].items():
        gbs = section["global_batch_size"][name]
        gbs = f"{gbs} {'groups' if name == 'none' else 'rows'}"
        rounds = " ".join(f"{x:.2f}" for x in v["rounds_steps_per_s"])
        lines.append(
            f"{name:<16} {gbs:>14} {v['samples_per_step']:>12.2f} {v['tokens_per_step']:>11.0f} "
            f"{v['steps_per_s']:>8.2f} {v['samples_per_s']:>9.1f} {v['tokens_per_s']:>9.0f} "
            f"{rounds:>20}"
        )
    t = section["targets"][0]
    lines += [
        "",
        f"steps/s measured/none: {section['ratio']:.3f} (tokens/s: {section['tokens_ratio']:.3f}); "
        f"per round {' '.join(f'{x:.3f}' for x in section['round_ratios'])}; measured/attention "
        f"{section['attention_ratio']:.3f}; 1-minute load average around the runs "
        f"{' '.join(f'{x:.1f}' for x in section['load_during'])}",
        target_line(t, 45),
    ]
    return lines


#: ``calibrate --model`` of megatron-core's LLaVAModel (section ``llava``)
LLAVA_FACTORY = "energon_platform.integrations.megatron.llava:calibration_model"
#: the encoder the ``llava`` section calibrates on: the small vision-language encoder with 64-pixel
#: tiles (64 patches of 8 pixels each through the vision tower), 1-5 per image, rows of 512
LLAVA_ENCODER = REPO / "configs/encoders/image_text_vlm_small.yaml"
LLAVA_ENCODER_CHANGES = {"vision": {"image_size": 64}, "text": {"seq_len": 512}}
#: the ``llava`` section's vision tower (`tiny_llava`'s sizes): as in LLaVA-class models with a
#: large ViT, the tiles take a real share of a step's time (about half here). With the factory's
#: default (1 layer of 32) they take about 1% of it, and a fit has little but noise to explain.
LLAVA_VISION = {"vision_layers": 8, "vision_hidden": 256}


def llava_section(args) -> dict:
    """``llava``: ``calibrate`` of megatron-core's own ``LLaVAModel`` (``LLAVA_FACTORY``: a tiny
    model sized from the encoder, as Megatron's ``get_batch`` hands it the batches) on
    micro-batches of ``--llava-batch`` samples of the embedded COCO captions through the small
    vision-language encoder (``LLAVA_ENCODER`` with ``LLAVA_ENCODER_CHANGES``), converted into a
    temporary folder; the vision tower of ``LLAVA_VISION``; one thread, ``--calibrate-batches``
    micro-batches, the least of 3 rounds. Megatron's rows have a fixed length, so the language
    model's work is the same for every micro-batch and the tiles make the difference."""
    import functools
    import tempfile

    import torch
    import yaml

    from energon_platform.config import load_config
    from energon_platform.integrations.megatron.llava import calibration_model
    from energon_platform.training.calibrate import calibrate_run
    from scripts.bench_data import coco_dataset

    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="bench-balance-llava-") as tmp:
        base = Path(tmp)
        config = base / "run.yaml"
        loader = {"global_batch_size": args.llava_batch, "num_workers": 0, "seed": 1234}
        encoder = yaml.safe_load(LLAVA_ENCODER.read_text())
        for group, changes in LLAVA_ENCODER_CHANGES.items():
            encoder[group] = {**encoder[group], **changes}
        config.write_text(
            yaml.safe_dump(
                {
                    "data": {"path": str(coco_dataset(base)), "val_split": None},
                    "encoder": encoder,
                    "loader": loader,
                }
            )
        )
        torch.set_num_threads(1)
        t = time.perf_counter()
        try:
            report = calibrate_run(
                load_config(str(config)),
                functools.partial(calibration_model, **LLAVA_VISION),
                model_name=LLAVA_FACTORY,
                micro_batches=args.calibrate_batches,
                repeats=3,
                progress=False,
            )
        finally:
            torch.set_num_threads(threads)
        print(f"  [calibrate LLaVAModel: {time.perf_counter() - t:.1f} s]", file=sys.stderr)
    calibration = {k: report[k] for k in CALIBRATION_KEYS}
    return {
        "model": LLAVA_FACTORY,
        "encoder": str(LLAVA_ENCODER.relative_to(REPO)),
        "encoder_changes": LLAVA_ENCODER_CHANGES,
        "vision": LLAVA_VISION,
        "micro_batch_size": args.llava_batch,
        "calibration": calibration,
        "targets": calibration_targets(calibration, "LLaVAModel"),
    }


def report_llava(section: dict, args) -> list[str]:
    c = section["calibration"]
    lines = [
        f"llava: megatron-core LLaVAModel ({section['model']}, vision tower "
        f"{section['vision']}) on micro-batches of {section['micro_batch_size']} samples of the "
        f"embedded COCO captions, encoder {section['encoder']} with {section['encoder_changes']}",
        f"calibration on {c['micro_batches']} micro-batches: " + fit_summary(c),
    ]
    for t in section["targets"]:
        lines.append(target_line(t, 60))
    return lines


#: name → (run(args) → dict, report(section, args) → lines), run in this order when selected
#: (``--sections``; ``train`` takes minutes, so only when asked: ``--train``).
def long_section(args) -> dict:
    """``long``: the packed planner (attention, 8 ranks x ``--rows-per-rank``) over ``--long-steps``
    global batches of the skewed blend: the carried samples and the saved state stay bounded."""
    blend = Blend(args)
    cost = lambda n: sample_cost(n, "attention", args.linear)  # noqa: E731
    planner = Planner(
        blend.lookup,
        cost,
        TARGET_RANKS * args.rows_per_rank,
        capacity=args.seq_len,
        window=args.window,
    )
    carried, state_bytes, t = [], 0, time.perf_counter()
    for b in range(args.long_steps):
        state = planner.plan(b).next_state
        carried.append(len(state.carried))
        if b % 500 == 0 or b == args.long_steps - 1:
            state_bytes = max(state_bytes, len(json.dumps(state.to_json())))
    quarter = max(1, args.long_steps // 4)
    return {
        "steps": args.long_steps,
        "ranks": TARGET_RANKS,
        "rows_per_rank": args.rows_per_rank,
        "carried_max": max(carried),
        "carried_mean": float(np.mean(carried)),
        "carried_max_per_quarter": [
            max(carried[i : i + quarter]) for i in range(0, len(carried), quarter)
        ][:4],
        "state_bytes_max": state_bytes,
        "planner_ms_per_batch": 1000 * (time.perf_counter() - t) / args.long_steps,
    }


def report_long(section: dict, args) -> list[str]:
    return [
        f"long run: {section['steps']} global batches, packed attention, {section['ranks']} ranks x "
        f"{section['rows_per_rank']} rows: carried max {section['carried_max']} (mean {section['carried_mean']:.0f}; "
        f"max per quarter of the run {section['carried_max_per_quarter']}), state at most "
        f"{section['state_bytes_max']} B, {section['planner_ms_per_batch']:.2f} ms per global batch"
    ]


def demo_section(args) -> dict:
    """``demo``: the embedded demo blend (image-text 2 : audio 1 : text 1, converted into a temporary
    folder) through the real loader's planner, packed (``multimodal_packed``, global batch 8 rows)
    with ``balance: attention``, for several seeds: rank cost max/mean on 8 ranks, padding, carried
    samples, and samples placed twice in one global batch (must be 0)."""
    import tempfile

    sys.path.insert(0, str(REPO))
    from energon_platform import TrainLoader, load_config
    from energon_platform.loader.balance.dealing import deal_plan, rank_costs
    from scripts.bench_data import three_modality_blend

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        mds = three_modality_blend(Path(tmp))
        for seed in args.demo_seeds:
            cfg = load_config(
                {
                    "data": {"path": str(mds), "val_split": None},
                    "encoder": str(REPO / "configs/encoders/multimodal_packed.yaml"),
                    "loader": {
                        "global_batch_size": 8,
                        "micro_batch_size": 1,
                        "num_workers": 0,
                        "seed": seed,
                        "balance": "attention",
                        "length_cache": str(Path(tmp) / "lengths"),
                    },
                }
            )
            loader = TrainLoader(cfg, rank=0, world_size=8, num_workers=0)
            ratios, pads, carried, repeats = {2: [], 8: []}, [], [], 0
            for b in range(args.demo_steps):
                plan = loader.planner.plan(b)
                for world, share in ratios.items():
                    costs = rank_costs(plan, deal_plan(plan, world, 1, fixed=True))
                    share.append(max(costs) / (sum(costs) / len(costs)))
                pads.append(plan.padding)
                carried.append(len(plan.next_state.carried))
                ids = loader.planner.identities([p for row in plan.items for p in row])
                repeats += len(ids) - len(set(ids))
            out.append(
                {
                    "seed": seed,
                    "max_over_mean": {f"{w}_ranks": spread(r) for w, r in ratios.items()},
                    "padding_mean": float(np.mean(pads)),
                    "padding_max": float(max(pads)),
                    "carried_max": max(carried),
                    "repeats_in_a_batch": repeats,
                }
            )
    return {"steps": args.demo_steps, "seeds": out}


def report_demo(section: dict, args) -> list[str]:
    lines = [
        f"demo blend (embedded corpora 2:1:1, multimodal_packed, 8 rows of 128, attention), "
        f"{section['steps']} global batches per seed; rank cost max/mean on 2 ranks (4 rows each) and 8 (1 row):",
        f"{'seed':>5} {'2r p50':>7} {'2r p90':>7} {'8r p50':>7} {'8r p90':>7} {'padding mean':>12} "
        f"{'padding max':>11} {'carried':>7} {'repeats':>7}",
    ]
    for r in section["seeds"]:
        two, eight = r["max_over_mean"]["2_ranks"], r["max_over_mean"]["8_ranks"]
        lines.append(
            f"{r['seed']:>5} {two['p50']:>7.3f} {two['p90']:>7.3f} {eight['p50']:>7.3f} {eight['p90']:>7.3f} "
            f"{r['padding_mean']:>12.2%} {r['padding_max']:>11.2%} {r['carried_max']:>7} "
            f"{r['repeats_in_a_batch']:>7}"
        )
    return lines


# --- measured: the two-tower model's forward + backward on simulated ranks (--measured) -------

#: the methods the measured section plans with (``none``: today's consecutive samples)
MEASURED_METHODS = ("none", "tokens", "attention", "measured")
#: the tiny two-tower model the measured section times (positions are the bench's / --scale)
MEASURED_MODEL = dict(
    kind="two_tower",
    dim=64,
    layers=2,
    heads=4,
    patch=8,
    vision_dim=32,
    vision_layers=1,
    audio_dim=32,
    audio_layers=1,
)
VOCAB, N_MELS, TILE = 256, 16, 32


class Synthetic:
    """Synthetic two-tower batches of the bench's samples at ``1/scale`` of their positions: an
    image-text sample is one ``<image>`` placeholder (spliced into ``tiles x tokens_per_tile``
    embeddings) and its caption; an audio sample is its positions as tokens plus ``2 x`` its
    frames of log-mel through the audio tower (stride 2); a text sample its tokens."""

    def __init__(self, blend: Blend, args):
        self.blend, self.scale = blend, args.scale
        self.per_tile = max(1, args.tokens_per_tile // args.scale)
        self.seq_len = max(2, args.seq_len // args.scale)
        self.known: dict[int, tuple] = {}  # position -> `work`'s answer

    def doc(self, part: dict) -> dict:
        """One sample's scaled shape: ``kind``, ``tiles``, ``frames`` (mel), ``tokens`` (row
        positions before the splice) and ``length`` (after); of `Blend.parts` one part, or of
        `Blend.part_arrays` arrays of them (each value then an array)."""
        scalar = np.ndim(part["length"]) == 0
        kind = np.asarray(part["kind"])
        length = np.minimum(self.seq_len, np.maximum(2, np.round(part["length"] / self.scale)))
        length = length.astype(np.int64)
        image, audio = kind == KINDS.index("image_text"), kind == KINDS.index("audio")
        tiles = np.where(image, np.minimum(part["tiles"], (length - 1) // self.per_tile), 0)
        frames = np.where(
            audio, 2 * np.minimum(length, np.maximum(1, np.round(part["frames"] / self.scale))), 0
        ).astype(np.int64)
        tokens = length - tiles * self.per_tile + (tiles > 0)
        out = {"tiles": tiles, "frames": frames, "tokens": tokens, "length": length}
        return {k: int(v) for k, v in out.items()} if scalar else out

    @staticmethod
    def named(doc: dict) -> dict[str, int]:
        """One scaled sample's (`doc`) cost features, by name (those it has)."""
        return {
            "samples": 1,
            "llm_tokens": doc["length"],
            "llm_attention": doc["length"] ** 2,
            "vision_tiles": doc["tiles"],
            "audio_frames": doc["frames"],
        }

    def features(self, docs: list[dict], packed: bool) -> dict[str, float]:
        """The features of a micro-batch of ``docs`` as it runs (`micro_batch_features`): packed,
        its rows' documents at their own lengths; unpacked, every row padded to the longest
        sample and the clips to the longest clip, as `batch` lays them out."""
        from task_encoders.features import LONGEST, micro_batch_features

        return micro_batch_features((self.named(d) for d in docs), None if packed else LONGEST)

    def work(self, positions) -> list[tuple[int, tuple[float, ...]]]:
        """The planner's lookup for ``measured``, as the loader's (`SampleLengths`, which
        remembers what it looked up): per position its length and its sample's cost features
        (`named` of its `doc`) as a tuple in FEATURES order. Computed over the new positions at
        once, as `Blend.lookup` is for the other methods: the bench times the planner, not a
        lookup (an encoder's own costs what its `sample_length` and `sample_features` do)."""
        from task_encoders.features import FEATURES

        new = [p for p in positions if p not in self.known]
        if new:
            arrays = self.blend.part_arrays(new)
            named = self.named(self.doc(arrays))
            columns = [
                np.broadcast_to(np.asarray(named.get(name, 0), dtype=np.float64), len(new))
                for name in FEATURES
            ]
            for p, n, values in zip(
                new, arrays["length"].tolist(), zip(*(c.tolist() for c in columns))
            ):
                self.known[p] = (n, values)
        return [self.known[p] for p in positions]

    def batch(self, rows: list[list[int]], packed: bool):
        """The micro-batch of ``rows`` (stream positions per row): rows of ``seq_len`` (packed;
        longer where rounding the scaled lengths overfills one) or of the longest row (unpacked); carries its cost features as ``.cost_features``."""
        from types import SimpleNamespace

        import torch

        docs = [[self.doc(p) for p in self.blend.parts(row)] for row in rows]
        longest = max(sum(d["length"] for d in r) for r in docs)  # scaled lengths round up
        width = max(self.seq_len, longest) if packed else longest
        gen = torch.Generator().manual_seed(sum(map(sum, rows)))
        n = len(rows)
        tokens = torch.randint(1, VOCAB - 1, (n, width), generator=gen)
        position_ids = torch.zeros(n, width, dtype=torch.long)
        loss_mask = torch.zeros(n, width)
        frames = [d["frames"] for r in docs for d in r if d["frames"]]
        audio_docs = [i for i, d in enumerate(d for r in docs for d in r) if d["frames"]]
        for i, row in enumerate(docs):
            at = 0
            for d in row:
                if d["tiles"]:
                    tokens[i, at] = VOCAB - 1
                position_ids[i, at : at + d["tokens"]] = torch.arange(d["tokens"])
                loss_mask[i, at : at + d["tokens"]] = 1.0
                at += d["tokens"]
            position_ids[i, at:] = torch.arange(width - at) + (position_ids[i, at - 1] + 1)
        tiles = [d["tiles"] for r in docs for d in r if d["tiles"]]
        return SimpleNamespace(
            tokens=tokens,
            position_ids=position_ids,
            labels=torch.randint(1, VOCAB, (n, width), generator=gen),
            loss_mask=loss_mask,
            num_docs=torch.tensor([len(r) for r in docs], dtype=torch.int32),
            images=torch.randn(sum(tiles), 3, TILE, TILE, generator=gen),
            num_tiles=torch.tensor(tiles, dtype=torch.int32),
            tokens_per_tile=self.per_tile,
            image_token_index=VOCAB - 1,
            features=torch.randn(len(frames), N_MELS, max(frames, default=0), generator=gen),
            feature_lengths=torch.tensor(frames, dtype=torch.long),
            audio_docs=torch.tensor(audio_docs, dtype=torch.long),
            cost_features=self.features([d for r in docs for d in r], packed),
        )


def measured_model():
    import torch

    from energon_platform.config import ModelConfig
    from energon_platform.training.two_tower import TwoTowerModel

    torch.manual_seed(0)
    return TwoTowerModel(ModelConfig(**MEASURED_MODEL), VOCAB, 4096, ("image", "audio"), N_MELS)


def measured_calibration(model, args, packed: bool) -> dict:
    """:func:`~energon_platform.training.calibrate.calibrate` of ``model`` on micro-batches of a
    second stream of the blend (another seed), alternately one sample (`calibration_pool`) and
    one packed row of several: a pool of one-sample micro-batches only has ``samples`` = 1 in
    every micro-batch, so the fit cannot tell the cost of a document from the cost of a
    micro-batch and puts the latter on ``samples``; packed rows of many short documents then look
    far dearer than they run, and the plan evens document counts instead of time."""
    from energon_platform.training.calibrate import calibrate, paired
    from task_encoders.features import LONGEST

    other = Synthetic(Blend(args, seed=args.seed + 1), args)
    n = 8 * args.calibrate_batches
    pool = calibration_pool(other, n) if packed else unpacked_pool(other, n, args.rows_per_rank)
    return calibrate(
        model,
        paired(pool, lambda b: b.cost_features),
        micro_batches=args.calibrate_batches,
        repeats=3,
        progress=False,
        row_width=None if packed else LONGEST,
    )


def unpacked_pool(synth: Synthetic, n: int, k: int):
    """``n`` unpacked micro-batches of 1 to ``k`` samples of ``synth``'s stream, drawn at random
    (seeded) from its first ``64 n`` positions, so padding, tiles, clips and tower calls vary
    across them as they do across a plan's micro-batches (what the unpacked cost model is
    fitted on: the micro-batch as it runs)."""
    rng = np.random.default_rng(0)
    for i in range(n):
        picked = rng.choice(64 * n, size=1 + i % k, replace=False)
        yield synth.batch([[int(p)] for p in sorted(picked)], packed=False)


#: a calibration row is filled from the stream until this fraction of its positions is used
CALIBRATION_ROW_FILL = 0.97
#: ... or until it has looked this many stream positions ahead for documents that fit
CALIBRATION_ROW_SCAN = 64


def calibration_pool(synth: Synthetic, n: int):
    """``n`` micro-batches of ``synth``'s stream, in order: even ones one sample (unpacked), odd
    ones one packed row of the next documents that fit it (skipping those that do not) until it
    is `CALIBRATION_ROW_FILL` full, as the planner's rows are; so both the per-document and the
    per-micro-batch cost vary across the pool."""
    position = 0
    for i in range(n):
        if i % 2 == 0:
            yield synth.batch([[position]], packed=False)
            position += 1
            continue
        row, used, scan = [], 0, position
        while (
            used < CALIBRATION_ROW_FILL * synth.seq_len and scan < position + CALIBRATION_ROW_SCAN
        ):
            length = synth.doc(synth.blend.parts([scan])[0])["length"]
            if used + length <= synth.seq_len:
                row.append(scan)
                used += length
            scan += 1
        position = scan
        yield synth.batch([row], packed=True)


def measured_plans(
    blend: Blend, method: str, cost_model, ranks: int, k: int, packed: bool, steps: int, args
):
    """``(steps of [rank][row] -> positions, planning seconds of each global batch)`` of
    ``method`` for ``steps`` global batches (no planning seconds for ``none``; the first batch's
    also fills the planner's window)."""
    from energon_platform.loader.balance.costs import SampleCost

    if method == "none":
        batches = []
        for s in range(steps):
            if not packed:
                base = s * ranks * k
                batches.append([[[base + r * k + i] for i in range(k)] for r in range(ranks)])
                continue
            group, base, step = args.pack_group, s * ranks * k * args.pack_group, []
            for r in range(ranks):
                rows = []
                for g in range(k):
                    pos = list(range(base + (r * k + g) * group, base + (r * k + g + 1) * group))
                    rows += [
                        [pos[i] for i in row] for row in ffd(blend[pos].tolist(), pos, args.seq_len)
                    ]
                step.append(rows)
            batches.append(step)
        return batches, []
    if method == "measured":  # the loader's own cost path: feature tuples, SampleCost
        lookup = Synthetic(blend, args).work
        cost = SampleCost("measured", None, 0.0, "bench", cost_model)
    else:
        lookup, cost = blend.lookup, lambda n, m=method: sample_cost(n, m, args.linear)  # noqa: E731
    planner = Planner(
        lookup,
        cost,
        ranks * k,
        capacity=args.seq_len if packed else 0,
        window=args.window,
        like_lengths=plans_like_lengths(method, fixed_samples=not packed),
    )
    batches, seconds = [], []
    for b in range(steps):
        t = time.perf_counter()
        plan = planner.plan(b)
        seconds.append(time.perf_counter() - t)
        dealt = deal_plan(plan, ranks, 1, fixed=True)
        batches.append([[list(plan.items[i]) for m in rank for i in m] for rank in dealt])
    return batches, seconds


def planning_ms(seconds: list[float], rows: int) -> dict:
    """The planner's milliseconds: the first global batch (it also fills the look-ahead window,
    once per process) and the mean of the later ones, per batch and per 64 rows (``rows`` per
    batch); empty for a method that does not plan."""
    if not seconds:
        return {}
    later = float(np.mean(seconds[1:] or seconds))
    return {
        "planner_ms_first_batch": 1000 * seconds[0],
        "planner_ms_per_batch": 1000 * later,
        "planner_ms_per_64_rows": 1000 * later * 64 / rows,
    }


def measured_section(args) -> dict:
    """``measured``: calibrate the two-tower model, then time every rank's micro-batch of each
    method's plans (each alone, the least of 3 after a warm-up, one thread)."""
    import torch

    from energon_platform.loader.balance.cost_file import CostModel
    from task_encoders.features import MICRO_BATCH_FEATURES

    if args.pack_group is None:
        args.pack_group = max(
            2,
            int(
                round(
                    args.seq_len / float(Blend(args).draw(np.random.default_rng(0), 20_000).mean())
                )
            ),
        )
    blend, threads = Blend(args), torch.get_num_threads()
    synth, model = Synthetic(blend, args), measured_model()
    torch.set_num_threads(1)
    try:
        reports = {packed: measured_calibration(model, args, packed) for packed in (True, False)}
        cost_models = {
            packed: CostModel(
                {n: r["coefficients"][n] for n in MICRO_BATCH_FEATURES},
                "two_tower",
                "",
                r["row_width"],
            )
            for packed, r in reports.items()
        }
        results = []
        for ranks in args.measured_ranks:
            for packed in (True, False):
                plans = {}
                # `timed`'s reference (paired): the first rank's micro-batch of today's first batch
                reference = None
                if args.timing == "paired":
                    first = measured_plans(
                        blend, "none", None, ranks, args.rows_per_rank, packed, 1, args
                    )
                    reference = synth.batch(first[0][0][0], packed)
                for method in MEASURED_METHODS:
                    t = time.perf_counter()
                    plans[method] = steps, plan_s = measured_plans(
                        blend,
                        method,
                        cost_models[packed],
                        ranks,
                        args.rows_per_rank,
                        packed,
                        args.measured_steps,
                        args,
                    )
                    ratios, predicted = [], []
                    for step in steps:
                        batches = [synth.batch(rows, packed) for rows in step]
                        seconds = timed(model, batches, reference, args.timing)
                        ratios.append(float(seconds.max() / seconds.mean()))
                        predicted.append(
                            predicted_ratio(
                                batches, cost_models[packed], reports[packed]["overhead"]
                            )
                        )
                    results.append(
                        {
                            "ranks": ranks,
                            "per_rank": args.rows_per_rank,
                            "layout": "packed" if packed else "unpacked",
                            "method": method,
                            "max_over_mean": spread(ratios),
                            "predicted_max_over_mean": spread(predicted),
                            **planning_ms(plan_s, ranks * args.rows_per_rank),
                        }
                    )
                    print(
                        f"  [measured {method}, {ranks} ranks: {time.perf_counter() - t:.1f} s]",
                        file=sys.stderr,
                    )
                floor = timing_floor(
                    model, synth, plans["measured"][0], packed, reference, args.timing
                )
                results.append(
                    {
                        "ranks": ranks,
                        "per_rank": args.rows_per_rank,
                        "layout": "packed" if packed else "unpacked",
                        "method": IDENTICAL,
                        "max_over_mean": spread(floor),
                    }
                )
        planning = planning_64_rows(blend, cost_models, args)
    finally:
        torch.set_num_threads(threads)
    calibration = {k: reports[True][k] for k in CALIBRATION_KEYS}
    unpacked = {k: reports[False][k] for k in (*CALIBRATION_KEYS, "row_width")}
    return {
        "scale": args.scale,
        "steps": args.measured_steps,
        "timing": args.timing,
        "model": MEASURED_MODEL,
        "calibration": calibration,
        "calibration_unpacked": unpacked,
        "results": results,
        "planning_64_rows": planning,
        "targets": measured_targets(calibration, results, planning, args.timing, unpacked),
    }


def predicted_ratio(batches: list, cost_model, overhead: float) -> float:
    """max/mean over one step's micro-batches of the seconds ``cost_model`` predicts for each
    (`CostModel.predict` of its features as it runs) plus ``overhead``: how even the plan is by
    the cost model, without the timing's noise."""
    predicted = np.array([cost_model.predict(b.cost_features) + overhead for b in batches])
    return float(predicted.max() / predicted.mean())


#: ``--timing``: how the measured section times micro-batches (`timed`)
TIMINGS = ("plain", "paired")


def timed(model, batches: list, reference, timing: str) -> np.ndarray:
    """Seconds per micro-batch of ``batches``, each timed alone (forward + backward, one warm-up
    round, the least of 3 rounds). ``plain``: `time_rounds`, what the targets are stated on.
    ``paired``: each timing sits between two timings of ``reference`` and is divided by their mean,
    and the least ratio is multiplied by the reference's least time. Consecutive timings of equal
    work on a shared machine correlate (it drifts over a few timings), so a slow stretch hits a
    micro-batch and the reference around it alike and divides out, which the least of 3 alone does
    not; what is left of a spread is then mostly the micro-batches' own. Twice the timings."""
    from energon_platform.training import collector
    from energon_platform.training.calibrate import time_rounds, time_step

    if timing == "plain":
        return time_rounds(model, batches, 3)
    best, fastest = np.full(len(batches), np.inf), np.inf
    with collector.off():
        before = time_step(model, reference)
        for round_ in range(3 + 1):
            for i, batch in enumerate(batches):
                seconds, after = time_step(model, batch), time_step(model, reference)
                if round_:
                    best[i] = min(best[i], 2 * seconds / (before + after))
                    fastest = min(fastest, after)
                before = after
    return best * fastest


#: the measured section's timing floor (`timing_floor`), reported beside the methods
IDENTICAL = "identical"


def timing_floor(
    model, synth: Synthetic, steps: list, packed: bool, reference, timing: str
) -> list[float]:
    """Per global batch of ``steps``, max/mean of the times of its first rank's micro-batch timed
    once for every rank, as the methods' micro-batches are (`timed`): the ranks' work is equal,
    so what is left is the timing's own spread on this machine, the floor under any method's
    figure."""
    ratios = []
    for step in steps:
        seconds = timed(model, [synth.batch(step[0], packed)] * len(step), reference, timing)
        ratios.append(float(seconds.max() / seconds.mean()))
    return ratios


#: global batches the planning measurement plans per method and layout (the first one not counted)
PLANNING_BATCHES = 50


#: times the planning measurement plans each method's batches afresh; each batch's least time counts
PLANNING_REPEATS = 3


def planning_64_rows(blend: Blend, cost_models: dict, args) -> list[dict]:
    """The planner alone on global batches of 64 rows (32 ranks x 2), per layout and method:
    `planning_ms` over `PLANNING_BATCHES` batches (no model is timed), each batch's least time
    of `PLANNING_REPEATS` plannings from the start (a fresh planner and lookup each time), as the
    micro-batches' timings are the least of 3: the plans are the same, so what varies between the
    repeats is this machine. ``cost_models``: the measured cost model of each layout (``packed``
    True or False)."""
    out = []
    for packed in (True, False):
        for method in MEASURED_METHODS[1:]:
            seconds = np.min(
                [
                    measured_plans(
                        blend, method, cost_models[packed], 32, 2, packed, PLANNING_BATCHES, args
                    )[1]
                    for _ in range(PLANNING_REPEATS)
                ],
                axis=0,
            ).tolist()
            out.append(
                {
                    "layout": "packed" if packed else "unpacked",
                    "method": method,
                    **planning_ms(seconds, 64),
                }
            )
    return out


#: the measured section's targets: p90 max/mean of the timed ranks by rank count, the calibration's
#: fit, the planner's steady milliseconds per 64 rows
MEASURED_TARGETS = {"ratio": {8: 1.05, 64: 1.08}, "r2": 0.95, "p90_error": 0.10, "plan_ms": 10.0}


def fit_summary(c: dict) -> str:
    """A calibration (`CALIBRATION_KEYS`) in one line: R², the held-back errors, each feature's
    share of the time and the overhead."""
    shares = ", ".join(f"{k} {v:.0%}" for k, v in c["share"].items() if v > 0.005)
    return (
        f"R² {c['r2']:.3f}, held-back p50 error {c['p50_error']:.1%}, p90 {c['p90_error']:.1%}; "
        f"share {shares}; overhead {1e3 * c['overhead']:.2f} ms per micro-batch "
        f"({c['overhead_share']:.0%})"
    )


def calibration_targets(calibration: dict, model: str = "") -> list[dict]:
    """The calibration's R² and held-back p90 error against `MEASURED_TARGETS` (``model``: named
    in the target, when there are several)."""
    of = f" ({model})" if model else ""
    return [
        {
            "target": f"calibration{of} R² >= {MEASURED_TARGETS['r2']}",
            "value": calibration["r2"],
            "met": calibration["r2"] >= MEASURED_TARGETS["r2"],
        },
        {
            "target": f"calibration{of} held-back p90 error <= {MEASURED_TARGETS['p90_error']:.0%}",
            "value": calibration["p90_error"],
            "met": calibration["p90_error"] <= MEASURED_TARGETS["p90_error"],
        },
    ]


def measured_targets(
    calibration: dict,
    results: list[dict],
    planning: list[dict],
    timing: str = "plain",
    unpacked: dict | None = None,
) -> list[dict]:
    """Each `MEASURED_TARGETS` entry judged on this run (``measured`` rows only). The max/mean
    targets are stated on plain timing (`timed`): a ``paired`` run is not judged on them.
    ``unpacked``: the unpacked layout's own calibration, judged as well, where there is one."""
    out = calibration_targets(calibration)
    if unpacked is not None:
        out += calibration_targets(unpacked, "unpacked micro-batches")
    for r in results:
        limit = MEASURED_TARGETS["ratio"].get(r["ranks"])
        if r["method"] != "measured" or timing != "plain":
            continue
        if limit is not None:
            p90 = r["max_over_mean"]["p90"]
            out.append(
                {
                    "target": f"measured p90 max/mean, {r['ranks']} ranks, {r['layout']} <= {limit}",
                    "value": p90,
                    "met": p90 <= limit,
                }
            )
    for r in planning:
        if r["method"] == "measured":
            ms = r["planner_ms_per_batch"]
            out.append(
                {
                    "target": f"measured plans a global batch of 64 rows, {r['layout']}, in "
                    f"<= {MEASURED_TARGETS['plan_ms']:g} ms",
                    "value": ms,
                    "met": ms <= MEASURED_TARGETS["plan_ms"],
                }
            )
    return out


def report_measured(section: dict, args) -> list[str]:
    c = section["calibration"]
    lines = [
        f"measured: the two-tower model ({section['model']['dim']}-wide, positions / {section['scale']}), "
        f"{section['steps']} global batches per method; each rank's micro-batch timed alone "
        "(forward + backward, the least of 3 after a warm-up, one thread"
        + (
            "; paired: divided by a reference micro-batch timed around it, so not judged on "
            "the max/mean targets)"
            if section.get("timing") == "paired"
            else ")"
        ),
        f"calibration on {c['micro_batches']} micro-batches of another stream (one sample or "
        "one packed row): " + fit_summary(c),
        *(
            [
                f"unpacked: calibration on {u['micro_batches']} micro-batches of 1 to "
                f"{args.rows_per_rank} random samples of it, rows padded to the longest: "
                + fit_summary(u)
            ]
            if (u := section.get("calibration_unpacked"))
            else []
        ),
        "",
        f"{'ranks':>5} {'layout':<8} {'method':<10} {'p50':>6} {'p90':>6} {'max':>6} "
        f"{'predicted p90':>13} {'plan ms/64 rows':>15} {'first batch ms':>14}",
    ]
    for r in section["results"]:
        m = r["max_over_mean"]
        predicted = r.get("predicted_max_over_mean")
        predicted = f"{predicted['p90']:>13.3f}" if predicted else f"{'-':>13}"
        plan = (
            f"{r['planner_ms_per_64_rows']:>15.2f} {r['planner_ms_first_batch']:>14.1f}"
            if r["method"] not in ("none", IDENTICAL)
            else f"{'-':>15} {'-':>14}"
        )
        lines.append(
            f"{r['ranks']:>5} {r['layout']:<8} {r['method']:<10} {m['p50']:>6.3f} {m['p90']:>6.3f} "
            f"{m['max']:>6.3f} {predicted} {plan}"
        )
    lines.append(
        "(predicted p90: the same max/mean of the times the calibration predicts for the "
        "micro-batches, how even a plan is by the cost model without the timing's noise. "
        "plan ms: the mean over the global batches after the first; the first also fills the "
        f"planner's look-ahead window, once per process. {IDENTICAL}: one rank's micro-batch "
        "timed for every rank, equal work, so the timing's own spread)"
    )
    lines.append(
        "planning alone, global batches of 64 rows (32 ranks x 2), ms per batch "
        f"(each batch the least of {PLANNING_REPEATS} plannings):"
    )
    for r in section.get("planning_64_rows", []):
        lines.append(
            f"  {r['layout']:<8} {r['method']:<10} {r['planner_ms_per_batch']:>7.2f} "
            f"(first {r['planner_ms_first_batch']:.1f})"
        )
    for t in section.get("targets", []):
        lines.append(target_line(t, 60))
    return lines


SECTIONS = {
    "balance": (balance_section, report_balance),
    "long": (long_section, report_long),
    "demo": (demo_section, report_demo),
    "train": (train_section, report_train),
    "measured": (measured_section, report_measured),
    "train-measured": (train_measured_section, report_train_measured),
    "llava": (llava_section, report_llava),
    "sizes": (lambda args: sizes_section(args, Blend), report_sizes),
}


def weights(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in KINDS or not value:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected KIND=WEIGHT with KIND one of {', '.join(KINDS)}"
            )
        out[name.strip()] = float(value)
    if any(v < 0 for v in out.values()) or sum(out.values()) <= 0:
        raise argparse.ArgumentTypeError("weights must be >= 0 with a positive sum")
    return {k: out.get(k, 0.0) for k in KINDS}


def build_parser() -> argparse.ArgumentParser:
    """The command line: its options and their defaults (`main` completes those left None)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--json", type=Path, help="also write the results (with machine, date, load average) here"
    )
    p.add_argument("--quick", action="store_true", help="a few seconds: 40 steps, 8 ranks only")
    p.add_argument(
        "--sizes-steps",
        type=int,
        default=None,
        help="section sizes: global batches per case (default 200; --quick 40)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="global batches per variant (default 500; --quick 40)",
    )
    p.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=None,
        help="simulated data-parallel ranks (default 8 64)",
    )
    p.add_argument(
        "--rows-per-rank",
        type=int,
        default=2,
        help="K: rows (packed) or samples (unpacked) per rank",
    )
    p.add_argument(
        "--seq-len", type=int, default=4096, help="row length; every sample is clipped to it"
    )
    p.add_argument(
        "--linear",
        type=float,
        default=None,
        help="c of the attention cost L^2 + c*L (default seq_len)",
    )
    p.add_argument(
        "--weights",
        type=weights,
        default=weights("image_text=0.4,audio=0.2,text=0.4"),
        help="blend weights, KIND=W,... over image_text, audio, text (default 0.4, 0.2, 0.4)",
    )
    p.add_argument(
        "--tokens-per-tile",
        type=int,
        default=64,
        help="image tokens per tile (1-12 tiles per image)",
    )
    p.add_argument(
        "--audio-fps",
        type=float,
        default=25.0,
        help="audio frames per second (25: a 100 Hz mel spectrogram subsampled 4x)",
    )
    p.add_argument(
        "--caption-mu", type=float, default=3.5, help="log-mean of caption/transcript tokens"
    )
    p.add_argument(
        "--caption-sigma", type=float, default=0.8, help="log-sd of caption/transcript tokens"
    )
    p.add_argument("--text-mu", type=float, default=5.5, help="log-mean of text document tokens")
    p.add_argument("--text-sigma", type=float, default=1.2, help="log-sd of text document tokens")
    p.add_argument(
        "--pack-group",
        type=int,
        default=None,
        help="today's pack group (samples packed together); default: seq_len / mean length, so K "
        "groups fill about K rows",
    )
    p.add_argument(
        "--packing-buffer-size",
        type=int,
        default=None,
        help="Energon's packing_buffer_size (default: the pack group, i.e. the same setting)",
    )
    p.add_argument(
        "--window", type=int, default=4096, help="our planner's look-ahead (loader.balance.window)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--sections",
        nargs="+",
        choices=list(SECTIONS),
        default=["balance"],
        help="what to measure (default: balance, the simulation; long: carried samples over "
        "--long-steps batches; demo: the embedded demo blend through the loader's planner; train: "
        "the reference model's tokens/s on 2 gloo ranks; measured: the two-tower model's timed "
        "micro-batches per method; train-measured: the two-tower model's steps/s on 2 gloo "
        "ranks, balance none against measured, after calibrating it; sizes: the planner on every "
        "dataset size, g to 10 x window, single and blended with a large one, packed and "
        "unpacked, attention and measured)",
    )
    p.add_argument(
        "--long-steps",
        type=int,
        default=10_000,
        help="section long: global batches of one planner run",
    )
    p.add_argument(
        "--demo-steps", type=int, default=60, help="section demo: global batches per seed"
    )
    p.add_argument(
        "--demo-seeds", type=int, nargs="+", default=[1, 5, 7, 8], help="section demo: loader seeds"
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="also measure the reference model's tokens/s on 2 gloo ranks, today vs ours (minutes)",
    )
    p.add_argument(
        "--train-steps",
        type=int,
        default=40,
        help="steps per training run (the first 2 are warm-up)",
    )
    p.add_argument(
        "--train-rounds", type=int, default=3, help="interleaved rounds of (today, ours) runs"
    )
    p.add_argument(
        "--train-groups",
        type=int,
        default=4,
        help="today's global_batch_size: pack groups of 16 samples per step (about 4 rows each)",
    )
    p.add_argument(
        "--train-rows", type=int, default=16, help="ours: global_batch_size in rows of 128 tokens"
    )
    p.add_argument("--train-dim", type=int, default=128, help="the reference model's model.dim")
    p.add_argument("--train-layers", type=int, default=2, help="the reference model's model.layers")
    p.add_argument(
        "--measured",
        action="store_true",
        help="also calibrate the two-tower model and time each rank's micro-batches per method "
        "(minutes; --quick about one)",
    )
    p.add_argument(
        "--scale",
        type=int,
        default=8,
        help="section measured: positions are the blend's / this (default 8: micro-batches of "
        "tens of milliseconds, whose timing spreads less than at 16)",
    )
    p.add_argument(
        "--timing",
        choices=TIMINGS,
        default="plain",
        help="section measured: plain (each micro-batch alone, the least of 3 rounds: what the "
        "targets are stated on) or paired (each timing also divided by two timings of a fixed "
        "reference micro-batch around it, which divides out the machine's slow drift and shows "
        "how much of a spread is the micro-batches' own; twice the time, not judged on the "
        "targets)",
    )
    p.add_argument(
        "--measured-steps",
        type=int,
        default=None,
        help="section measured: global batches per method (default 12; --quick 3)",
    )
    p.add_argument(
        "--measured-ranks",
        type=int,
        nargs="+",
        default=None,
        help="section measured: simulated ranks (default 8 64; --quick 8)",
    )
    p.add_argument(
        "--calibrate-batches",
        type=int,
        default=None,
        help="sections measured, train-measured and llava: micro-batches calibrate times, "
        "a quarter of them held back to measure its error (default 96, so the held-back p90 is "
        "not the second-worst of a dozen; --quick 24)",
    )
    p.add_argument(
        "--llava-batch",
        type=int,
        default=2,
        help="section llava: samples per micro-batch LLaVAModel is timed on (default 2)",
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target is not met")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.steps = args.steps or (40 if args.quick else 500)
    args.ranks = args.ranks or ([8] if args.quick else [8, 64])
    args.linear = float(args.seq_len if args.linear is None else args.linear)
    if min(args.steps, args.rows_per_rank, args.seq_len, *args.ranks) < 1 or args.window < 16:
        print(
            "error: --steps, --ranks, --rows-per-rank, --seq-len must be >= 1 and --window >= 16",
            file=sys.stderr,
        )
        return 2
    if args.train and "train" not in args.sections:
        args.sections.append("train")
    if args.measured and "measured" not in args.sections:
        args.sections.append("measured")
    args.measured_steps = args.measured_steps or (3 if args.quick else 12)
    args.measured_ranks = args.measured_ranks or ([8] if args.quick else [8, 64])
    args.calibrate_batches = args.calibrate_batches or (24 if args.quick else 96)
    if (
        min(
            args.scale,
            args.measured_steps,
            args.calibrate_batches - 3,
            args.llava_batch,
            *args.measured_ranks,
        )
        < 1
    ):
        print(
            "error: --scale, --measured-steps, --measured-ranks, --llava-batch must be >= 1 and "
            "--calibrate-batches >= 4",
            file=sys.stderr,
        )
        return 2
    if (
        min(
            args.train_steps - TRAIN_WARMUP,
            args.train_rounds,
            args.train_groups - 1,
            args.train_rows - 1,
            args.train_dim,
            args.train_layers,
        )
        < 1
        or args.train_groups % 2
        or args.train_rows % 2
    ):
        print(
            f"error: --train-steps must be > {TRAIN_WARMUP}, --train-groups and --train-rows even (2 ranks), "
            "the other --train-* >= 1",
            file=sys.stderr,
        )
        return 2
    for name in ("pack_group", "packing_buffer_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2

    result = {
        **run_record(),
    }
    t = time.perf_counter()
    lines = []
    for name, (run, report) in SECTIONS.items():
        if name not in args.sections:
            continue
        try:
            result[name] = run(args)
        except TrainFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        lines += report(result[name], args) + [""]
    result["seconds"] = time.perf_counter() - t
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["settings"] = {k: v for k, v in vars(args).items() if k not in ("json", "check")}
    print(
        f"{result['date']}, {result['machine']['cpus']} CPUs, load average before/after: "
        f"{result['load_before']} / {result['load_after']}, {result['seconds']:.1f} s\n"
    )
    print("\n".join(lines).rstrip())
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    missed = [
        t
        for s in result.values()
        if isinstance(s, dict)
        for t in s.get("targets", [])
        if not t["met"]
    ]
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
