"""The ``demo`` section: the planner on the embedded corpora's demo blend."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from energon_platform.loader.balance.dealing import deal_plan, rank_costs
from scripts.bench.balance.common import REPO, spread


def demo_section(args) -> dict:
    """``demo``: the embedded demo blend (image-text 2 : audio 1 : text 1, converted into a temporary
    folder) through the real loader's planner, packed (``multimodal_packed``, global batch 8 rows)
    with ``balance: attention``, for several seeds: rank cost max/mean on 8 ranks, padding, carried
    samples, and samples placed twice in one global batch (must be 0)."""
    import tempfile

    from energon_platform import TrainLoader, load_config
    from scripts.bench.data import three_modality_blend

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
                plan = loader.plan.planner.plan(b)
                for world, share in ratios.items():
                    costs = rank_costs(plan, deal_plan(plan, world, 1, fixed=True))
                    share.append(max(costs) / (sum(costs) / len(costs)))
                pads.append(plan.padding)
                carried.append(len(plan.next_state.carried))
                ids = loader.plan.planner.identities([p for row in plan.items for p in row])
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
