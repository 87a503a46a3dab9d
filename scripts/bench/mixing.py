#!/usr/bin/env python3
"""Online data mixing (``loader.blend_adapt``) on real text domains: does an adaptive blend reach
the best fixed mixture's held-out loss in fewer steps, where do its weights go (noise, a domain
that saturates), and what does the mixer cost per step?

The data (`scripts.bench.mixing_corpus`): five domains of text that ships with Python 3.11 or
torch 2.14.1, every file pinned by its SHA-256: ``code`` (standard-library source), ``prose`` (the
language reference's topics), ``data`` (a JSON registry of torch), ``license`` (windows of the
Python license: near-duplicates, a domain that saturates) and ``noise`` (random words of one token
from the others' vocabulary). Every domain holds the same number of documents of exactly
``--length`` tokens. Each is converted with the project's converter (``energon-platform convert
text``: a train split and a held-out ``val`` split); a metadataset blends the train splits.

The model: the reference LM (``energon_platform/training/model.py``, text encoder of the shipped
2048-token tokenizer, one document per row of ``--length + 2`` tokens), trained from scratch in
this process on the project's `TrainLoader` (no workers), AdamW with warmup and cosine decay,
``--steps`` steps of ``--batch`` documents, for each mixture and each of ``--seeds`` seeds (the
seed sets the model's initialisation and the loader's order):

* baselines: ``uniform`` (equal weights, fixed) and ``proportional`` (fixed, by each source's
  size in tokens before the cut to equal counts; the noise source counted at the tokens drawn);
* every method registered in ``energon_platform.loader.mixing`` (``loader.blend_adapt``, starting
  from equal weights, ``--every``, ``--lag``, the method's default options), reporting each
  document's loss after every step (``TrainLoader.report_losses``).

Every ``--eval-every`` steps the model is evaluated on each domain's val split (token-weighted
mean loss). Reported, over the seeds' mean curves: steps to reach the best baseline's final mean
held-out loss over the learnable domains (all but noise), interpolated between evaluations; the
per-domain final losses; the weight paths (a picture, ``--picture``); the overhead per step: the
method's update time (timed where the adapter calls it, in the runs) ÷ the mean step time of the
same run, and ``report_losses`` as a whole (the per-dataset sums and the blend's extension too).
Targets, each method's row met or not: the best method <= 0.85x the best baseline's steps; the
noise weight below half its start within the first fifth of the run (every seed); the learnable
domains' final loss <= 0.97x that of fixed equal weights; the update <= 1% of a step.

    .venv/bin/python -m scripts.bench.mixing [--quick] [--json bench-mixing.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.common import check_json_out, finish_record, run_record, write_json
from scripts.bench.mixing_corpus import DOMAINS, LEARNABLE, documents

BASELINES = ("uniform", "proportional")

# --- the datasets --------------------------------------------------------------------------------


def make_datasets(base: Path, docs: dict[str, list[str]], val_fraction: float) -> None:
    """Each domain's documents converted under ``base/DOMAIN`` (train and val splits)."""
    from converters.convert import ConvertOptions, run_conversion

    for name, texts in docs.items():
        manifest = base / f"{name}.jsonl"
        with open(manifest, "w") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"id": f"{name}-{i:06d}", "text": text}) + "\n")
        run_conversion(
            "text",
            {"manifest": str(manifest), "text_column": "text", "id_column": "id", "fmt": None},
            ConvertOptions(
                out=str(base / name),
                samples_per_shard=512,
                val_fraction=val_fraction,
                progress=False,
            ),
        )


def metadataset(base: Path, name: str, weights: dict[str, float]) -> Path:
    import yaml

    path = base / f"blend-{name}.yaml"
    blend = [{"weight": weights[d], "path": str(base / d)} for d in DOMAINS]
    path.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {"train": {"blend": blend}},
            },
            sort_keys=False,
        )
    )
    return path


def run_config(base: Path, mixture: str, weights: dict[str, float], seed: int, args):
    """The run config of one mixture and seed (loaded, checked)."""
    import yaml

    from energon_platform.config import load_config

    encoder = base / "encoder.yaml"
    if not encoder.exists():
        encoder.write_text(
            yaml.safe_dump(
                {
                    "encoder": "text",
                    "seed": 1234,
                    "text": {"seq_len": args.length + 2},
                    "packing": {"enabled": False},
                }
            )
        )
    loader = {"global_batch_size": args.batch, "num_workers": 0, "seed": seed}
    if mixture not in BASELINES:
        loader["blend_adapt"] = {"method": mixture, "every": args.every, "lag": args.lag}
    config = {
        "data": {"path": str(metadataset(base, mixture, weights)), "val_split": None},
        "encoder": str(encoder),
        "loader": loader,
        "model": {"dim": args.dim, "layers": args.layers, "heads": 4},
        "train": {"steps": args.steps, "lr": args.lr, "warmup": args.warmup, "out": str(base)},
    }
    path = base / f"run-{mixture}-{seed}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return load_config(path)


