#!/usr/bin/env python3
"""Online data mixing (``loader.blend_adapt``) on a synthetic multi-domain text task with known
structure: does an adaptive blend reach the uniform mixture's held-out loss in fewer steps, what
does the mixer cost per step, and do its weights move the way the structure says?

The task (generated into a temporary folder, ``--docs`` documents per domain, each document
``--words`` words, every word one token of the shipped tokenizer; the four domains use disjoint
word sets so the model can tell them apart):

* ``pattern``: a learnable deterministic pattern: 16 words in a ring, a random start and a random
  stride of 1, 2 or 3 (the stride is read off the first two words, then every word is determined);
* ``saturating``: one of two fixed strings (learned very early, then nothing is left to learn);
* ``noise``: words drawn uniformly from 64 (unlearnable: every word costs ln 64 ≈ 4.16 nats at
  best; only the end-of-document token is predictable);
* ``slow``: a larger-vocabulary pattern: 256 words in one fixed random cycle, a random start, each
  word followed by its successor in the cycle (256 transitions to learn against ``pattern``'s 48,
  each seen about 5 times less often: learnable, but slower).

Each domain is converted by the converter of ``energon-platform convert text`` (a train split
and a held-out ``val`` split, ``--val-fraction``), and a metadataset blends the four train splits
with equal weights. Then the reference trainer (``energon-platform train``, the tiny LM of
``energon_platform/training/model.py`` under ``configs/encoders/text_small.yaml``), one process
each, same seed and steps, runs three times: uniform weights (no ``blend_adapt``: the baseline),
``blend_adapt: {method: odm}`` and ``blend_adapt: {method: loss_ratio}`` (``--every``, ``--lag``).
It checkpoints every ``--eval-every`` steps; each checkpoint's model is then evaluated on each
domain's val split (the trainer's own ``evaluate``: token-weighted mean loss), which gives the
held-out loss per domain over time.

Reported per method against uniform:

* steps to reach the uniform mixture's final held-out loss (the mean over the four domains),
  interpolated linearly between checkpoints, and its ratio to uniform's own (target <= 0.85, i.e.
  at least 15% fewer steps);
* final held-out loss per domain and averaged;
* whether the weights moved as the structure says (``blend_weights`` of the log rows: the noise
  weight at the end below its start, the slow domain's above);
* the mixer's overhead per step: ``TrainLoader.report_losses`` (the per-dataset sums and, every
  ``every`` steps, the method's update and the blend's extension) timed in this process on a
  ``TrainLoader`` over the same blend with synthetic losses, divided by the median training step
  time of the uniform run (target <= 1%).

    .venv/bin/python scripts/bench_mixing.py [--steps 300] [--json bench-mixing.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.bench_run import check_json_out, finish_record, run_record, write_json  # noqa: E402

ENCODER = "configs/encoders/text_small.yaml"
DOMAINS = ("pattern", "saturating", "noise", "slow")
METHODS = ("uniform", "odm", "loss_ratio")


# --- the task ------------------------------------------------------------------------------------


def single_token_words() -> list[str]:
    """Lower-case words the shipped tokenizer encodes, after a space, as one token (sorted)."""
    from task_encoders.tokenization import DEFAULT_TOKENIZER_DIR, load_hf_tokenizer

    tok = load_hf_tokenizer(DEFAULT_TOKENIZER_DIR)
    words = sorted(w[1:] for w in tok.get_vocab() if w.startswith("Ġ") and w[1:].isalpha())
    words = [w for w in words if w.islower() and len(w) >= 3]
    return [w for w in words if len(tok(" " + w, add_special_tokens=False)["input_ids"]) == 1]


def domain_documents(n: int, length: int, seed: int) -> dict[str, list[str]]:
    """``n`` documents of ``length`` words for each domain (see the module doc)."""
    rng = random.Random(seed)
    words = single_token_words()
    rng.shuffle(words)
    sizes = {"saturating": 2 * length, "pattern": 16, "noise": 64, "slow": 256}
    if sum(sizes.values()) > len(words):
        raise SystemExit(f"--words {length}: the tokenizer has too few single-token words")
    vocab, at = {}, 0
    for name in DOMAINS:
        vocab[name], at = words[at : at + sizes[name]], at + sizes[name]
    fixed = [vocab["saturating"][:length], vocab["saturating"][length:]]
    ring, cycle = vocab["pattern"], vocab["slow"]  # the cycle's order: the shuffled order
    out: dict[str, list[str]] = {name: [] for name in DOMAINS}
    for _ in range(n):
        out["saturating"].append(" ".join(rng.choice(fixed)))
        start, stride = rng.randrange(len(ring)), rng.choice((1, 2, 3))
        out["pattern"].append(
            " ".join(ring[(start + i * stride) % len(ring)] for i in range(length))
        )
        out["noise"].append(" ".join(rng.choices(vocab["noise"], k=length)))
        start = rng.randrange(len(cycle))
        out["slow"].append(" ".join(cycle[(start + i) % len(cycle)] for i in range(length)))
    return out


def make_task(base: Path, docs: int, length: int, val_fraction: float, seed: int) -> Path:
    """The four domains converted under ``base`` and the uniform metadataset over their train
    splits; returns the metadataset's path."""
    import yaml

    from converters.convert import ConvertOptions, run_conversion

    for name, texts in domain_documents(docs, length, seed).items():
        manifest = base / f"{name}.jsonl"
        with open(manifest, "w") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"id": f"{name}-{i:06d}", "text": text}) + "\n")
        run_conversion(
            "text",
            {"manifest": str(manifest), "text_column": "text", "id_column": "id", "fmt": None},
            ConvertOptions(
                out=str(base / name),
                samples_per_shard=256,
                val_fraction=val_fraction,
                progress=False,
            ),
        )
    mds = base / "blend.yaml"
    blend = [{"weight": 1, "path": str(base / name)} for name in DOMAINS]
    mds.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {"train": {"blend": blend}},
            },
            sort_keys=False,
        )
    )
    return mds


