"""The ``long`` section: the packed planner over many steps."""

from __future__ import annotations

import json
import time

import numpy as np

from energon_platform.loader.balance.packer import sample_cost
from energon_platform.loader.balance.planner import Planner
from scripts.bench.balance.common import TARGET_RANKS, SyntheticLengths


def long_section(args) -> dict:
    """``long``: the packed planner (attention, 8 ranks x ``--rows-per-rank``) over ``--long-steps``
    global batches of the skewed blend: the carried samples and the saved state stay bounded."""
    blend = SyntheticLengths(args)
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