def val_loaders(base: Path, cfg, batch: int) -> dict:
    from energon_platform.loader.train_loader import build_val_loader

    out = {}
    for name in DOMAINS:
        data = dataclasses.replace(cfg.data, path=base / name, val_split="val")
        out[name] = build_val_loader(dataclasses.replace(cfg, data=data), batch)
        if out[name] is None:
            raise SystemExit(f"error: {name}: no val split (raise --val-fraction)")
    return out


# --- one run -------------------------------------------------------------------------------------


def train(cfg, vals: dict, steps: int, eval_every: int) -> dict:
    """One run in this process: the held-out loss per domain every ``eval_every`` steps, the
    weights in force at every step, and the time of each step and of its ``report_losses``."""
    import torch

    from energon_platform.loader.train_loader import TrainLoader
    from energon_platform.training.train import _lr_lambda, evaluate
    from energon_platform.training.two_tower import build_model

    torch.manual_seed(cfg.loader.seed)
    loader = TrainLoader(cfg, num_workers=0)
    model = build_model(cfg.model, loader.encoder)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg.train.warmup, steps))
    update_s: list[float] = []
    method = loader.adapter.method if loader.adapter is not None else None
    if method is not None:  # the method's own update, timed where the adapter calls it
        inner = method.update

        def timed(*a, **k):
            began = time.perf_counter()
            out = inner(*a, **k)
            update_s.append(time.perf_counter() - began)
            return out

        method.update = timed
    held_out, weights, step_s, report_s = {}, [], [], []
    device = torch.device("cpu")
    try:
        for step in range(steps):
            began = time.perf_counter()
            batch_no = loader.global_batch
            weights.append(loader.blend_weights(batch_no))
            micro = [next(loader) for _ in range(loader.accumulation)]
            targets = sum(float(b.loss_mask.sum()) for b in micro)
            keys, losses = [], []
            for b in micro:
                total, per_doc = model(b, per_document=True)
                (total / max(1.0, targets)).backward()
                keys += b.keys
                losses += per_doc.tolist()
            reported = time.perf_counter()
            loader.report_losses(batch_no, keys, losses)
            report_s.append(time.perf_counter() - reported)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step_s.append(time.perf_counter() - began)
            if (step + 1) % eval_every == 0:
                held_out[step + 1] = {d: evaluate(model, vals[d], 1, device) for d in DOMAINS}
    finally:
        loader.close()
    return {
        "held_out": held_out,
        "weights": weights,
        "step_s": statistics.fmean(step_s),
        "report_s": statistics.fmean(report_s),
        "update_s": sum(update_s) / len(step_s),
        "updates": len(update_s),
        "params": sum(p.numel() for p in model.parameters()),
    }


# --- the figures ---------------------------------------------------------------------------------


def learnable_mean(losses: dict[str, float]) -> float:
    return statistics.fmean(losses[d] for d in LEARNABLE)


def mean_curve(runs: list[dict]) -> dict[int, dict[str, float]]:
    """Step → domain → held-out loss, averaged over the seeds."""
    steps = sorted(runs[0]["held_out"])
    return {
        s: {d: statistics.fmean(r["held_out"][s][d] for r in runs) for d in DOMAINS} for s in steps
    }


def steps_to_reach(curve: dict[int, float], level: float) -> float | None:
    """The first step the curve (step → loss) is at or below ``level``, interpolated linearly
    between the evaluations around the crossing (from step 0 at the first); None if never."""
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


def noise_halved_at(weights: list[dict[str, float]]) -> int | None:
    """The first step whose noise weight is below half its start; None if never."""
    start = weights[0]["noise"]
    return next((s for s, w in enumerate(weights) if w["noise"] < start / 2), None)


def weight_path(runs: list[dict], every: int) -> dict[str, list[float]]:
    """Domain → its weight every ``every`` steps, averaged over the seeds."""
    n = len(runs[0]["weights"])
    return {
        d: [statistics.fmean(r["weights"][s][d] for r in runs) for s in range(0, n, every)]
        for d in DOMAINS
    }