# --- the runs ------------------------------------------------------------------------------------


def run_config(base: Path, mds: Path, method: str, args) -> Path:
    import yaml

    loader = {"global_batch_size": args.batch, "num_workers": args.workers, "seed": args.seed}
    if method != "uniform":
        loader["blend_adapt"] = {"method": method, "every": args.every, "lag": args.lag}
    config = {
        "data": {"path": str(mds), "train_split": "train", "val_split": None},
        "encoder": str(REPO / ENCODER),
        "loader": loader,
        "model": {"dim": args.dim, "layers": args.layers, "heads": 4},
        "train": {
            "steps": args.steps,
            "lr": args.lr,
            "warmup": 10,
            "checkpoint_every": args.eval_every,
            "keep_checkpoints": args.steps // args.eval_every + 1,
            "out": str(base / f"run-{method}"),
        },
    }
    path = base / f"run-{method}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def train(config: Path, failures: list[dict]) -> float:
    """The reference trainer on ``config`` in a fresh process; its wall seconds. A failed run is
    recorded in ``failures`` (its error's last lines) and run once more from scratch."""
    import shutil

    exe = Path(sys.executable).parent / "energon-platform"
    argv = [str(exe), "train", "--config", str(config), "--quiet"]
    for attempt in (1, 2):
        began = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=3600)
        if done.returncode == 0:
            return time.perf_counter() - began
        out = config.parent / config.stem
        rows = len(read_log(out)) if (out / "log.jsonl").is_file() else 0
        error = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        failures.append({"run": config.stem, "attempt": attempt, "rows": rows, "error": error[0]})
        print(f"   {config.stem} failed after {rows} steps: {error[0]}", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    raise SystemExit(f"training {config.name} failed twice:\n{done.stderr[-3000:]}")


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line]


def held_out_losses(config: Path, out: Path, batch: int) -> dict[int, dict[str, float]]:
    """Step → domain → mean held-out loss of that step's checkpoint on the domain's val split."""
    import torch

    from energon_platform.config import load_config
    from energon_platform.loader.run_plan import build_encoder
    from energon_platform.loader.train_loader import build_val_loader
    from energon_platform.training import checkpoint
    from energon_platform.training.train import evaluate
    from energon_platform.training.two_tower import build_model

    cfg = load_config(config)
    model = build_model(cfg.model, build_encoder(cfg, training=False))
    vals = {}
    for name in DOMAINS:
        data = dataclasses.replace(
            cfg.data, path=Path(cfg.data.path).parent / name, val_split="val"
        )
        vals[name] = build_val_loader(dataclasses.replace(cfg, data=data), batch)
        if vals[name] is None:
            raise SystemExit(f"{name}: no val split (raise --val-fraction)")
    curve = {}
    for folder in sorted((out / "checkpoints").glob("step_*")):
        state = checkpoint.load(folder, 0)
        model.load_state_dict(state["model_state"]["model"])
        device = torch.device("cpu")
        curve[state["step"]] = {name: evaluate(model, vals[name], 1, device) for name in DOMAINS}
    return curve


