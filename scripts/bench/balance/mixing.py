"""The ``mixing`` section: balance with weights that move (``loader.blend_adapt``)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import yaml

from energon_platform.loader.balance.dealing import deal_plan, rank_costs
from scripts.bench.balance.common import REPO, ratio, spread

#: the demo blend's mean sample loss per dataset: image-text and audio fall, text stays flat
LOSS = {"coco_mini": 1.0, "librispeech_mini": 5.0, "text_mini": 2.5}
#: what the mixer runs with
ADAPT = {"method": "loss_ratio", "every": 2, "lag": 2}
#: simulated ranks the plans are dealt to
WORLDS = (2, 8)
ENCODERS = {"packed": "multimodal_packed.yaml", "unpacked": "multimodal.yaml"}


def _loss(key: str, step: int) -> float:
    name = key.split(":")[0]
    return LOSS[name] * (0.9**step if name != "text_mini" else 1.0)


def _keys(batch) -> list[str]:
    return list(batch.keys) if hasattr(batch, "num_docs") else list(batch.__key__)


def _run(mds: Path, cache: Path, layout: str, adapt: dict | None, steps: int) -> dict:
    """``steps`` global batches of the demo blend through the loader (one rank, its planner's
    plans dealt to each of `WORLDS`): per world the per-rank cost max/mean of the samples each
    batch draws (its positions costed through the run's final stream), the weights at the end."""
    from energon_platform import TrainLoader, load_config

    cfg = load_config(
        {
            "data": {"path": str(mds), "val_split": None},
            "encoder": str(REPO / "configs/encoders" / ENCODERS[layout]),
            "loader": {
                "global_batch_size": 8,
                "micro_batch_size": 2 if layout == "packed" else None,
                "num_workers": 0,
                "seed": 5,
                "balance": "attention",
                "length_cache": str(cache),
                "blend_adapt": adapt,
            },
        }
    )
    loader = TrainLoader(cfg, num_workers=0)
    plans = []
    for step in range(steps):
        keys = [k for _ in range(loader.accumulation) for k in _keys(next(loader))]
        loader.report_losses(step, keys, [_loss(k, step) for k in keys])
        plans.append(loader.plan.planner.plan(step))
    planner = loader.plan.planner
    ratios = {w: [] for w in WORLDS}
    for b, plan in enumerate(plans):
        cost = planner.cost_at(b)
        true = [sum(cost(w) for _, w in planner.lengths(item)) for item in plan.items]
        for w in WORLDS:
            dealt = deal_plan(plan, w, 1, fixed=planner.fixed_counts)
            ratios[w].append(ratio(rank_costs(dataclasses.replace(plan, costs=true), dealt)))
    weights = {n: round(v, 3) for n, v in loader.blend_weights(steps - 1).items()}
    loader.close()
    return {
        "max_over_mean": {f"{w}_ranks": spread(r) for w, r in ratios.items()},
        "weights": weights,
    }


def _fixed_at(mds: Path, weights: dict[str, float]) -> Path:
    data = yaml.safe_load(mds.read_text())
    for entry in data["splits"]["train"]["blend"]:
        entry["weight"] = weights[Path(entry["path"]).name]
    path = mds.parent / "final_weights.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def mixing_section(args) -> dict:
    """``mixing``: the demo blend (image-text 2 : audio 1 : text 1) with ``balance: attention``,
    packed and unpacked, ``--mixing-steps`` global batches: weights moved by ``blend_adapt``
    (`ADAPT`, on losses that fall for image-text and audio and stay flat for text) against fixed
    weights, at the start's weights and at the mixer's final ones. Targets: the mixed run's p90
    rank cost max/mean within 0.05 of the worse fixed run's, on 2 and 8 ranks."""
    from scripts.bench.data import three_modality_blend

    rows, targets = [], []
    with tempfile.TemporaryDirectory() as tmp:
        mds, cache = three_modality_blend(Path(tmp)), Path(tmp) / "lengths"
        for layout in ENCODERS:
            mixed = _run(mds, cache, layout, ADAPT, args.mixing_steps)
            start = _run(mds, cache, layout, None, args.mixing_steps)
            final = _run(_fixed_at(mds, mixed["weights"]), cache, layout, None, args.mixing_steps)
            for name, r in (("fixed, start", start), ("fixed, final", final), ("adaptive", mixed)):
                rows.append({"layout": layout, "run": name, **r})
            for w in WORLDS:
                key = f"{w}_ranks"
                worse = max(start["max_over_mean"][key]["p90"], final["max_over_mean"][key]["p90"])
                value = mixed["max_over_mean"][key]["p90"]
                targets.append(
                    {
                        "target": f"{layout}, {w} ranks: adaptive p90 <= worse fixed p90 + 0.05",
                        "value": value,
                        "met": value <= worse + 0.05,
                    }
                )
    return {"steps": args.mixing_steps, "adapt": ADAPT, "rows": rows, "targets": targets}


def report_mixing(section: dict, args) -> list[str]:
    a = section["adapt"]
    lines = [
        f"mixing: demo blend (2:1:1), attention, {section['steps']} global batches of 8; "
        f"blend_adapt {a['method']} every {a['every']} lag {a['lag']} (text's loss flat); rank "
        f"cost max/mean of the drawn samples:",
        f"{'layout':>8} {'run':>12} {'2r p50':>7} {'2r p90':>7} {'8r p50':>7} {'8r p90':>7}  "
        f"weights at the end",
    ]
    for r in section["rows"]:
        two, eight = r["max_over_mean"]["2_ranks"], r["max_over_mean"]["8_ranks"]
        shares = " ".join(f"{n.split('_')[0]} {v:.3f}" for n, v in r["weights"].items())
        lines.append(
            f"{r['layout']:>8} {r['run']:>12} {two['p50']:>7.3f} {two['p90']:>7.3f} "
            f"{eight['p50']:>7.3f} {eight['p90']:>7.3f}  {shares}"
        )
    width = max(len(t["target"]) for t in section["targets"])
    return lines + [
        f"  {t['target']:<{width}} {t['value']:.4f}  {'met' if t['met'] else 'NOT met'}"
        for t in section["targets"]
    ]
