"""Provenance queries at 10^9 samples, without data: one step's samples, and every step of a key.

Synthetic schedules (``DatasetOrder(10**9, ...)``, one dataset and a blend of three), global batch
``--batch``: ``step`` times :func:`~energon_platform.loader.trace.step_layout` of a step deep in the
run, ``key`` times :func:`~energon_platform.loader.trace.uses` of one sample over ``--epochs``
epochs of its dataset (the inverse permutation, O(1) per epoch). The alternative it is compared
with: scanning the steps' samples for the key, timed on ``--scan`` steps and extrapolated.

    .venv/bin/python scripts/bench_trace.py [--json]   # illustrative
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from energon_platform.loader.blend import Blend, Segment
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.schedule import Schedule
from energon_platform.loader.trace import step_layout, uses

N = 10**9


def _best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(batch: int, epochs: int, scan: int) -> list[dict]:
    schedules = {
        "one dataset": Schedule((DatasetOrder(N, 1),), batch),
        "one dataset, locality": Schedule((DatasetOrder(N, 1, 65536),), batch),
        "blend of 3": Schedule((DatasetOrder(N, 1), DatasetOrder(N // 2, 2), DatasetOrder(N // 4, 3)), batch,
                               blend=Blend([Segment(0, ("2", "1", "1")), Segment(10**7, ("1", "1", "2"))], 3)),
    }
    rows = []
    for name, s in schedules.items():
        spb = s.samples_per_batch
        horizon = epochs * N // spb + 1  # batches that hold `epochs` epochs of the first dataset
        deep = horizon - 2
        step_s = _best(lambda: step_layout(s, deep, 8, 1))
        target = int(step_layout(s, deep, 8, 1)["index"][0])
        found = uses(s, 0, target, horizon)
        key_s = _best(lambda: uses(s, 0, target, horizon))
        scan_s = _best(lambda: [step_layout(s, b, 8, 1) for b in range(scan)], repeat=1) / scan * horizon
        rows.append({"schedule": name, "samples": N, "global_batch": batch, "steps": horizon,
                     "step_ms": round(step_s * 1e3, 3), "key_epochs": epochs, "key_uses": len(found),
                     "key_ms": round(key_s * 1e3, 3), "scan_s_estimated": round(scan_s, 1),
                     "key_vs_scan": round(scan_s / key_s)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1024, help="global batch size in samples (default 1024)")
    ap.add_argument("--epochs", type=int, default=10, help="epochs of the first dataset the key search spans")
    ap.add_argument("--scan", type=int, default=200, help="steps timed for the scan estimate")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = measure(args.batch, args.epochs, args.scan)
    if args.json:
        print(json.dumps({"benchmark": "trace", "rows": rows}, indent=1))
        return
    print(f"{'schedule':24} {'steps':>12} {'step ms':>9} {'key ms':>9} {'uses':>5} {'scan s (est.)':>14} {'key vs scan':>12}")
    for r in rows:
        print(f"{r['schedule']:24} {r['steps']:>12} {r['step_ms']:>9} {r['key_ms']:>9} {r['key_uses']:>5} "
              f"{r['scan_s_estimated']:>14} {r['key_vs_scan']:>11}x")


if __name__ == "__main__":
    main()
