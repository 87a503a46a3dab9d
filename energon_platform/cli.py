"""The ``energon-platform`` command: thin argument parsing over the packages' functions.

Exit status: 0 success; 1 the job ran but failed its own check (too many skipped samples);
2 wrong arguments, a missing input or an output that cannot be used (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXAMPLES = """examples:
  energon-platform convert coco --annotations captions.json --images images/ --out shards/
  energon-platform convert folder --root photos/ --out shards/ --image-format keep --max-side 1024
  energon-platform convert manifest --manifest laion.parquet --image-column jpg --text-column caption --out shards/
  energon-platform convert librispeech --root LibriSpeech/train-clean-100 --out speech/ --workers 8
  energon-platform convert audio-manifest --manifest train.jsonl --out speech/ --executor ray
  energon-platform info shards/
"""


def _fraction(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return v


def _non_negative(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return v


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return v


def _add_convert(sub) -> None:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("output")
    g.add_argument("--out", required=True, help="output folder (created; resumable; refused if it holds other data)")
    g.add_argument("--samples-per-shard", type=_positive, default=512, help="samples per tar shard (default 512)")
    g.add_argument("--val-fraction", type=_fraction, default=0.0,
                   help="fraction of keys (chosen by a hash of the key) written as the val split (default 0)")
    g.add_argument("--image-format", choices=["png", "keep"], default="png",
                   help="png: lossless RGB re-encode with EXIF orientation applied (default); "
                        "keep: original JPEG/PNG/WebP bytes, validated by decoding")
    g.add_argument("--max-side", type=_positive, help="downscale images whose longest side exceeds this")
    g.add_argument("--max-pixels", type=_positive, default=89_478_485,
                   help="reject larger images as decompression bombs (default: PIL's limit)")
    g.add_argument("--audio-format", choices=["flac", "keep"], default="flac",
                   help="flac: FLAC (FLAC sources kept as they are, others re-encoded; default); keep: original bytes")
    g.add_argument("--max-error-fraction", type=_fraction, default=0.1,
                   help="exit non-zero when more than this fraction of samples is skipped (default 0.1)")
    g.add_argument("--overwrite", action="store_true", help="replace an existing conversion in --out")
    g = common.add_argument_group("execution")
    g.add_argument("--workers", type=_positive, default=1, help="parallel work units (processes or Ray CPUs)")
    g.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local processes (default) or Ray tasks; same output bytes either way")
    g.add_argument("--ray-address", help="Ray cluster address (default: start a local Ray instance)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("convert", help="repack a raw corpus into Energon-ready WebDataset shards",
                       description="Repack a raw image-text or audio-text corpus into deterministic, "
                                   "Energon-ready WebDataset shards. Bad records are skipped and counted "
                                   "in OUT/report.json and OUT/skipped.jsonl; a killed run resumes where it stopped.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="kind", required=True, metavar="SOURCE-KIND")
    k = kinds.add_parser("coco", parents=[common], help="COCO captions json + image folder")
    k.add_argument("--annotations", required=True, help="captions_*.json")
    k.add_argument("--images", required=True, help="folder the json's file_name entries are relative to")
    k = kinds.add_parser("folder", parents=[common], help="images with .txt/.json caption sidecars")
    k.add_argument("--root", required=True)
    k = kinds.add_parser("manifest", parents=[common], help="JSONL/CSV/TSV/Parquet image-text manifest")
    k.add_argument("--manifest", required=True, help="paths in it resolve relative to its folder")
    k.add_argument("--image-column", default="image", help="image path, or image bytes in Parquet (default: image)")
    k.add_argument("--text-column", default="caption", help="caption or list of captions (default: caption)")
    k.add_argument("--id-column", help="stable sample id (default: the image path, else the row number)")
    k.add_argument("--format", dest="fmt", choices=["jsonl", "csv", "tsv", "parquet"], help="default: from the extension")
    k = kinds.add_parser("librispeech", parents=[common], help="SPK/CHAP/SPK-CHAP-UTT.flac + SPK-CHAP.trans.txt")
    k.add_argument("--root", required=True)
    k = kinds.add_parser("audio-manifest", parents=[common], help='NeMo JSONL {"audio_filepath", "text", "duration"}')
    k.add_argument("--manifest", required=True)
    p.set_defaults(func=cmd_convert)


READER_ARGS = {
    "coco": ("annotations", "images"),
    "folder": ("root",),
    "manifest": ("manifest", "image_column", "text_column", "id_column", "fmt"),
    "librispeech": ("root",),
    "audio-manifest": ("manifest",),
}


def cmd_convert(args) -> int:
    from converters.convert import ConvertOptions, run_conversion, summarize
    from converters.media import AudioOptions, ImageOptions

    opts = ConvertOptions(
        out=args.out, samples_per_shard=args.samples_per_shard, val_fraction=args.val_fraction,
        image=ImageOptions(args.image_format, args.max_side, args.max_pixels),
        audio=AudioOptions(args.audio_format), workers=args.workers, executor=args.executor,
        ray_address=args.ray_address, max_error_fraction=args.max_error_fraction,
        overwrite=args.overwrite, progress=not args.no_progress,
    )
    outcome = run_conversion(args.kind, {a: getattr(args, a) for a in READER_ARGS[args.kind]}, opts)
    if outcome.already_done:
        print(f"{args.out}: already converted with these inputs and options; nothing to do")
    print(summarize(outcome.report))
    print(f"shards: {Path(args.out).resolve()}\nreport: {Path(args.out).resolve() / 'report.json'}")
    return 0 if outcome.ok else 1


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="shards, samples per split, modalities and the conversion report of a dataset")
    p.add_argument("path", help="a folder written by `energon-platform convert`")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_info)


def cmd_info(args) -> int:
    from converters.info import dataset_info

    info = dataset_info(args.path)
    print(json.dumps(info, indent=1, sort_keys=True) if args.json else info["text"])
    return 0


def _overrides(pairs: list[str]) -> dict:
    import yaml

    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--set expects KEY=VALUE, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def _add_run_args(p, workers_help: str) -> None:
    """Arguments every command that runs the trainer takes."""
    p.add_argument("--config", required=True, help="run config YAML (see configs/train_*.yaml)")
    p.add_argument("--num-workers", type=_non_negative, help=workers_help)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value, e.g. loader.seed=7")


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="the reference trainer (also under torchrun)",
                       description="Train the reference captioning model on a config. Under `torchrun "
                                   "--nproc-per-node N` every process is one data-parallel rank (gloo on CPU, "
                                   "nccl on GPU). Logs JSON lines to OUT/log.jsonl and checkpoints model, "
                                   "optimizer, RNG and data-loader state atomically.")
    _add_run_args(p, "loader workers per rank (may differ from the saved run)")
    p.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint in OUT")
    p.add_argument("--out", help="output folder (default: train.out of the config)")
    p.add_argument("--steps", type=_positive, help="total steps (default: train.steps of the config)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.train import train

    cfg = load_config(args.config, _overrides(args.set))
    train(cfg, resume=args.resume, num_workers=args.num_workers, out=args.out, steps=args.steps, quiet=args.quiet)
    return 0


def _add_check_resume(sub) -> None:
    p = sub.add_parser("check-resume", help="kill a run with SIGKILL mid-step, resume it, compare with an uninterrupted run",
                       description="Run the trainer twice: straight through, and killed with SIGKILL during step K "
                                   "then resumed from its latest checkpoint (optionally on another layout). "
                                   "Compares sample keys, tensor hashes and loss of every step after the resume "
                                   "point; writes OUT/report.json and OUT/loss.png; exits 1 on any difference.")
    _add_run_args(p, "loader workers per rank (default: the config's)")
    p.add_argument("--steps", type=_positive, required=True, help="steps of both runs")
    p.add_argument("--kill-at", type=_positive, required=True, help="the step during which the second run is killed")
    p.add_argument("--nproc", type=_positive, default=1, help="data-parallel ranks (torchrun) of both runs")
    p.add_argument("--resume-nproc", type=_positive, help="ranks for the resumed part (default: --nproc)")
    p.add_argument("--resume-workers", type=_non_negative, help="workers per rank for the resumed part")
    p.add_argument("--tolerance", type=float,
                   help="allowed |loss difference|. Default 0 (bit-exact, right on CPU with the same world size); "
                        "1e-5 when --resume-nproc changes the world size, since the gradient all-reduce then "
                        "sums in another order. Keys and tensors must match exactly in every case")
    p.add_argument("--out", default="out/check-resume", help="where runs, report.json and loss.png go")
    p.set_defaults(func=cmd_check_resume)


def cmd_check_resume(args) -> int:
    from energon_platform.resume_check import RunSpec, check_resume, verdict

    from energon_platform.config import load_config
    from energon_platform.source import SampleSource

    from energon_platform.loader import check_layout

    cfg = load_config(args.config, _overrides(args.set))  # fail here, in one line, not in a child
    SampleSource(str(cfg.data.path), cfg.data.train_split)
    for world in {args.nproc, args.resume_nproc or args.nproc}:
        check_layout(cfg, world)
    spec = RunSpec(args.config, args.steps, args.nproc, args.num_workers, tuple(args.set or ()))
    if args.tolerance is None:
        args.tolerance = 1e-5 if args.resume_nproc not in (None, args.nproc) else 0.0
    if not 2 <= args.kill_at <= args.steps:
        raise UsageError(f"--kill-at must be between 2 and --steps ({args.steps})")
    try:
        result = check_resume(spec, args.kill_at, Path(args.out), args.resume_nproc, args.resume_workers,
                              args.tolerance)
    except RuntimeError as e:  # a trainer process failed: its output tail is in the message
        print(f"energon-platform check-resume: {e}", file=sys.stderr)
        return 1
    print(verdict(result))
    print(f"report: {Path(args.out).resolve() / 'report.json'}\nplot:   {Path(args.out).resolve() / 'loss.png'}")
    return 0 if result["passed"] else 1


class UsageError(Exception):
    """Raised by commands for a user mistake: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="energon-platform",
        description="Multimodal data on megatron-energon: convert corpora to shards, encode, train with exact resume.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_convert(sub)
    _add_info(sub)
    _add_train(sub)
    _add_check_resume(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from converters.convert import ConvertError
    from converters.readers import InputError
    from energon_platform.checkpoint import CheckpointError
    from energon_platform.schedule import LayoutError
    from energon_platform.source import DatasetError
    from energon_platform.state import StateMismatchError
    from task_encoders.config import ConfigError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (InputError, ConvertError, UsageError, FileNotFoundError, ConfigError, DatasetError,
            StateMismatchError, LayoutError, CheckpointError) as e:
        print(f"energon-platform {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