def target(text: str, value, met: bool, why: str | None = None, better: str = "") -> dict:
    entry = {"target": text, "value": value, "met": bool(met)}
    if better:
        entry["better"] = better
    if not met and why:
        entry["why"] = why
    return entry


def summarise(runs: dict[str, list[dict]], args) -> dict:
    """The comparison of every mixture against the best baseline, and the targets."""
    curves = {m: mean_curve(r) for m, r in runs.items()}
    final = {m: c[args.steps] for m, c in curves.items()}
    best = min(BASELINES, key=lambda m: learnable_mean(final[m]))
    level = learnable_mean(final[best])
    learn = {m: {s: learnable_mean(v) for s, v in c.items()} for m, c in curves.items()}
    best_steps = steps_to_reach(learn[best], level)
    fifth = args.steps / 5
    rows, targets = {}, []
    for m, seeds in runs.items():
        reached = steps_to_reach(learn[m], level)
        ratio = None if reached is None else reached / best_steps
        halved = [noise_halved_at(r["weights"]) for r in seeds]
        report_s = statistics.fmean(r["report_s"] for r in seeds)
        step_s = statistics.fmean(r["step_s"] for r in seeds)
        rows[m] = {
            "steps_to_best_baseline": reached,
            "steps_ratio": ratio,
            "final_held_out": final[m],
            "final_learnable_mean": learnable_mean(final[m]),
            "learnable_vs_uniform": learnable_mean(final[m]) / learnable_mean(final["uniform"]),
            "noise_halved_at_step": halved,
            "weights_start": runs[m][0]["weights"][0],
            "weights_end": {
                d: statistics.fmean(r["weights"][-1][d] for r in seeds) for d in DOMAINS
            },
            "step_s": step_s,
            "report_s": report_s,
            "update_s": statistics.fmean(r["update_s"] for r in seeds),
            "overhead_fraction": statistics.fmean(r["update_s"] for r in seeds) / step_s,
            "report_fraction": report_s / step_s,
        }
        if m in BASELINES:
            continue
        row = rows[m]
        late = [h for h in halved if h is None or h > fifth]
        targets += [
            target(
                f"{m}: steps to the best baseline's final learnable loss, ÷ {best}'s <= 0.85",
                ratio,
                ratio is not None and ratio <= 0.85,
                f"{m} reached {best}'s final mean learnable held-out loss {level:.4f} only at "
                f"step {reached:.0f} of {best_steps:.0f}"
                if reached is not None
                else f"{m} did not reach {best}'s final mean learnable held-out loss {level:.4f} "
                f"in {args.steps} steps (its final: {row['final_learnable_mean']:.4f})",
            ),
            target(
                f"{m}: noise weight below half its start by step {fifth:.0f}, seeds late: 0",
                len(late),
                not late,
                f"the noise weight fell below half its start at steps {halved} (None: never); "
                f"it ended at {row['weights_end']['noise']:.3f}",
            ),
            target(
                f"{m}: final learnable held-out loss ÷ fixed equal weights' <= 0.97",
                row["learnable_vs_uniform"],
                row["learnable_vs_uniform"] <= 0.97,
                f"{row['final_learnable_mean']:.4f} against uniform's "
                f"{learnable_mean(final['uniform']):.4f}",
            ),
            target(
                f"{m}: the method's update time per step, share of a training step <= 1%",
                row["overhead_fraction"],
                row["overhead_fraction"] <= 0.01,
                f"its updates took {row['update_s'] * 1e3:.3f} ms a step against a "
                f"{row['step_s'] * 1e3:.1f} ms step (report_losses as a whole: "
                f"{row['report_s'] * 1e3:.3f} ms)",
            ),
        ]
    methods = [m for m in runs if m not in BASELINES]
    ratios = {m: rows[m]["steps_ratio"] for m in methods if rows[m]["steps_ratio"] is not None}
    best_method = min(ratios, key=ratios.get) if ratios else None
    targets.insert(
        0,
        target(
            "best method: steps to the best baseline's final learnable loss ÷ its own <= 0.85",
            ratios.get(best_method),
            best_method is not None and ratios[best_method] <= 0.85,
            "no method reached the best baseline's final loss"
            if best_method is None
            else f"the best, {best_method}, took {ratios[best_method]:.2f}x {best}'s steps",
        ),
    )
    every_target = {
        m: all(t["met"] for t in targets if t["target"].startswith(f"{m}: ")) for m in methods
    }
    return {
        "best_baseline": best,
        "best_baseline_final_learnable": level,
        "best_baseline_steps": best_steps,
        "best_method": best_method,
        "meets_every_target": every_target,
        "compared": rows,
        "weight_paths": {m: weight_path(r, args.every) for m, r in runs.items()},
        "targets": targets,
    }


