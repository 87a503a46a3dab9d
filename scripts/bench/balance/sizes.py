"""The ``sizes`` section: the planner on every dataset size.

For a global batch of g = R x K samples or rows (R ranks x K, ``--ranks``, ``--rows-per-rank``)
and dataset sizes N = g, 2g, 5g, 10g, 40g, window/2, window and 10 x window (``--window``): one
dataset of N samples (sample i is the i-th of the bench's synthetic blend: image-text, audio and
text lengths), and a blend of a large dataset (10 x window samples) with that one at 4:1. Each
planned for ``--sizes-steps`` global batches (default 200), unpacked and packed, with the
``attention`` cost and a ``measured`` one (`MEASURED`: a fixed cost model over the samples' cost
features, vision tiles dear; unpacked it plans samples of like row length, as the loader does).

Per case: the p90 over steps of the ranks' max/mean cost (``deal_plan`` as the loader deals),
the p90 of the batches' lower bound (`plan_bound`: no dealing of that batch's samples or rows
does better), the p90 of ours / bound per step, the steps whose costliest item exceeds a rank's
fair share (*outlier-anchored*: no dealing reaches 1.0), samples twice in one global batch,
samples placed while their dataset's previous epoch was still unfinished (*early*: placed in a
batch before the last one holding the previous epoch), the planner's milliseconds per global
batch and per 64 rows, and the largest state (carried positions and JSON bytes). Beside it,
``none``: the same datasets as consecutive stream positions (today), unpacked only. Targets: for
N >= 10g, p90 max/mean <= 1.05 (8 ranks) and <= 1.08 (64 ranks); ours / bound at p90 <= 1.03;
0 samples twice; 0 early; planning <= 10 ms per 64 rows (judged where a batch has 64 rows or
more). The balance targets are judged on ``attention`` over the steps that are not outlier-anchored
(counted apart, as the issue asks); ``measured`` plans like row lengths, not like costs, and is
reported beside them.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict

import numpy as np

from energon_platform.loader.balance.cost_file import CostModel
from energon_platform.loader.balance.costs import SampleCost
from energon_platform.loader.balance.dealing import (
    deal_plan,
    outlier_anchored,
    plan_bound,
    rank_costs,
)
from energon_platform.loader.balance.packer import sample_cost
from energon_platform.loader.balance.planner import Planner
from energon_platform.loader.blend import Blend as Weights
from energon_platform.loader.blend import Segment
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.permutation import derive_key
from energon_platform.loader.schedule import Schedule
from task_encoders.features import FEATURES

#: the ``measured`` cost model: seconds per unit of each cost feature (vision tiles dear, so a
#: sample's cost is not a function of its row length)
MEASURED = {
    **dict.fromkeys(FEATURES, 0.0),
    "samples": 2e-4,
    "llm_tokens": 1e-5,
    "llm_attention": 2e-9,
    "vision_tiles": 6.4e-4,
    "audio_frames": 5e-6,
}
SIZES = ("g", "2g", "5g", "10g", "40g", "window/2", "window", "10window")
#: targets: p90 max/mean for N >= 10g by ranks (else the 64-rank one), ours/bound, ms per 64 rows
TARGET = {8: 1.05, 64: 1.08}
TARGET_OVER_BOUND, TARGET_MS = 1.03, 10.0


def size_of(name: str, g: int, window: int) -> int:
    """N of a size name (`SIZES`)."""
    return {
        "g": g,
        "2g": 2 * g,
        "5g": 5 * g,
        "10g": 10 * g,
        "40g": 40 * g,
        "window/2": window // 2,
        "window": window,
        "10window": 10 * window,
    }[name]


class Datasets:
    """The planner's view of one dataset of ``n`` samples, or of a large one and it blended 4:1:
    ``lengths`` and ``copies`` of stream positions (sample i of a dataset: the blend's position
    ``i`` of stream ``d``)."""

    def __init__(self, blend, sizes: list[int], seed: int, g: int, measured: bool):
        self.blend, self.sizes, self.measured = blend, sizes, measured
        weights = Weights([Segment(0, ("4", "1"))], 2) if len(sizes) == 2 else Weights.single()
        orders = tuple(DatasetOrder(n, derive_key(seed, d)) for d, n in enumerate(sizes))
        self.schedule = Schedule(orders, g, 1, weights)

    def copies(self, positions) -> list[tuple[int, int, int]]:
        return self.schedule.copies(positions)

    def lengths(self, positions) -> list[tuple]:
        return self.of_copies(self.copies(positions))

    def of_copies(self, copies: list[tuple[int, int, int]]) -> list[tuple]:
        if not copies:
            return []
        d, _, i = (np.array(x, dtype=np.int64) for x in zip(*copies))
        at = i + d * (1 << 40)  # dataset d's sample i: position i of the blend's stream d
        parts = self.blend.part_arrays(at)
        length = parts["length"].tolist()
        if not self.measured:
            return [(n, n) for n in length]
        image, audio = parts["kind"] == 0, parts["kind"] == 1
        tiles = np.where(image, parts["tiles"], 0).tolist()
        frames = np.where(audio, parts["frames"], 0).tolist()
        return [
            (n, _features(n, t, f)) for n, t, f in zip(length, tiles, frames)
        ]  # fmt: skip


def _features(length: int, tiles: int, frames: int) -> tuple[float, ...]:
    named = {
        "samples": 1,
        "llm_tokens": length,
        "llm_attention": length * length,
        "vision_tiles": tiles,
        "audio_frames": frames,
    }
    return tuple(float(named.get(name, 0)) for name in FEATURES)


def _planner(data: Datasets, cost_name: str, g: int, packed: bool, args) -> Planner:
    if cost_name == "measured":
        cost = SampleCost("measured", None, 0.0, "bench", CostModel(MEASURED, "bench", "sizes"))
    else:
        cost = lambda n: sample_cost(n, "attention", args.linear)  # noqa: E731
    return Planner(
        data.lengths,
        cost,
        g,
        capacity=args.seq_len if packed else 0,
        window=args.window,
        like_lengths=cost_name == "measured" and not packed,
        samples=data.copies,
    )


def run_case(data: Datasets, planner: Planner, ranks: int, steps: int) -> dict:
    """Plan ``steps`` global batches; the section's figures of them (module doc)."""
    ratios, bounds, over, outliers, twice, seconds, carried, state = [], [], [], [], 0, [], 0, 0
    batches_of = defaultdict(list)  # (dataset, epoch) -> the batches placing its copies
    for b in range(steps):
        t = time.perf_counter()
        plan = planner.plan(b)
        seconds.append(time.perf_counter() - t)
        copies = data.copies([p for item in plan.items for p in item])
        twice += len(copies) - len({(d, i) for d, _, i in copies})
        for d, e, _ in copies:
            batches_of[d, e].append(b)
        costs = rank_costs(plan, deal_plan(plan, ranks, 1, fixed=True))
        ratio = max(costs) / (sum(costs) / ranks)
        bound = plan_bound(plan, ranks, fixed=True)
        ratios.append(ratio)
        bounds.append(bound)
        over.append(ratio / bound)
        outliers.append(outlier_anchored(plan, ranks))
        carried = max(carried, len(plan.next_state.carried))
        state = max(state, len(json.dumps(plan.next_state.to_json())))
    early = 0
    for (d, e), at in batches_of.items():
        last = max(batches_of.get((d, e - 1), [-1]))
        early += sum(1 for b in at if b < last)
    later = seconds[1:] or seconds
    rows = planner.items_per_batch
    return {
        "max_over_mean_p90": float(np.percentile(ratios, 90)),
        "bound_p90": float(np.percentile(bounds, 90)),
        "over_bound_p90": float(np.percentile(over, 90)),
        "outlier_anchored_steps": sum(outliers),
        # the steps whose batch no dealing can balance (module doc) stated apart, not in the p90
        "max_over_mean_p90_not_anchored": float(
            np.percentile([r for r, o in zip(ratios, outliers) if not o] or [1.0], 90)
        ),
        "twice_in_a_batch": twice,
        "early": early,
        "epochs_done": max((e for _, e in batches_of), default=0),
        "planner_ms_per_batch": 1000 * float(np.mean(later)),
        "planner_ms_per_64_rows": 1000 * float(np.mean(later)) * 64 / rows,
        "carried_max": carried,
        "state_bytes_max": state,
    }


