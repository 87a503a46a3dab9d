"""Provenance queries at 10^9 samples, without data: one step's samples, every step of a key, and
the planner replay a balanced run's trace costs.

Synthetic schedules (``DatasetOrder(10**9, ...)``, one dataset and a blend of three), global batch
``--batch``: ``step`` times :func:`~energon_platform.loader.trace.step_layout` of a step deep in the
run, ``key`` times :func:`~energon_platform.loader.trace.uses` of one sample over ``--epochs``
epochs of its dataset (the inverse permutation, O(1) per epoch). The alternative it is compared
with: scanning the steps' samples for the key, timed on ``--scan`` steps and extrapolated.

Balanced runs (``loader.balance``) plan each global batch from the planner's state, which only the
batches before it give: tracing step N replays N plans. ``balanced`` times that replay with
:class:`~energon_platform.loader.balance.planner.Planner` on synthetic log-normal lengths (packed rows of
``--seq-len``, ``--rows`` rows per global batch, the default window), per plan and per 10,000 steps.

    .venv/bin/python -m scripts.bench.trace [--json bench-trace.json]   # illustrative
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from energon_platform.loader.balance.packer import sample_cost
from energon_platform.loader.balance.planner import Planner
from energon_platform.loader.blend import Blend, Segment
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.schedule import Schedule
from energon_platform.loader.trace import step_layout, uses
from scripts.bench.common import best_of, check_json_out, finish_record, run_record, write_json

N = 10**9


def measure(batch: int, epochs: int, scan: int) -> list[dict]:
    schedules = {
        "one dataset": Schedule((DatasetOrder(N, 1),), batch),
        "one dataset, locality": Schedule((DatasetOrder(N, 1, 65536),), batch),
        "blend of 3": Schedule(
            (DatasetOrder(N, 1), DatasetOrder(N // 2, 2), DatasetOrder(N // 4, 3)),
            batch,
            blend=Blend([Segment(0, ("2", "1", "1")), Segment(10**7, ("1", "1", "2"))], 3),
        ),
    }
    rows = []
    for name, s in schedules.items():
        spb = s.samples_per_batch
        # batches that hold `epochs` epochs of a dataset of N samples
        horizon = epochs * N // spb + 1
        deep = horizon - 2
        step_s = best_of(lambda: step_layout(s, deep, 8, 1), 5)
        lay = step_layout(s, deep, 8, 1)
        dataset, target = int(lay["dataset"][0]), int(lay["index"][0])  # a sample of that step
        found = uses(s, dataset, target, horizon)
        key_s = best_of(lambda: uses(s, dataset, target, horizon), 5)
        scan_s = best_of(lambda: [step_layout(s, b, 8, 1) for b in range(scan)], 1) / scan * horizon
        rows.append(
            {
                "schedule": name,
                "samples": N,
                "global_batch": batch,
                "steps": horizon,
                "step_ms": round(step_s * 1e3, 3),
                "key_epochs": epochs,
                "key_uses": len(found),
                "key_ms": round(key_s * 1e3, 3),
                "scan_s_estimated": round(scan_s, 1),
                "scan_over_key": round(scan_s / key_s),
            }
        )
    return rows


def measure_balanced(rows: int, seq_len: int, plans: int) -> dict:
    """Seconds per plan of a packed ``balance: attention`` planner replayed from the start."""
    lengths = np.clip(np.random.default_rng(0).lognormal(5.5, 1.2, 10**7).astype(int), 2, seq_len)

    def lookup(positions):
        return [(int(lengths[p % len(lengths)]),) * 2 for p in positions]

    planner = Planner(
        lookup, lambda w: sample_cost(w, "attention", seq_len), rows, capacity=seq_len
    )
    t0 = time.perf_counter()
    for b in range(plans):
        planner.plan(b)
    per_plan = (time.perf_counter() - t0) / plans
    return {
        "rows": rows,
        "seq_len": seq_len,
        "window": planner.window,
        "plans": plans,
        "plan_ms": round(per_plan * 1e3, 3),
        "replay_s_per_10k_steps": round(per_plan * 1e4, 1),
        "samples_per_plan": round(planner.state_at(plans).position / plans, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.bench.trace", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--batch", type=int, default=1024, help="global batch size in samples (default 1024)"
    )
    ap.add_argument(
        "--epochs", type=int, default=10, help="epochs of the first dataset the key search spans"
    )
    ap.add_argument("--scan", type=int, default=200, help="steps timed for the scan estimate")
    ap.add_argument(
        "--rows", type=int, default=64, help="balanced: packed rows per global batch (default 64)"
    )
    ap.add_argument("--seq-len", type=int, default=4096, help="balanced: row length (default 4096)")
    ap.add_argument("--plans", type=int, default=200, help="balanced: plans timed (default 200)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write every figure as JSON here")
    args = ap.parse_args()
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    result = {
        **run_record(),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
    }
    result["unbalanced"] = measure(args.batch, args.epochs, args.scan)
    result["balanced"] = measure_balanced(args.rows, args.seq_len, args.plans)
    finish_record(result)
    print(
        f"{'schedule':24} {'steps':>12} {'step ms':>9} {'key ms':>9} {'uses':>5} {'scan s (est.)':>14} "
        f"{'scan/key':>12}"
    )
    for r in result["unbalanced"]:
        print(
            f"{r['schedule']:24} {r['steps']:>12} {r['step_ms']:>9} {r['key_ms']:>9} {r['key_uses']:>5} "
            f"{r['scan_s_estimated']:>14} {r['scan_over_key']:>11}x"
        )
    b = result["balanced"]
    print(
        f"balanced ({b['rows']} rows of {b['seq_len']}, window {b['window']}): {b['plan_ms']} ms per plan, "
        f"{b['replay_s_per_10k_steps']} s to replay 10,000 steps"
    )
    write_json(args.json, result)


if __name__ == "__main__":
    main()
