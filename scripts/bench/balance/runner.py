"""The command line and the one runner: each selected section run in `SECTIONS` order, its report
printed and the whole result written as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import scripts.bench.balance as package
from scripts.bench.balance.balance import balance_section, report_balance
from scripts.bench.balance.common import KINDS, SyntheticLengths
from scripts.bench.balance.demo import demo_section, report_demo
from scripts.bench.balance.llava import llava_section, report_llava
from scripts.bench.balance.long import long_section, report_long
from scripts.bench.balance.measured import TIMINGS, measured_section, report_measured
from scripts.bench.balance.mixing import mixing_section, report_mixing
from scripts.bench.balance.sizes import report_sizes, sizes_section
from scripts.bench.balance.train import TRAIN_WARMUP, TrainFailed, report_train, train_section
from scripts.bench.balance.train_measured import report_train_measured, train_measured_section
from scripts.bench.common import check_json_out, finish_record, run_record, write_json

#: name → (run(args) → dict, report(section, args) → lines), run in this order when selected
#: (``--sections``; ``train`` takes minutes, so only when asked: ``--train``).
SECTIONS = {
    "balance": (balance_section, report_balance),
    "long": (long_section, report_long),
    "demo": (demo_section, report_demo),
    "mixing": (mixing_section, report_mixing),
    "train": (train_section, report_train),
    "measured": (measured_section, report_measured),
    "train-measured": (train_measured_section, report_train_measured),
    "llava": (llava_section, report_llava),
    "sizes": (lambda args: sizes_section(args, SyntheticLengths), report_sizes),
}


def weights(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in KINDS or not value:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected KIND=WEIGHT with KIND one of {', '.join(KINDS)}"
            )
        out[name.strip()] = float(value)
    if any(v < 0 for v in out.values()) or sum(out.values()) <= 0:
        raise argparse.ArgumentTypeError("weights must be >= 0 with a positive sum")
    return {k: out.get(k, 0.0) for k in KINDS}


def build_parser() -> argparse.ArgumentParser:
    """The command line: its options and their defaults (`main` completes those left None)."""
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.balance",
        description=package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--json", type=Path, help="also write the results (with machine, date, load average) here"
    )
    p.add_argument("--quick", action="store_true", help="a few seconds: 40 steps, 8 ranks only")
    p.add_argument(
        "--sizes-steps",
        type=int,
        default=None,
        help="section sizes: global batches per case (default 200; --quick 40)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="global batches per variant (default 500; --quick 40)",
    )
    p.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=None,
        help="simulated data-parallel ranks (default 8 64)",
    )
    p.add_argument(
        "--rows-per-rank",
        type=int,
        default=2,
        help="K: rows (packed) or samples (unpacked) per rank",
    )
    p.add_argument(
        "--seq-len", type=int, default=4096, help="row length; every sample is clipped to it"
    )
    p.add_argument(
        "--linear",
        type=float,
        default=None,
        help="c of the attention cost L^2 + c*L (default seq_len)",
    )
    p.add_argument(
        "--weights",
        type=weights,
        default=weights("image_text=0.4,audio=0.2,text=0.4"),
        help="blend weights, KIND=W,... over image_text, audio, text (default 0.4, 0.2, 0.4)",
    )
    p.add_argument(
        "--tokens-per-tile",
        type=int,
        default=64,
        help="image tokens per tile (1-12 tiles per image)",
    )
    p.add_argument(
        "--audio-fps",
        type=float,
        default=25.0,
        help="audio frames per second (25: a 100 Hz mel spectrogram subsampled 4x)",
    )
    p.add_argument(
        "--caption-mu", type=float, default=3.5, help="log-mean of caption/transcript tokens"
    )
    p.add_argument(
        "--caption-sigma", type=float, default=0.8, help="log-sd of caption/transcript tokens"
    )
    p.add_argument("--text-mu", type=float, default=5.5, help="log-mean of text document tokens")
    p.add_argument("--text-sigma", type=float, default=1.2, help="log-sd of text document tokens")
    p.add_argument(
        "--pack-group",
        type=int,
        default=None,
        help="today's pack group (samples packed together); default: seq_len / mean length, so K "
        "groups fill about K rows",
    )
    p.add_argument(
        "--packing-buffer-size",
        type=int,
        default=None,
        help="Energon's packing_buffer_size (default: the pack group, i.e. the same setting)",
    )
    p.add_argument(
        "--window", type=int, default=4096, help="our planner's look-ahead (loader.balance.window)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--sections",
        nargs="+",
        choices=list(SECTIONS),
        default=["balance"],
        help="what to measure (default: balance, the simulation; long: carried samples over "
        "--long-steps batches; demo: the embedded demo blend through the loader's planner; train: "
        "the reference model's tokens/s on 2 gloo ranks; mixing: the demo blend with balance while "
        "blend_adapt moves its weights, against fixed weights; measured: the two-tower model's timed "
        "micro-batches per method; train-measured: the two-tower model's steps/s on 2 gloo "
        "ranks, balance none against measured, after calibrating it; sizes: the planner on every "
        "dataset size, g to 10 x window, single and blended with a large one, packed and "
        "unpacked, attention and measured)",
    )
    p.add_argument(
        "--long-steps",
        type=int,
        default=10_000,
        help="section long: global batches of one planner run",
    )
    p.add_argument(
        "--demo-steps", type=int, default=60, help="section demo: global batches per seed"
    )
    p.add_argument(
        "--demo-seeds", type=int, nargs="+", default=[1, 5, 7, 8], help="section demo: loader seeds"
    )
    p.add_argument(
        "--mixing-steps",
        type=int,
        default=None,
        help="section mixing: global batches per run (default 30; --quick 12)",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="also measure the reference model's tokens/s on 2 gloo ranks, today vs ours (minutes)",
    )
    p.add_argument(
        "--train-steps",
        type=int,
        default=40,
        help="steps per training run (the first 2 are warm-up)",
    )
    p.add_argument(
        "--train-rounds", type=int, default=3, help="interleaved rounds of (today, ours) runs"
    )
    p.add_argument(
        "--train-groups",
        type=int,
        default=4,
        help="today's global_batch_size: pack groups of 16 samples per step (about 4 rows each)",
    )
    p.add_argument(
        "--train-rows", type=int, default=16, help="ours: global_batch_size in rows of 128 tokens"
    )
    p.add_argument("--train-dim", type=int, default=128, help="the reference model's model.dim")
    p.add_argument("--train-layers", type=int, default=2, help="the reference model's model.layers")
    p.add_argument(
        "--measured",
        action="store_true",
        help="also calibrate the two-tower model and time each rank's micro-batches per method "
        "(minutes; --quick about one)",
    )
    p.add_argument(
        "--scale",
        type=int,
        default=8,
        help="section measured: positions are the blend's / this (default 8: micro-batches of "
        "tens of milliseconds, whose timing spreads less than at 16)",
    )
    p.add_argument(
        "--timing",
        choices=TIMINGS,
        default="plain",
        help="section measured: plain (each micro-batch alone, the least of 3 rounds: what the "
        "targets are stated on) or paired (each timing also divided by two timings of a fixed "
        "reference micro-batch around it, which divides out the machine's slow drift and shows "
        "how much of a spread is the micro-batches' own; twice the time, not judged on the "
        "targets)",
    )
    p.add_argument(
        "--measured-steps",
        type=int,
        default=None,
        help="section measured: global batches per method (default 12; --quick 3)",
    )
    p.add_argument(
        "--measured-ranks",
        type=int,
        nargs="+",
        default=None,
        help="section measured: simulated ranks (default 8 64; --quick 8)",
    )
    p.add_argument(
        "--calibrate-batches",
        type=int,
        default=None,
        help="sections measured, train-measured and llava: micro-batches calibrate times, "
        "a quarter of them held back to measure its error (default 96, so the held-back p90 is "
        "not the second-worst of a dozen; --quick 24)",
    )
    p.add_argument(
        "--llava-batch",
        type=int,
        default=2,
        help="section llava: samples per micro-batch LLaVAModel is timed on (default 2)",
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target is not met")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    args.steps = args.steps or (40 if args.quick else 500)
    args.ranks = args.ranks or ([8] if args.quick else [8, 64])
    args.linear = float(args.seq_len if args.linear is None else args.linear)
    if min(args.steps, args.rows_per_rank, args.seq_len, *args.ranks) < 1 or args.window < 16:
        print(
            "error: --steps, --ranks, --rows-per-rank, --seq-len must be >= 1 and --window >= 16",
            file=sys.stderr,
        )
        return 2
    if args.train and "train" not in args.sections:
        args.sections.append("train")
    if args.measured and "measured" not in args.sections:
        args.sections.append("measured")
    args.measured_steps = args.measured_steps or (3 if args.quick else 12)
    args.mixing_steps = args.mixing_steps or (12 if args.quick else 30)
    args.measured_ranks = args.measured_ranks or ([8] if args.quick else [8, 64])
    args.calibrate_batches = args.calibrate_batches or (24 if args.quick else 96)
    if (
        min(
            args.scale,
            args.measured_steps,
            args.calibrate_batches - 3,
            args.llava_batch,
            *args.measured_ranks,
        )
        < 1
    ):
        print(
            "error: --scale, --measured-steps, --measured-ranks, --llava-batch must be >= 1 and "
            "--calibrate-batches >= 4",
            file=sys.stderr,
        )
        return 2
    if (
        min(
            args.train_steps - TRAIN_WARMUP,
            args.train_rounds,
            args.train_groups - 1,
            args.train_rows - 1,
            args.train_dim,
            args.train_layers,
        )
        < 1
        or args.train_groups % 2
        or args.train_rows % 2
    ):
        print(
            f"error: --train-steps must be > {TRAIN_WARMUP}, --train-groups and --train-rows even (2 ranks), "
            "the other --train-* >= 1",
            file=sys.stderr,
        )
        return 2
    for name in ("pack_group", "packing_buffer_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2

    result = {
        **run_record(),
    }
    t = time.perf_counter()
    lines = []
    for name, (run, report) in SECTIONS.items():
        if name not in args.sections:
            continue
        try:
            result[name] = run(args)
        except TrainFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        lines += report(result[name], args) + [""]
    result["seconds"] = time.perf_counter() - t
    finish_record(result)
    result["settings"] = {k: v for k, v in vars(args).items() if k not in ("json", "check")}
    print(
        f"{result['date']}, {result['machine']['cpus']} CPUs, load average before/after: "
        f"{result['load_before']} / {result['load_after']}, {result['seconds']:.1f} s\n"
    )
    print("\n".join(lines).rstrip())
    write_json(args.json, result)
    missed = [
        t
        for s in result.values()
        if isinstance(s, dict)
        for t in s.get("targets", [])
        if not t["met"]
    ]
    return 1 if args.check and missed else 0