def run_none(data: Datasets, cost_name: str, ranks: int, k: int, steps: int, args) -> float:
    """Today's p90 max/mean: consecutive stream positions, K per rank (unpacked)."""
    planner = _planner(data, cost_name, ranks * k, False, args)
    ratios = []
    for b in range(steps):
        lengths = data.lengths(list(range(b * ranks * k, (b + 1) * ranks * k)))
        c = [planner.cost(w) for _, w in lengths]
        per_rank = [sum(c[r * k : (r + 1) * k]) for r in range(ranks)]
        ratios.append(max(per_rank) / (sum(per_rank) / ranks))
    return float(np.percentile(ratios, 90))


def sizes_section(args, blend_class) -> dict:
    """The section's cases (module doc): per ranks, layout, cost, size and single/blend."""
    steps = args.sizes_steps or (40 if args.quick else 200)
    blend = blend_class(args)
    results = []
    for ranks in args.ranks:
        g = ranks * args.rows_per_rank
        t = time.perf_counter()
        for layout in ("unpacked", "packed"):
            for cost_name in ("attention", "measured"):
                for name in SIZES:
                    n = size_of(name, g, args.window)
                    for kind, sizes in (("single", [n]), ("blend", [10 * args.window, n])):
                        data = Datasets(blend, sizes, args.seed, g, cost_name == "measured")
                        planner = _planner(data, cost_name, g, layout == "packed", args)
                        case = run_case(data, planner, ranks, steps)
                        if layout == "unpacked":
                            case["none_p90"] = run_none(
                                data, cost_name, ranks, args.rows_per_rank, steps, args
                            )
                        results.append(
                            {"n": n, "ranks": ranks, "layout": layout, "cost": cost_name,
                             "kind": kind, **nested(case)}
                        )  # fmt: skip
        print(f"  [sizes, {ranks} ranks: {time.perf_counter() - t:.1f} s]", file=sys.stderr)
    return {
        "steps": steps,
        "per_rank": args.rows_per_rank,
        "results": results,
        "targets": sizes_targets([flat(r) for r in results], args.rows_per_rank),
    }