def steps_to_reach(curve: dict[int, float], level: float) -> float | None:
    """The first step the curve (step → loss) is at or below ``level``, interpolated linearly
    between the checkpoints around the crossing; None when it never is."""
    previous = None
    for step in sorted(curve):
        loss = curve[step]
        if loss <= level:
            if previous is None:
                return float(step)
            s0, l0 = previous
            return s0 + (step - s0) * (l0 - level) / (l0 - loss) if l0 != loss else float(step)
        previous = (step, loss)
    return None


def weights_over_time(rows: list[dict], every: int) -> dict:
    """The blend weights of the log rows: at the start, the end, each ``every`` steps, and the
    least and most each dataset had."""
    series = [r["blend_weights"] for r in rows if "blend_weights" in r]
    names = list(series[0])
    return {
        "start": series[0],
        "end": series[-1],
        "min": {n: min(w[n] for w in series) for n in names},
        "max": {n: max(w[n] for w in series) for n in names},
        "by_step": {str(r["step"]): r["blend_weights"] for r in rows if r["step"] % every == 0},
    }


def samples_seen(rows: list[dict]) -> dict[str, int]:
    counts = dict.fromkeys(DOMAINS, 0)
    for r in rows:
        for key in r["keys"]:
            name = key.split(":", 1)[0]
            if name in counts:
                counts[name] += 1
    return counts


# --- the mixer's cost --------------------------------------------------------------------------


def mixer_cost(base: Path, mds: Path, method: str, args, steps: int) -> dict:
    """Seconds of ``TrainLoader.report_losses`` per step, with synthetic losses (each dataset a
    falling loss plus noise) on a loader over the task's blend (no workers)."""
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    cfg = load_config(run_config(base, mds, method, args))
    loader = TrainLoader(cfg, num_workers=0)
    rng = random.Random(args.seed)
    level = dict(zip(DOMAINS, (3.0, 1.0, 4.2, 5.0)))
    times, changes = [], 0
    try:
        for step in range(steps):
            batch = loader.global_batch
            keys = [k for _ in range(loader.accumulation) for k in next(loader).keys]
            losses = []
            for key in keys:
                name = key.split(":", 1)[0]
                fall = 1.0 if name == "noise" else math.exp(-step / (50 if name == "slow" else 10))
                losses.append(level.get(name, 3.0) * (0.2 + 0.8 * fall) + rng.gauss(0, 0.05))
            segments = len(loader.plan.blend.segments)
            began = time.perf_counter()
            loader.report_losses(batch, keys, losses)
            times.append(time.perf_counter() - began)
            changes += len(loader.plan.blend.segments) > segments
    finally:
        loader.close()
    updates = [t for i, t in enumerate(times) if (i + 1) % args.every == 0]
    return {
        "steps": steps,
        "mean_s": statistics.fmean(times),
        "median_s": statistics.median(times),
        "update_step_mean_s": statistics.fmean(updates) if updates else None,
        "max_s": max(times),
        "weight_changes": changes,
    }


# --- the report ----------------------------------------------------------------------------------


def target(text: str, value, met: bool, why: str | None = None) -> dict:
    """A target of the run: its text, the value measured and whether it is met (and, when it is
    not, why: from the figures of this run)."""
    entry = {"target": text, "value": value, "met": bool(met)}
    if not met and why:
        entry["why"] = why
    return entry