# --- the picture and the table -------------------------------------------------------------------


def draw(result: dict, path: Path) -> str:
    """The weight paths (one panel per method) and the learnable held-out loss of every mixture,
    as a PNG (matplotlib) at ``path``; its file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths, settings = result["weight_paths"], result["settings"]
    methods = [m for m in paths if m not in BASELINES]
    fig, axes = plt.subplots(1, len(methods) + 1, figsize=(4 * (len(methods) + 1), 3.4))
    colours = dict(zip(DOMAINS, ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red")))
    for ax, m in zip(axes, methods):
        for d in DOMAINS:
            xs = [i * settings["every"] for i in range(len(paths[m][d]))]
            ax.plot(xs, paths[m][d], label=d, color=colours[d], lw=2 if d == "noise" else 1.2)
        ax.axvline(settings["steps"] / 5, color="grey", ls=":", lw=1)
        ax.set(title=f"{m}: weights", xlabel="step", ylabel="weight", ylim=(0, 1))
    axes[0].legend(loc="upper right", fontsize=8)
    ax = axes[-1]
    for m, curve in result["curves"].items():
        xs = [int(s) for s in curve]
        ax.plot(xs, [learnable_mean(v) for v in curve.values()], label=m,
                ls="--" if m in BASELINES else "-")  # fmt: skip
    ax.set(title="held-out loss, learnable domains", xlabel="step", ylabel="mean loss (nats)")
    ax.legend(fontsize=8)
    fig.suptitle(
        f"{settings['seeds']} seeds, {settings['steps']} steps; dotted: the first fifth", fontsize=9
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path.name


def print_table(result: dict) -> None:
    """The run's table and targets (from its JSON result alone)."""
    steps, best = result["settings"]["steps"], result["best_baseline"]
    print(
        f"\nbest baseline: {best}, final learnable held-out loss "
        f"{result['best_baseline_final_learnable']:.4f} (at step "
        f"{result['best_baseline_steps']:.0f} of {steps})"
    )
    head = f"{'mixture':<13} {'steps':>6} {'ratio':>6} " + " ".join(f"{d:>8}" for d in DOMAINS)
    head += (
        f" {'learn':>7} {'÷unif':>6} {'noise w':>13} {'halved at':>16} {'update':>7} {'report':>7}"
    )
    print(head)
    for m, r in result["compared"].items():
        reached = (
            "never" if r["steps_to_best_baseline"] is None else f"{r['steps_to_best_baseline']:.0f}"
        )
        ratio = "–" if r["steps_ratio"] is None else f"{r['steps_ratio']:.2f}"
        noise = f"{r['weights_start']['noise']:.2f} → {r['weights_end']['noise']:.2f}"
        print(
            f"{m:<13} {reached:>6} {ratio:>6} "
            + " ".join(f"{r['final_held_out'][d]:>8.4f}" for d in DOMAINS)
            + f" {r['final_learnable_mean']:>7.4f} {r['learnable_vs_uniform']:>6.3f} {noise:>13}"
            + f" {str(r['noise_halved_at_step']):>16} {r['overhead_fraction']:>7.2%}"
            + f" {r['report_fraction']:>7.2%}"
        )
    print("\ntargets:")
    for t in result["targets"]:
        value = "–" if t["value"] is None else f"{t['value']:.4g}"
        print(f"  [{'met' if t['met'] else 'MISSED'}] {t['target']}: {value}")


# --- main ----------------------------------------------------------------------------------------


QUICK = {"docs": 300, "steps": 40, "seeds": 1, "eval_every": 10, "dim": 32, "layers": 1}