#: a case's figures in the JSON: its balance and its plan's invariants and cost, apart (the
#: measurements page draws each group as one table)
BALANCE_FIGURES = (
    "max_over_mean_p90",
    "max_over_mean_p90_not_anchored",
    "bound_p90",
    "over_bound_p90",
    "none_p90",
    "outlier_anchored_steps",
)


def nested(case: dict) -> dict:
    """A case's figures (`run_case`) as ``{"balance": ..., "plan": ...}``."""
    return {
        "balance": {k: v for k, v in case.items() if k in BALANCE_FIGURES},
        "plan": {k: v for k, v in case.items() if k not in BALANCE_FIGURES},
    }


def flat(result: dict) -> dict:
    """A result of the section's JSON with its figures at the top (as `run_case` gave them)."""
    return {**result, **result.get("balance", {}), **result.get("plan", {})}


def _large(r: dict, per_rank: int) -> bool:
    return r["n"] >= 10 * r["ranks"] * per_rank


def sizes_targets(results: list[dict], per_rank: int = 2) -> list[dict]:
    """The section's targets (module doc), each with the worst measured value. Balance targets
    are judged on ``attention`` over the steps that are not outlier-anchored (those are counted
    apart); ``measured`` is reported beside them; planning time where a batch has 64 rows or
    more."""
    out = []
    for ranks in sorted({r["ranks"] for r in results}):
        mine = [r for r in results if r["ranks"] == ranks]
        large = [r for r in mine if _large(r, per_rank) and r["cost"] == "attention"]
        limit = TARGET.get(ranks, TARGET[64])
        for layout in ("unpacked", "packed"):
            key = "max_over_mean_p90_not_anchored"
            worst = max((r for r in large if r["layout"] == layout), key=lambda r: r[key],
                        default=None)  # fmt: skip
            if worst is not None:
                out.append(
                    {"target": f"{ranks} ranks {layout} attention, N >= 10g: p90 max/mean <= {limit}",
                     "value": worst[key], "met": worst[key] <= limit,
                     "worst": f"{worst['kind']} N={worst['n']}, "
                              f"{worst['outlier_anchored_steps']} steps outlier-anchored",
                     "why": _why(worst)}
                )  # fmt: skip
        over = max(mine, key=lambda r: r["over_bound_p90"])
        out.append(
            {"target": f"{ranks} ranks: p90 ours / bound <= {TARGET_OVER_BOUND}",
             "value": over["over_bound_p90"], "met": over["over_bound_p90"] <= TARGET_OVER_BOUND,
             "worst": f"{over['layout']} {over['cost']} {over['kind']} N={over['n']}"}
        )  # fmt: skip
        if ranks * per_rank >= 64:
            slow = max(mine, key=lambda r: r["planner_ms_per_64_rows"])
            ms = slow["planner_ms_per_64_rows"]
            out.append({"target": f"{ranks} ranks: planning ms per 64 rows <= {TARGET_MS:g}",
                        "value": ms, "met": ms <= TARGET_MS,
                        "worst": f"{slow['layout']} {slow['cost']} {slow['kind']} N={slow['n']}",
                        "why": "the slowest case is packed with the measured cost on a blend: each "
                        "global batch reads about a thousand new documents, and the pool of the "
                        "window's carried positions is sorted and costed again in Python"})  # fmt: skip
    for what in ("twice_in_a_batch", "early"):
        total = sum(r[what] for r in results)
        out.append({"target": f"samples {what.replace('_', ' ')}: 0", "value": float(total),
                    "met": total == 0})  # fmt: skip
    return out


