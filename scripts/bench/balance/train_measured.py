"""The ``train-measured`` section: the two-tower model's optimizer steps/s on 2 gloo ranks, planned
by measured cost.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from scripts.bench.balance.common import CALIBRATION_KEYS, REPO, target_line
from scripts.bench.balance.train import TRAIN_WARMUP, interleaved_runs, train_config, train_variants

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
    from scripts.bench.data import skewed_captions_dataset

    with tempfile.TemporaryDirectory(prefix="bench-balance-train-measured-") as tmp:
        base = Path(tmp)
        data = skewed_captions_dataset(base, SKEW_TILE)
        setup = dict(model=TRAIN_TWO_TOWER, encoder=skewed_encoder(), batch=TRAIN_MEASURED_BATCH)
        configs = {b: train_config(data, base, b, args, **setup) for b in ("none", "attention")}
        t = time.perf_counter()
        report = calibrate_run(
            load_config(str(configs["attention"])),
            micro_batches=args.calibrate_batches,
            repeats=3,
            progress=False,
        )
        print(f"  [calibrate: {time.perf_counter() - t:.1f} s]", file=sys.stderr)
        write_report(report, base / "cost.json")
        configs["measured"] = train_config(
            data, base, "measured", args, cost=base / "cost.json", **setup
        )
        runs, load = interleaved_runs(configs, base, args)
    variants = train_variants(runs, {k: TRAIN_MEASURED_BATCH[k] for k in ("attention", "measured")})
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
