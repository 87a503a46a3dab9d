"""The ``train`` section: the reference model's tokens/s on 2 gloo ranks, today against ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from energon_platform.loader.balance.packer import sample_cost
from energon_platform.training.resume_check.processes import torchrun_argv
from scripts.bench.balance.common import REPO, ratio, target_line
from scripts.bench.common import load_average

# --- the reference model's tokens/s on 2 gloo ranks (--train) -----------------------------------
#: the embedded corpora as a skewed blend: short captions and utterances (about 14 and 9 tokens)
#: mixed with long documents (about 94 of 128), so a pack group of 16 samples fills 2 to 12 rows.
TRAIN_WEIGHTS = {"coco_mini": 2, "librispeech_mini": 1, "text_mini": 1}


TRAIN_TARGET, TRAIN_WARMUP = 1.15, 2


class TrainFailed(Exception):
    """A training run of the ``train`` section exited non-zero (its last stderr line says why)."""


def _train_data(base: Path) -> Path:
    """Convert the embedded corpora (``scripts.bench.data``) under ``base``; the blend's metadataset."""
    import yaml

    from scripts.bench.data import coco_dataset, librispeech_dataset, text_dataset

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


def train_config(
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
    cmd = torchrun_argv(
        2,
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
    )
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


def interleaved_runs(configs: dict[str, Path], base: Path, args) -> tuple[dict, list[float]]:
    """``--train-rounds`` rounds of one `_train_once` per config, interleaved A, B, A, B against
    load drift: ``(runs per name, 1-minute load average before the first run and after each)``;
    a load above ~2 means other processes competed for the 2 cores."""
    load = [load_average()[0]]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for rnd in range(args.train_rounds):
        for name, config in configs.items():
            runs[name].append(_train_once(config, base / f"out-{name}-{rnd}", args))
            load.append(load_average()[0])
            r = runs[name][-1]
            print(
                f"  [train {name} round {rnd}: {r['tokens_per_s']:.0f} tokens/s, "
                f"{r['steps'] / r['seconds']:.2f} steps/s, {r['wall_s']:.1f} s]",
                file=sys.stderr,
            )
    return runs, load


def train_variants(runs: dict[str, list[dict]], rows: dict[str, int]) -> dict[str, dict]:
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
            "none": train_config(mds, base, "none", args),
            "attention": train_config(mds, base, "attention", args),
        }
        today = _today_stats(configs["none"], args)
        runs, load = interleaved_runs(configs, base, args)
    variants = train_variants(runs, {"attention": args.train_rows})
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