def _why(worst: dict) -> str:
    """Why a balance target was missed by its worst case (its bound tells batch from dealing)."""
    if worst["layout"] == "packed":
        return (
            f"{worst['kind']} N={worst['n']}: the batch's own bound is its p90 (the dealing is the best "
            "possible). A small dataset's epoch is about one global batch of documents here, so "
            "its closing epoch's longest document, left to the end, becomes the oldest and leads a "
            "row alone beside rows of shorter leads"
        )
    return (
        f"{worst['kind']} N={worst['n']}: an epoch is about ten global batches, cut into runs of like "
        "cost; the costliest run holds the epoch's tail of a heavy-tailed length distribution, "
        "so one batch in ten is uneven by its own samples (its bound); from N = 40g the p90 is "
        "within the target"
    )


def report_sizes(section: dict, args) -> list[str]:
    lines = [
        f"planner on every dataset size: {section['steps']} global batches per case, window "
        f"{args.window}; single: one dataset of N samples; blend: 10 x window samples and N at 4:1",
        "",
        f"{'ranks':>5} {'layout':<8} {'cost':<9} {'kind':<6} {'N':>6} {'p90':>6} {'p90 na':>6} {'bound':>6} "
        f"{'/bound':>6} {'none':>6} {'outl.':>5} {'twice':>5} {'early':>5} {'epochs':>6} "
        f"{'ms/64r':>6} {'carried':>7} {'state B':>7}",
        "-" * 119,
    ]
    for r in map(flat, section["results"]):
        none = f"{r['none_p90']:>6.3f}" if "none_p90" in r else f"{'-':>6}"
        lines.append(
            f"{r['ranks']:>5} {r['layout']:<8} {r['cost']:<9} {r['kind']:<6} {r['n']:>6} "
            f"{r['max_over_mean_p90']:>6.3f} {r['max_over_mean_p90_not_anchored']:>6.3f} "
            f"{r['bound_p90']:>6.3f} {r['over_bound_p90']:>6.3f} "
            f"{none} {r['outlier_anchored_steps']:>5} {r['twice_in_a_batch']:>5} {r['early']:>5} "
            f"{r['epochs_done']:>6} {r['planner_ms_per_64_rows']:>6.2f} {r['carried_max']:>7} "
            f"{r['state_bytes_max']:>7}"
        )
    lines += [
        "",
        "p90 na: the p90 over the steps that are not outlier-anchored (outl.: those whose "
        "costliest item exceeds a rank's fair share; no dealing balances them); bound: the p90 of "
        "the batches' lower bound (plan_bound); /bound: p90 of ours / bound per step; none: today's "
        "consecutive samples; early: samples placed before their dataset's previous epoch ended",
        "",
        "targets:",
    ]
    for t in section["targets"]:
        worst = f" (worst: {t['worst']})" if "worst" in t else ""
        lines.append(
            f"  {t['target']:<52} {t['value']:.4f}  {'met' if t['met'] else 'NOT met'}{worst}"
        )
    return lines