def main(argv=None) -> int:
    from energon_platform.loader.mixing import METHODS

    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.mixing",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--docs", type=int, default=2200, help="documents per domain (train + val)")
    p.add_argument("--length", type=int, default=60, help="tokens per document")
    p.add_argument("--val-fraction", type=float, default=0.05, help="held-out share per domain")
    p.add_argument("--steps", type=int, default=240, help="training steps of every run")
    p.add_argument("--seeds", type=int, default=3, help="seeds per mixture (1234, 1235, ...)")
    p.add_argument("--batch", type=int, default=16, help="documents per step")
    p.add_argument("--dim", type=int, default=64, help="the model's width")
    p.add_argument("--layers", type=int, default=2, help="the model's transformer blocks")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=10, help="warmup steps")
    p.add_argument("--every", type=int, default=4, help="blend_adapt.every")
    p.add_argument("--lag", type=int, default=1, help="blend_adapt.lag")
    p.add_argument("--eval-every", type=int, default=20, help="held-out evaluation cadence")
    p.add_argument(
        "--methods", nargs="+", default=sorted(METHODS), help="the methods to run (all registered)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run in about a minute ({', '.join(f'{k} {v}' for k, v in QUICK.items())})",
    )
    p.add_argument(
        "--unpinned", action="store_true", help="record the files' digests, not check them"
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument(
        "--picture",
        type=Path,
        default=None,
        help="the weight paths' PNG (default with --json: beside it, NAME.png)",
    )
    p.add_argument(
        "--table", type=Path, metavar="JSON", help="only print the table of a saved run's JSON"
    )
    args = p.parse_args(argv)
    check_json_out(args.json)
    if args.table:
        print_table(json.loads(args.table.read_text()))
        return 0
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.steps % args.eval_every:
        p.error("--steps must be a multiple of --eval-every")
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        p.error(f"--methods: no method {unknown} (registered: {sorted(METHODS)})")
    os.environ["TQDM_DISABLE"] = "1"
    import torch

    torch.set_num_threads(1)
    from task_encoders.tokenization import DEFAULT_TOKENIZER_DIR, load_hf_tokenizer

    record = run_record()
    began = time.perf_counter()
    tokenizer = load_hf_tokenizer(DEFAULT_TOKENIZER_DIR)
    docs, corpus = documents(tokenizer, args.docs, args.length, 1234, pinned=not args.unpinned)
    sizes = {**corpus["source_tokens"], "noise": corpus["tokens_per_domain"]}
    mixtures = {
        "uniform": dict.fromkeys(DOMAINS, 1.0),
        "proportional": {d: sizes[d] / sum(sizes.values()) for d in DOMAINS},
        **{m: dict.fromkeys(DOMAINS, 1.0) for m in args.methods},
    }
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-mixing-") as tmp:
        base = Path(tmp)
        print(
            f"== {len(DOMAINS)} domains x {corpus['documents']} documents of {args.length} tokens",
            flush=True,
        )
        make_datasets(base, docs, args.val_fraction)
        vals = None
        for mixture, weights in mixtures.items():
            runs[mixture] = []
            for seed in range(1234, 1234 + args.seeds):
                cfg = run_config(base, mixture, weights, seed, args)
                vals = vals or val_loaders(base, cfg, 64)
                t0 = time.perf_counter()
                run = train(cfg, vals, args.steps, args.eval_every)
                runs[mixture].append(run)
                last = run["held_out"][args.steps]
                print(
                    f"   {mixture:<13} seed {seed}: {time.perf_counter() - t0:5.1f} s, final "
                    + " ".join(f"{d} {last[d]:.3f}" for d in DOMAINS)
                    + f", noise w {run['weights'][0]['noise']:.2f} → {run['weights'][-1]['noise']:.2f}",
                    flush=True,
                )
    summary = summarise(runs, args)
    params = runs["uniform"][0]["params"]
    result = {
        "benchmark": "mixing",
        **finish_record(record),
        "settings": {
            "domains": list(DOMAINS),
            "learnable": list(LEARNABLE),
            "documents_per_domain": corpus["documents"],
            "tokens_per_document": args.length,
            "tokens_per_domain": corpus["tokens_per_domain"],
            "val_fraction": args.val_fraction,
            "steps": args.steps,
            "seeds": args.seeds,
            "batch_documents": args.batch,
            "model": f"reference LM: dim {args.dim}, {args.layers} layers, 4 heads, "
            f"{params:,} parameters, vocab 2048",
            "lr": args.lr,
            "every": args.every,
            "lag": args.lag,
            "eval_every": args.eval_every,
            "threads": 1,
            "pinned": not args.unpinned,
        },
        "corpus": {
            "files": corpus["files"],
            "source_tokens": corpus["source_tokens"],
            "noise_words": corpus["noise_words"],
            "proportional_weights": mixtures["proportional"],
        },
        **summary,
        "curves": {m: {str(s): v for s, v in mean_curve(r).items()} for m, r in runs.items()},
        "seconds": time.perf_counter() - began,
    }
    picture = args.picture or (args.json.with_suffix(".png") if args.json else None)
    if picture:
        result["picture"] = draw(result, picture)
    print_table(result)
    write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