def print_table(result: dict) -> None:
    """The run's table and targets (from its JSON result alone)."""
    runs, steps = result["runs"], result["settings"]["steps"]
    level, uniform_steps = result["uniform_final_held_out_mean"], None
    compared = result["compared"]
    if compared:
        uniform_steps = next(iter(compared.values()))["uniform_steps"]
    print(f"\nuniform: final mean held-out loss {level:.4f} (reached at step {uniform_steps:.0f})")

    def moved(method: str, name: str) -> str:
        w = runs[method]["weights"]
        return f"{w['start'][name]:.2f} → {w['end'][name]:.2f}"

    head = f"{'method':<11} {'steps to it':>11} {'÷ uniform':>9} "
    head += " ".join(f"{n:>10}" for n in DOMAINS)
    head += f" {'mean':>7} {'overhead':>9} {'noise w':>13} {'slow w':>13}"
    print(head)
    final = runs["uniform"]["held_out"][str(steps)]
    print(
        f"{'uniform':<11} {uniform_steps:>11.0f} {1:>9.2f} "
        + " ".join(f"{final[n]:>10.4f}" for n in DOMAINS)
        + f" {level:>7.4f} {'–':>9} {moved('uniform', 'noise'):>13} {moved('uniform', 'slow'):>13}"
    )
    for method, c in compared.items():
        reached = c["steps_to_uniform_final"]
        reached = "never" if reached is None else f"{reached:.0f}"
        ratio = "–" if c["steps_ratio"] is None else f"{c['steps_ratio']:.2f}"
        print(
            f"{method:<11} {reached:>11} {ratio:>9} "
            + " ".join(f"{c['final_held_out'][n]:>10.4f}" for n in DOMAINS)
            + f" {c['final_held_out_mean']:>7.4f} {c['overhead_fraction']:>9.3%}"
            + f" {moved(method, 'noise'):>13} {moved(method, 'slow'):>13}"
        )
    for f in result.get("failed_runs") or []:
        print(f"{f['run']} failed (attempt {f['attempt']}, after {f['rows']} steps): {f['error']}")
    print("\ntargets:")
    for t in result["targets"]:
        value = "–" if t["value"] is None else f"{t['value']:.4g}"
        print(f"  [{'met' if t['met'] else 'MISSED'}] {t['target']}: {value}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--docs", type=int, default=3000, help="documents per domain")
    p.add_argument("--words", type=int, default=20, help="words (tokens) per document")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held-out share per domain")
    p.add_argument("--steps", type=int, default=300, help="training steps of every run")
    p.add_argument("--batch", type=int, default=4, help="global batch (packs of up to 8 documents)")
    p.add_argument("--dim", type=int, default=64, help="the model's width")
    p.add_argument("--layers", type=int, default=2, help="the model's transformer blocks")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--seed", type=int, default=1234, help="data and loader seed")
    p.add_argument("--every", type=int, default=4, help="blend_adapt.every")
    p.add_argument("--lag", type=int, default=2, help="blend_adapt.lag")
    p.add_argument("--workers", type=int, default=1, help="loader workers of the training runs")
    p.add_argument("--eval-every", type=int, default=30, help="checkpoint (and evaluate) cadence")
    p.add_argument("--cost-steps", type=int, default=400, help="steps of the mixer-cost loop")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument(
        "--table", type=Path, metavar="JSON", help="only print the table of a saved run's JSON"
    )
    args = p.parse_args(argv)
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    if args.table:
        print_table(json.loads(args.table.read_text()))
        return 0
    if args.steps % args.eval_every:
        p.error("--steps must be a multiple of --eval-every")
    os.environ["TQDM_DISABLE"] = "1"  # the val loaders' progress bars, here and in the runs
    record = run_record()
    began = time.perf_counter()
    runs: dict[str, dict] = {}
    failures: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-mixing-") as tmp:
        base = Path(tmp)
        print(f"== the task: {len(DOMAINS)} domains x {args.docs} documents", flush=True)
        mds = make_task(base, args.docs, args.words, args.val_fraction, args.seed)
        for method in METHODS:
            config = run_config(base, mds, method, args)
            print(f"== training: {method}, {args.steps} steps", flush=True)
            wall = train(config, failures)
            out = base / f"run-{method}"
            rows = read_log(out)
            curve = held_out_losses(config, out, args.batch)
            deltas = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
            runs[method] = {
                "wall_s": wall,
                "step_median_s": statistics.median(deltas),
                "held_out": {str(s): v for s, v in curve.items()},
                "held_out_mean": {str(s): statistics.fmean(v.values()) for s, v in curve.items()},
                "weights": weights_over_time(rows, args.eval_every),
                "samples": samples_seen(rows),
            }
            last = curve[max(curve)]
            print(
                f"   {wall:.0f} s; final held-out loss "
                + ", ".join(f"{n} {last[n]:.3f}" for n in DOMAINS)
                + f"; mean {statistics.fmean(last.values()):.3f}",
                flush=True,
            )
        print("== the mixer's cost per step (report_losses, synthetic losses)", flush=True)
        cost = {m: mixer_cost(base, mds, m, args, args.cost_steps) for m in METHODS[1:]}

    def mean_curve(method: str) -> dict[int, float]:
        return {int(s): v for s, v in runs[method]["held_out_mean"].items()}

    level = mean_curve("uniform")[args.steps]
    uniform_steps = steps_to_reach(mean_curve("uniform"), level)
    step_s = runs["uniform"]["step_median_s"]
    compared, targets = {}, []
    for method in METHODS[1:]:
        reached = steps_to_reach(mean_curve(method), level)
        final = runs[method]["held_out"][str(args.steps)]
        start, end = runs[method]["weights"]["start"], runs[method]["weights"]["end"]
        ratio = None if reached is None else reached / uniform_steps
        overhead = cost[method]["mean_s"] / step_s
        compared[method] = {
            "steps_to_uniform_final": reached,
            "uniform_steps": uniform_steps,
            "steps_ratio": ratio,
            "final_held_out": final,
            "final_held_out_mean": statistics.fmean(final.values()),
            "final_held_out_mean_learnable": statistics.fmean(
                final[n] for n in DOMAINS if n != "noise"
            ),
            "overhead_fraction": overhead,
            "noise_weight": {"start": start["noise"], "end": end["noise"]},
            "slow_weight": {"start": start["slow"], "end": end["slow"]},
        }
        seen = runs[method]["samples"]
        targets += [
            target(
                f"{method}: steps to the uniform mixture's final held-out loss, ÷ uniform's <= 0.85",
                ratio,
                ratio is not None and ratio <= 0.85,
                f"{method} reached uniform's final mean held-out loss {level:.4f} only at step "
                f"{reached:.0f} of {uniform_steps:.0f}"
                if reached is not None
                else f"{method} did not reach uniform's final mean held-out loss {level:.4f} "
                f"within {args.steps} steps (its final: {compared[method]['final_held_out_mean']:.4f})",
            ),
            target(
                f"{method}: mixer overhead per step, share of a training step <= 1%",
                overhead,
                overhead <= 0.01,
                f"report_losses took {cost[method]['mean_s'] * 1e3:.3f} ms a step against a "
                f"{step_s * 1e3:.1f} ms step",
            ),
            target(
                f"{method}: noise weight at the end - at the start < 0",
                end["noise"] - start["noise"],
                end["noise"] < start["noise"],
                f"the noise domain ended at weight {end['noise']:.3f} (from {start['noise']:.3f}; "
                f"{seen['noise']} of {sum(seen.values())} samples drawn): its loss stays high "
                + (
                    "and odm rewards high loss (the method's documented caveat)"
                    if method == "odm"
                    else "and its loss did not fall less than the others'"
                ),
            ),
            target(
                f"{method}: slow weight at the end - at the start > 0",
                end["slow"] - start["slow"],
                end["slow"] > start["slow"],
                f"the slow domain ended at weight {end['slow']:.3f} (from {start['slow']:.3f})",
            ),
        ]
    result = {
        "benchmark": "mixing",
        **finish_record(record),
        "settings": {
            "domains": list(DOMAINS),
            "docs_per_domain": args.docs,
            "words_per_doc": args.words,
            "val_fraction": args.val_fraction,
            "steps": args.steps,
            "global_batch": args.batch,
            "model": f"dim {args.dim}, {args.layers} layers",
            "lr": args.lr,
            "seed": args.seed,
            "every": args.every,
            "lag": args.lag,
            "workers": args.workers,
            "eval_every": args.eval_every,
            "encoder": ENCODER,
        },
        "uniform_final_held_out_mean": level,
        "uniform_final_held_out": runs["uniform"]["held_out"][str(args.steps)],
        "uniform_step_median_s": step_s,
        "compared": compared,
        "mixer_cost": cost,
        "runs": runs,
        "failed_runs": failures,
        "targets": targets,
        "seconds": time.perf_counter() - began,
    }
    print_table(result)
    write_json(args.json, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
