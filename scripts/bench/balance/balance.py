"""The ``balance`` section: today, a naive sort-and-deal, Energon's packing and ours on the
synthetic stream, by rank count, layout and cost model.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from energon_platform.loader.balance.dealing import deal_bound, deal_plan, rank_costs
from energon_platform.loader.balance.packer import sample_cost
from energon_platform.loader.balance.planner import Planner
from scripts.bench.balance.common import (
    TARGET_PADDING,
    TARGET_RANKS,
    TARGET_RATIO,
    Recorder,
    SyntheticLengths,
    ffd,
    spread,
    target_line,
)


def packed_none_naive(blend: SyntheticLengths, cost, ranks: int, k: int, args) -> dict[str, dict]:
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


def packed_energon(blend: SyntheticLengths, cost, ranks: int, k: int, args) -> dict:
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


def unpacked_none_naive(blend: SyntheticLengths, cost, ranks: int, k: int, args) -> dict[str, dict]:
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
    blend = SyntheticLengths(args)
    calibration = SyntheticLengths(args, seed=args.seed + 1).draw(
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
