"""The ``energon-platform`` command: thin argument parsing over the packages' functions.

Exit status: 0 success; 1 the job ran but failed its own check (too many skipped samples);
2 wrong arguments, a missing input or an output that cannot be used (one line, no traceback);
141 the reader of standard output went away (``| head -1``), as for a process ended by SIGPIPE
(nothing printed).
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
  energon-platform convert text --manifest data/text_mini/documents.jsonl --id-column id --out docs/
  energon-platform convert video --root clips/ --out shards/ --max-side 256 --max-seconds 10
  energon-platform convert video --manifest webvid.csv --out shards/   # videoid, name, path columns
  energon-platform convert 3d --root data/mesh_mini/shapes --out shapes/   # or --manifest cap3d.csv
  energon-platform convert llava --json llava_instruct.json --images coco/ --out sft/
  energon-platform info shards/
"""


def _format_arg(parser: argparse.ArgumentParser) -> None:
    """``--format`` of a manifest (``fmt``)."""
    parser.add_argument(
        "--format",
        dest="fmt",
        choices=["jsonl", "csv", "tsv", "parquet"],
        help="default: from the extension",
    )


def _folder_or_manifest(parser: argparse.ArgumentParser, files: str, stem: str, paths: str) -> None:
    """``--root`` (a folder of ``files`` with ``STEM.txt``/``STEM.json`` captions) or ``--manifest``."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--root",
        help=f"folder searched recursively for {files}; captions from {stem}.txt or "
        f"{stem}.json beside each",
    )
    src.add_argument(
        "--manifest", help=f"JSONL/CSV/TSV/Parquet; {paths} resolve relative to its folder"
    )


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


def _non_negative_float(text: str) -> float:
    v = float(text)
    if not v >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return v


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return v


def _add_convert(sub) -> None:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("output")
    g.add_argument(
        "--out",
        required=True,
        help="output folder (created; resumable; refused if it holds other data), or object storage "
        "msc://PROFILE/prefix (MSC_CONFIG profile; written to a local staging folder, shards "
        "uploaded as they finish, metadata last)",
    )
    g.add_argument(
        "--samples-per-shard",
        type=_positive,
        default=512,
        help="samples per tar shard (default 512)",
    )
    g.add_argument(
        "--val-fraction",
        type=_fraction,
        default=0.0,
        help="fraction of keys (chosen by a hash of the key) written as the val split (default 0)",
    )
    g.add_argument(
        "--max-error-fraction",
        type=_fraction,
        default=0.1,
        help="exit non-zero when more than this fraction of samples is skipped (default 0.1)",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing conversion in --out; removes only what a conversion wrote and "
        "refuses (removing nothing) if --out holds anything else (a folder or prefix without a "
        "conversion, or a file or object no conversion wrote) or is being written",
    )
    g = common.add_argument_group("execution")
    g.add_argument(
        "--workers", type=_positive, default=1, help="parallel work units (processes or Ray CPUs)"
    )
    g.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="local processes (default) or Ray tasks; same output bytes either way",
    )
    g.add_argument(
        "--ray-address",
        help="Ray cluster address HOST:PORT, ray://HOST:PORT or auto (default: start a "
        "local Ray instance); an unreachable one fails within 10 s",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    # media options only where they apply: `convert video --help` lists no image or audio option
    image = argparse.ArgumentParser(add_help=False)
    g = image.add_argument_group("images")
    g.add_argument(
        "--image-format",
        choices=["png", "keep"],
        default="png",
        help="png: lossless RGB re-encode with EXIF orientation applied (default); "
        "keep: original JPEG/PNG/WebP bytes, validated by decoding",
    )
    g.add_argument(
        "--max-side", type=_positive, help="downscale images whose longest side exceeds this"
    )
    g.add_argument(
        "--max-pixels",
        type=_positive,
        default=89_478_485,
        help="reject larger images as decompression bombs (default: PIL's limit)",
    )
    audio = argparse.ArgumentParser(add_help=False)
    audio.add_argument_group("audio").add_argument(
        "--audio-format",
        choices=["flac", "keep"],
        default="flac",
        help="flac: FLAC at the source's bit depth (16/24; FLAC sources kept; 32-bit and float "
        "PCM kept as WAV; default); keep: original FLAC/WAV/MP3 bytes, others as flac. "
        "The part is named by the detected format, never the file name",
    )

    p = sub.add_parser(
        "convert",
        help="repack a raw corpus into Energon-ready WebDataset shards",
        description="Repack a raw image-text, audio-text or text-only corpus into deterministic, "
        "Energon-ready WebDataset shards. Bad records are skipped and counted "
        "in OUT/report.json and OUT/skipped.jsonl; a killed run resumes where it stopped.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = p.add_subparsers(dest="kind", required=True, metavar="SOURCE-KIND")
    k = kinds.add_parser("coco", parents=[common, image], help="COCO captions json + image folder")
    k.add_argument("--annotations", required=True, help="captions_*.json")
    k.add_argument(
        "--images", required=True, help="folder the json's file_name entries are relative to"
    )
    k = kinds.add_parser(
        "folder", parents=[common, image], help="images with .txt/.json caption sidecars"
    )
    k.add_argument(
        "--root",
        required=True,
        help="folder searched recursively for images; captions from IMG.txt or IMG.json beside each",
    )
    k = kinds.add_parser(
        "manifest", parents=[common, image], help="JSONL/CSV/TSV/Parquet image-text manifest"
    )
    k.add_argument("--manifest", required=True, help="paths in it resolve relative to its folder")
    k.add_argument(
        "--image-column",
        default="image",
        help="image path, or image bytes in Parquet (default: image)",
    )
    k.add_argument(
        "--text-column", default="caption", help="caption or list of captions (default: caption)"
    )
    k.add_argument(
        "--id-column", help="stable sample id (default: the image path, else the row number)"
    )
    _format_arg(k)
    k = kinds.add_parser(
        "librispeech",
        parents=[common, audio],
        help="SPK/CHAP/SPK-CHAP-UTT.flac + SPK-CHAP.trans.txt",
    )
    k.add_argument(
        "--root",
        required=True,
        help="LibriSpeech split folder holding SPK/CHAP/ chapters, e.g. LibriSpeech/train-clean-100",
    )
    k = kinds.add_parser(
        "audio-manifest",
        parents=[common, audio],
        help='NeMo JSONL {"audio_filepath", "text", "duration"}',
    )
    k.add_argument(
        "--manifest",
        required=True,
        help="JSONL manifest; audio paths resolve relative to its folder",
    )
    k = kinds.add_parser(
        "llava",
        parents=[common, image],
        help="LLaVA-style instruction JSON + image folder (conversations)",
        description='LLaVA-style instruction data: a JSON array (or JSON lines) of {"id", "image" or '
        '"images", "conversations": [{"from": "human"|"gpt"|"system", "value"}]} with '
        "<image> placeholders; one sample per entry (several images, or none, allowed).",
    )
    k.add_argument(
        "--json",
        dest="json_file",
        required=True,
        help="the instruction JSON (.json array or .jsonl)",
    )
    k.add_argument(
        "--images", required=True, help="folder the entries' image paths are relative to"
    )
    k = kinds.add_parser(
        "text",
        parents=[common],
        help="JSONL/Parquet/CSV/TSV of text documents (Energon TextSample)",
    )
    k.add_argument("--manifest", required=True, help="one document per JSONL line or table row")
    k.add_argument(
        "--text-column", default="text", help="the document text, a string (default: text)"
    )
    k.add_argument("--id-column", help="stable document id (default: the row number)")
    _format_arg(k)
    k = kinds.add_parser(
        "video",
        parents=[common],
        help="videos with .txt/.json sidecars, or a WebVid-style manifest",
        description="Videos (MP4/MOV, WebM/MKV kept as their bytes after a full decode check; "
        "other containers re-encoded as MP4) with captions, from a folder or a manifest. "
        "--max-side/--max-seconds re-encode videos that exceed them (H.264, fixed settings).",
    )
    _folder_or_manifest(k, "videos", "VID", "video paths")
    k.add_argument(
        "--video-column",
        default="path",
        help="video path, or video bytes in Parquet (default: path)",
    )
    k.add_argument(
        "--text-column",
        default="name",
        help="caption or list of captions (default: name, as in WebVid)",
    )
    k.add_argument(
        "--id-column",
        default="videoid",
        help="stable sample id (default: videoid; '' for the video path without extension)",
    )
    _format_arg(k)
    g = k.add_argument_group("video")
    g.add_argument(
        "--max-side", type=_positive, help="re-encode videos whose longest side exceeds this"
    )
    g.add_argument(
        "--max-seconds",
        type=_positive_float,
        help="re-encode longer videos, keeping their first seconds "
        "(counted in report.json; text.json keeps the original duration)",
    )
    k = kinds.add_parser(
        "3d",
        parents=[common],
        help="meshes / point clouds with .txt/.json sidecars, or a Cap3D-style manifest",
        description="Meshes (OBJ, PLY, OFF, STL, GLB; glTF re-encoded as GLB) and point clouds (PLY, "
        "NPY (N, 3|6)) with captions, from a folder or a manifest; each file is parsed in "
        "full and kept as its bytes; text.json records counts, bounds and colours.",
    )
    _folder_or_manifest(k, "3D files", "NAME", "paths")
    k.add_argument(
        "--path-column",
        default="path",
        help="3D file path, or its bytes in Parquet (default: path)",
    )
    k.add_argument(
        "--text-column",
        default="caption",
        help="caption or list of captions (default: caption, as in Cap3D)",
    )
    k.add_argument(
        "--id-column",
        default="uid",
        help="stable sample id (default: uid; '' for the path without extension)",
    )
    _format_arg(k)
    p.set_defaults(func=cmd_convert)


READER_ARGS = {
    "coco": ("annotations", "images"),
    "folder": ("root",),
    "manifest": ("manifest", "image_column", "text_column", "id_column", "fmt"),
    "librispeech": ("root",),
    "audio-manifest": ("manifest",),
    "text": ("manifest", "text_column", "id_column", "fmt"),
    "llava": ("json_file", "images"),
    "video": ("root", "manifest", "video_column", "text_column", "id_column", "fmt"),
    "3d": ("root", "manifest", "path_column", "text_column", "id_column", "fmt"),
}


def cmd_convert(args) -> int:
    from converters.convert import ConvertOptions, run_conversion, summarize
    from converters.media import AudioOptions, ImageOptions, VideoOptions

    video = (
        args.kind == "video"
    )  # --max-side re-encodes videos there, and leaves the image options alone
    image = ImageOptions(
        getattr(args, "image_format", "png"),
        None if video else getattr(args, "max_side", None),
        getattr(args, "max_pixels", ImageOptions().max_pixels),
    )  # kinds without them: defaults
    opts = ConvertOptions(
        out=args.out,
        samples_per_shard=args.samples_per_shard,
        val_fraction=args.val_fraction,
        image=image,
        audio=AudioOptions(getattr(args, "audio_format", "flac")),
        workers=args.workers,
        executor=args.executor,
        video=VideoOptions(args.max_side, args.max_seconds) if video else VideoOptions(),
        ray_address=args.ray_address,
        max_error_fraction=args.max_error_fraction,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    outcome = run_conversion(args.kind, {a: getattr(args, a) for a in READER_ARGS[args.kind]}, opts)
    if outcome.already_done:
        print(f"{args.out}: already converted with these inputs and options; nothing to do")
    if outcome.repaired:
        print(
            f"{args.out}: rewrote {len(outcome.repaired)} shard(s) found missing or changed: "
            f"{', '.join(outcome.repaired[:5])}{', ...' if len(outcome.repaired) > 5 else ''}"
        )
    print(summarize(outcome.report))
    where = outcome.uploaded_to or Path(args.out).resolve()
    print(f"shards: {where}\nreport: {where}/report.json")
    return 0 if outcome.ok else 1


def _add_info(sub) -> None:
    p = sub.add_parser(
        "info",
        help="shards, samples per split, modalities and the conversion report of a dataset",
        description="Describe a converted dataset and check that it is whole: exits 1, naming "
        "them, when shards are missing or changed size since the conversion.",
    )
    p.add_argument("path", help="a folder written by `energon-platform convert`")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_info)


def cmd_info(args) -> int:
    from converters.info import dataset_info

    info = dataset_info(args.path)
    print(json.dumps(info, indent=1, sort_keys=True) if args.json else info["text"])
    return 0 if info["healthy"] else 1


def _add_verify(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="check every shard of a converted dataset against its recorded sha256",
        description="Read every shard of a dataset written by `energon-platform convert` (a folder "
        "or msc://PROFILE/prefix) and compare it with the sha256 its conversion "
        "recorded in report.json. Exits 1 naming each missing or changed shard.",
    )
    p.add_argument("path", help="the dataset folder or msc:// URL")
    p.add_argument("--json", action="store_true", help="print the per-shard result as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args) -> int:
    from converters.verify import verify_dataset

    result = verify_dataset(args.path, progress=not args.no_progress)
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        n = len(result["shards"])
        for name in result["bad"]:
            print(f"  {result['shards'][name]}: {name}")
        for name in result["missing_files"]:
            print(f"  missing (the loader needs it): {name}")
        gone = len(result["missing_files"])
        print(
            f"{n - len(result['bad'])} of {n} shards intact ({result['bytes'] / 1e6:.1f} MB read)"
            + (f"; {gone} file(s) the loader needs missing" if gone else "")
            + ("" if result["ok"] else "; restore them or run the same convert command again")
        )
    return 0 if result["ok"] else 1


def _override_text(pair: str, value: str) -> str:
    """The YAML text of a ``--set KEY=VALUE``: ``@FILE`` reads FILE (``loader.exclude=@rules.yaml``),
    anything else is the value itself (a plain YAML value cannot start with ``@``)."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text()
    except OSError as e:
        raise UsageError(
            f"--set {pair}: cannot read {value[1:]} ({e.strerror or e}); give KEY=@FILE with a "
            f"readable YAML file"
        ) from None


def _overrides(pairs: list[str]) -> dict:
    import yaml

    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = yaml.safe_load(_override_text(pair, value))
        except yaml.YAMLError as e:
            raise UsageError(
                f"--set {pair}: the value is not valid YAML ({getattr(e, 'problem', None) or e})"
            ) from None
    return out


def _add_run_args(p, workers_help: str, config_required: bool = True) -> None:
    """Arguments every command that runs the trainer takes."""
    p.add_argument(
        "--config", required=config_required, help="run config YAML (see configs/train_*.yaml)"
    )
    p.add_argument("--num-workers", type=_non_negative, help=workers_help)
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. loader.seed=7 (KEY=@FILE: the value is FILE's YAML)",
    )


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="the reference trainer (also under torchrun)",
        description="Train the reference captioning model on a config. Under `torchrun "
        "--nproc-per-node N` every process is one data-parallel rank (gloo on CPU, "
        "nccl on GPU). Logs JSON lines to OUT/log.jsonl and checkpoints model, "
        "optimizer, RNG and data-loader state atomically.",
    )
    _add_run_args(p, "loader workers per rank (may differ from the saved run)")
    p.add_argument(
        "--resume", action="store_true", help="continue from the latest complete checkpoint in OUT"
    )
    p.add_argument("--out", help="output folder (default: train.out of the config)")
    p.add_argument(
        "--steps", type=_positive, help="total steps (default: train.steps of the config)"
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print no per-step lines (warnings and errors still print)",
    )
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.training.train import train

    cfg = load_config(args.config, _overrides(args.set))
    train(
        cfg,
        resume=args.resume,
        num_workers=args.num_workers,
        out=args.out,
        steps=args.steps,
        quiet=args.quiet,
    )
    return 0


def _add_calibrate(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="time a model on micro-batches of a config's data and fit its cost coefficients",
        description="Draw micro-batches from a run config's training data (no loader workers), "
        "pick N that spread the cost features (text only, images, many tiles, long "
        "captions, mixed), time forward + backward of each on one thread (a warm-up run "
        "excluded, the least of K runs kept) and fit non-negative seconds per unit of each "
        "feature (time = sum of coefficient x feature). One micro-batch in four is held back "
        "to measure the prediction's relative error. Prints predicted vs measured times and "
        "writes --out: coefficients, R², each feature's share of the time, the held-back "
        "p50/p90 error, the model and the encoder configuration's digest. Refuses (writing "
        "nothing) a fit whose p90 error exceeds 15%.",
    )
    p.add_argument("--config", required=True, help="run config YAML (its data and encoder)")
    p.add_argument(
        "--model",
        metavar="FILE_OR_MODULE:FACTORY",
        help="FACTORY(encoder) returns a torch.nn.Module whose forward(batch) returns a scalar "
        "loss (e.g. my_model.py:build); default: the two-tower reference model of the "
        "config's model section",
    )
    p.add_argument(
        "--micro-batches",
        type=_positive,
        default=24,
        help="micro-batches to time, at least 4 (default 24)",
    )
    p.add_argument(
        "--repeats", type=_positive, default=3, help="timed runs per micro-batch (default 3)"
    )
    p.add_argument("--out", required=True, help="the cost file to write (JSON)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. loader.micro_batch_size=4",
    )
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.training.calibrate import (
        CalibrationError,
        calibrate_run,
        check_fit,
        format_table,
        load_factory,
        write_report,
    )

    cfg = load_config(args.config, _overrides(args.set))
    try:
        factory = load_factory(args.model) if args.model else None
        report = calibrate_run(
            cfg,
            factory,
            model_name=args.model or "two_tower",
            micro_batches=args.micro_batches,
            repeats=args.repeats,
            progress=not args.no_progress,
        )
        print(format_table(report))
        check_fit(report)
    except CalibrationError as e:
        raise UsageError(str(e)) from None
    write_report(report, args.out)
    print(f"wrote {args.out}")
    return 0


CHECK_RESUME_EXAMPLES = """examples:
  energon-platform check-resume --config configs/train_image_text.yaml --steps 30 --kill-at 17
  energon-platform check-resume --steps 12 --kill-at 8 \\
      --cmd "torchrun --standalone --nproc-per-node 2 scripts/examples/torchtitan_style_loop.py --config run.yaml --out {out} --steps 12" \\
      --resume-cmd "torchrun --standalone --nproc-per-node 2 scripts/examples/torchtitan_style_loop.py --config run.yaml --out {out} --steps 12 --resume"
  energon-platform check-resume --steps 12 --kill-at 8 --log-format megatron \\
      --cmd "python scripts/examples/megatron_style_loop.py --config run.yaml --save {out} --train-iters 12" \\
      --resume-cmd "python scripts/examples/megatron_style_loop.py --config run.yaml --save {out} --load {out} --train-iters 12"
  ... --log-format regex --regex 'iter (?P<step>\\d+): loss (?P<loss>[-+.\\deE]+)'   # any other trainer's lines
"""


def _add_check_resume(sub) -> None:
    p = sub.add_parser(
        "check-resume",
        help="kill a run with SIGKILL mid-step, resume it, compare with an uninterrupted run",
        description="Run a trainer twice: straight through, and killed with SIGKILL (its whole "
        "process tree) during step K, then resumed from its latest checkpoint. Compares "
        "every step after the resume point; writes OUT/report.json and OUT/loss.png; "
        "exits 1 on any difference. Two forms: --config runs the reference trainer "
        "(optionally resumed on another layout) and compares sample keys, tensor hashes "
        "and loss; --cmd/--resume-cmd run any training command, {out} in them being each "
        "run's own folder, and read its steps from a log (--log-format): exact (keys, "
        "digests, loss) where the log carries keys and batch digests (StepLog), else "
        "|Δloss| <= 0.01 at every compared step.",
        epilog=CHECK_RESUME_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_args(p, "loader workers per rank (default: the config's)", config_required=False)
    p.add_argument("--steps", type=_positive, required=True, help="steps of both runs")
    p.add_argument(
        "--kill-at",
        type=_positive,
        required=True,
        help="K: the second run is killed once step K-1 is logged, while step K is in flight. A "
        "trainer that logs a step before it checkpoints it (the reference trainer does) is "
        "then killed while writing checkpoint K-1, so its saving must be atomic and it resumes "
        "from the checkpoint before: K must be at least 2 steps after the first checkpoint "
        "(with --config, >= train.checkpoint_every + 2)",
    )
    p.add_argument(
        "--nproc", type=_positive, help="data-parallel ranks (torchrun) of both runs (default 1)"
    )
    p.add_argument(
        "--resume-nproc", type=_positive, help="ranks for the resumed part (default: --nproc)"
    )
    p.add_argument(
        "--resume-workers", type=_non_negative, help="workers per rank for the resumed part"
    )
    p.add_argument(
        "--tolerance",
        type=_non_negative_float,
        help="allowed |loss difference|. Default 0 (bit-exact, right on CPU with the same world size); "
        "1e-5 when --resume-nproc changes the world size, since the gradient all-reduce then "
        "sums in another order. Keys and tensors must match exactly in every case. With --cmd: "
        "0 when the log carries keys and batch digests, else 0.01",
    )
    p.add_argument(
        "--out",
        default="out/check-resume",
        help="where runs, report.json and loss.png go: a new or empty folder, or one an earlier check "
        "made (a folder holding anything else is refused)",
    )
    g = p.add_argument_group("any training command (instead of --config)")
    g.add_argument(
        "--cmd",
        help="the training command (a shell command line) that runs --steps steps and "
        'checkpoints into {out}; e.g. "torchrun ... train.py --out {out}"',
    )
    g.add_argument(
        "--resume-cmd", help="the command that continues a run from its latest checkpoint in {out}"
    )
    g.add_argument(
        "--log",
        help="the steps' log, with {out} (default: {out}/steps.jsonl for jsonl, else the "
        "command's own output)",
    )
    g.add_argument(
        "--log-format",
        choices=["jsonl", "megatron", "torchtitan", "regex"],
        help="jsonl (default): StepLog's JSON lines; megatron: Megatron-LM's 'iteration N/ M | ... | "
        "lm loss: X |' lines (--log-interval 1); torchtitan: its 'step: N  loss: X' lines; "
        "regex: --regex",
    )
    g.add_argument(
        "--regex", help="with --log-format regex: a Python regex with named groups step and loss"
    )
    g.add_argument(
        "--timeout",
        type=_positive_float,
        default=3600,
        help="seconds each run may take (default 3600)",
    )
    p.set_defaults(func=cmd_check_resume)


def _check_resume_cmd(args) -> int:
    """``check-resume --cmd ... --resume-cmd ...`` (any training command)."""
    from energon_platform.training.resume_check import RunFailed, check_resume_cmd, verdict
    from energon_platform.training.resume_check.options import command_spec

    spec = command_spec(
        config=args.config,
        cmd=args.cmd,
        resume_cmd=args.resume_cmd,
        steps=args.steps,
        kill_at=args.kill_at,
        trainer_options={
            "--nproc": args.nproc,
            "--resume-nproc": args.resume_nproc,
            "--resume-workers": args.resume_workers,
            "--num-workers": args.num_workers,
            "--set": args.set,
        },
        log=args.log,
        log_format=args.log_format,
        regex=args.regex,
        tolerance=args.tolerance,
        timeout=args.timeout,
    )
    try:
        result = check_resume_cmd(spec, args.kill_at, Path(args.out))
    except (
        RunFailed
    ) as e:  # a run failed, or logged nothing we can read: its output tail is in the message
        print(f"energon-platform check-resume: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a --kill-at past the last step of a log counted from 0
        raise UsageError(str(e)) from None
    return _print_verdict(verdict(result), args.out, result["passed"])


def _print_verdict(text: str, out: str, passed: bool) -> int:
    """Print a check's verdict and where its report and plot are; the exit status."""
    print(text)
    print(
        f"report: {Path(out).resolve() / 'report.json'}\nplot:   {Path(out).resolve() / 'loss.png'}"
    )
    return 0 if passed else 1


def cmd_check_resume(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.training.resume_check import RunFailed, RunSpec, check_resume, verdict
    from energon_platform.training.resume_check.options import (
        check_trainer_form,
        check_trainer_run,
        default_tolerance,
        is_command_form,
    )

    if is_command_form(args.cmd, args.resume_cmd):
        return _check_resume_cmd(args)
    check_trainer_form(
        args.config, {"--log": args.log, "--log-format": args.log_format, "--regex": args.regex}
    )
    args.nproc = args.nproc or 1
    cfg = load_config(args.config, _overrides(args.set))  # fail here, in one line, not in a child
    check_trainer_run(cfg, args.nproc, args.resume_nproc, args.kill_at, args.steps)
    spec = RunSpec(args.config, args.steps, args.nproc, args.num_workers, tuple(args.set or ()))
    if args.tolerance is None:
        args.tolerance = default_tolerance(args.nproc, args.resume_nproc)
    try:
        result = check_resume(
            spec,
            args.kill_at,
            Path(args.out),
            args.resume_nproc,
            args.resume_workers,
            args.tolerance,
        )
    except RunFailed as e:  # a trainer process failed: its output tail is in the message
        print(f"energon-platform check-resume: {e}", file=sys.stderr)
        return 1
    return _print_verdict(verdict(result), args.out, result["passed"])


def _add_preview(sub) -> None:
    p = sub.add_parser(
        "preview",
        help="draw a contact sheet of encoded training samples (PNG, JPEG, WebP, ...)",
        description="Encode the first training samples of a run config (any encoder, blends "
        "included) or of a dataset with energon-platform's loader and draw them: "
        "augmented images and tiles with their decoded text, a video clip's frames in a "
        "row, an audio sample's mel spectrogram with its transcript.",
    )
    p.add_argument(
        "target",
        metavar="CONFIG_OR_DATASET",
        help="a run config (data + encoder), a dataset folder or a metadataset YAML",
    )
    p.add_argument(
        "--out",
        required=True,
        help="the picture to write; its suffix names the format "
        "(.png, .jpg/.jpeg, .webp, .bmp, .tif/.tiff)",
    )
    p.add_argument("--n", type=_positive, default=16, help="documents on the sheet (default 16)")
    p.add_argument(
        "--encoder",
        help="encoder config YAML (default: the run config's, or chosen by the dataset's "
        "sample type; a metadataset needs one)",
    )
    p.set_defaults(func=cmd_preview)


def cmd_preview(args) -> int:
    from energon_platform.tools.preview import preview

    info = preview(args.target, args.out, n=args.n, encoder=args.encoder)
    print(f"{info['path']}: {info['documents']} documents, {info['width']}x{info['height']} px")
    return 0


def _add_trace(sub) -> None:
    p = sub.add_parser(
        "trace",
        help="which samples a step trained on, or which steps used a key (no logs needed)",
        description="Compute from the schedule (never from logs) the samples of global steps, "
        "numbered as log.jsonl numbers them, with dataset, epoch, shard, rank and "
        "micro-batch; or the steps that used one sample key (the inverse "
        "permutation, O(1) per epoch; a balanced run replays its planner up to "
        "the steps asked). See docs/provenance.md.",
    )
    p.add_argument("--config", required=True, help="the run config YAML")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--step", type=_positive, help="one step (log.jsonl numbering, from 1)")
    what.add_argument(
        "--key", help="a sample key as logged (DATASET:KEY in a blend): the steps that used it"
    )
    p.add_argument(
        "--steps",
        metavar="A:B|M",
        help="with --step omitted: steps A to B (both given and included, "
        "1 <= A <= B); with --key: a count M, search the first M steps "
        "(default train.steps)",
    )
    p.add_argument(
        "--world-size",
        type=_positive,
        help="data-parallel ranks (default: the checkpoint's, else 1)",
    )
    p.add_argument(
        "--checkpoint",
        help="a checkpoint folder or a run's output folder: its blend and exclusion history",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. loader.seed=7 (KEY=@FILE: the value is FILE's YAML)",
    )
    p.set_defaults(func=cmd_trace)


def _replay_progress(done: int, total: int) -> None:
    """A balanced run's trace replays the planner: say how far, on stderr."""
    print(
        f"\rreplaying the planner: {done}/{total} global batches",
        end="\n" if done >= total else "",
        file=sys.stderr,
        flush=True,
    )


def cmd_trace(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.loader.trace import (
        TraceError,
        format_key,
        format_step,
        open_tracer,
        parse_steps,
    )
    from energon_platform.training import checkpoint

    if args.step is None and args.key is None and not args.steps:
        raise UsageError("say what to trace: --step N, --steps A:B or --key KEY")
    cfg = load_config(args.config, _overrides(args.set))
    try:
        asked = parse_steps(args.steps, args.step, args.key, cfg.train.steps)
        state = checkpoint.loader_state(args.checkpoint) if args.checkpoint is not None else None
        tracer = open_tracer(cfg, args.world_size, state, progress=_replay_progress)
        results = (
            [tracer.step(s) for s in asked] if args.key is None else [tracer.find(args.key, asked)]
        )
    except TraceError as e:
        raise UsageError(str(e)) from None
    for r in results:
        print(
            json.dumps(r) if args.json else (format_step(r) if args.key is None else format_key(r))
        )
    return 0


def _add_spikes(sub) -> None:
    p = sub.add_parser(
        "spikes",
        help="loss spikes of a run and the samples of each (traced, not read from logs)",
        description="Find loss spikes in a run's step log (robust z-score against the rolling "
        "median and MAD of the previous --window steps, plus NaN/inf steps) and list each "
        "spike's samples, computed by trace from the run's config and checkpoints: dataset, "
        "key, shard, epoch, rank, and the sample's loss and its rank within the step where the "
        "log carries sample_losses. With --exclude-from STEP, print instead the loader.exclude "
        "rules (YAML) that skip that step's top samples from it on, for --set "
        "loader.exclude=@rules.yaml. See docs/spikes.md.",
    )
    p.add_argument("--run", required=True, help="the run's output folder (log and checkpoints)")
    p.add_argument("--config", help="the run config YAML (required)")
    p.add_argument("--z", type=_positive_float, default=4.0, help="z-score threshold (default 4)")
    p.add_argument(
        "--window", type=_positive, default=50, help="steps of the rolling median (default 50)"
    )
    p.add_argument(
        "--top",
        type=_positive,
        help="the N samples of highest loss per spike (default: all of the step)",
    )
    p.add_argument(
        "--exclude-from",
        type=_positive,
        metavar="STEP",
        help="print loader.exclude rules skipping step STEP's (top) samples from STEP on",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per spike")
    p.add_argument("--log", help="the step log (default: RUN/log.jsonl)")
    p.add_argument(
        "--log-format",
        choices=["jsonl", "megatron", "torchtitan", "regex"],
        default="jsonl",
        help="as check-resume's --log-format (default jsonl)",
    )
    p.add_argument(
        "--regex", help="with --log-format regex: a Python regex with named groups step and loss"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, as the run was started",
    )
    p.set_defaults(func=cmd_spikes)


def _spike_inputs(args) -> tuple:
    """``(LogRows, Tracer)`` of ``spikes``' arguments; ``UsageError`` for a missing input."""
    from energon_platform.config import load_config
    from energon_platform.loader.trace import open_tracer
    from energon_platform.training import checkpoint
    from energon_platform.training.spike_samples import LogRows
    from energon_platform.training.step_log_readers import LogFormatError, get_format

    if args.config is None:
        raise UsageError("spikes needs the run's config: pass --config FILE (as for trace)")
    log = Path(args.log) if args.log else Path(args.run) / "log.jsonl"
    if not log.is_file():
        raise UsageError(f"{log}: no step log there; pass --log FILE (and --log-format)")
    try:
        rows = LogRows(log, get_format(args.log_format, args.regex))
    except LogFormatError as e:
        raise UsageError(str(e)) from None
    cfg = load_config(args.config, _overrides(args.set))
    state = checkpoint.loader_state(args.run)
    return rows, open_tracer(cfg, None, state, progress=_replay_progress)


def _spike_listing(tracer, spike: dict) -> dict:
    """A spike with its traced samples joined with its log row; warns when the keys differ."""
    from energon_platform.training.spike_samples import step_samples

    listing = step_samples(tracer.step(spike["step"]), spike.get("row"))
    if listing["keys_agree"] is False:
        print(
            f"warning: step {spike['step']}: the log's keys are not the ones trace computes from "
            f"the config and checkpoints (another config or --set?); listing trace's",
            file=sys.stderr,
        )
    return listing


def _print_exclusions(args, rows, tracer) -> int:
    """``spikes --exclude-from STEP``: the rules as YAML on stdout."""
    import yaml

    from energon_platform.training.spike_samples import exclude_rules

    row = next((r for r in rows if r["step"] == args.exclude_from), None)
    if row is None:
        raise UsageError(
            f"--exclude-from {args.exclude_from}: {rows.path} logs no such step; "
            f"pick a step it logs (see the spikes listed without --exclude-from)"
        )
    listing = _spike_listing(tracer, {"step": row["step"], "row": row})
    top = args.top
    if not listing["losses_logged"] and top is not None:
        print(
            f"note: step {row['step']} logs no sample_losses: excluding all of its samples",
            file=sys.stderr,
        )
        top = None
    print(yaml.safe_dump(exclude_rules(row["step"], listing["samples"], top), sort_keys=False))
    return 0


def cmd_spikes(args) -> int:
    from energon_platform.loader.trace import TraceError
    from energon_platform.training.spike_samples import format_spike
    from energon_platform.training.spikes import find_spikes

    rows, tracer = _spike_inputs(args)
    try:
        if args.exclude_from is not None:
            return _print_exclusions(args, rows, tracer)
        found = 0
        for spike in find_spikes(rows, args.z, args.window):
            listing = _spike_listing(tracer, spike)
            spike.pop("row")
            found += 1
            if args.json:
                print(json.dumps({**spike, **listing, "samples": listing["samples"][: args.top]}))
            else:
                print(format_spike(spike, listing, args.top))
    except TraceError as e:
        raise UsageError(str(e)) from None
    if rows.skipped:
        print(f"skipped {rows.skipped} line(s) of {rows.path} that are no step", file=sys.stderr)
    if not args.json:
        print(f"{found} spike(s) (z >= {args.z:g} over {args.window} steps, or a NaN/inf loss)")
    return 0


def _add_replay(sub) -> None:
    p = sub.add_parser(
        "replay",
        help="re-run a run from the checkpoint before a step with other config values",
        description="Copy a run's newest checkpoint saved before step --from into --out (the "
        "run's folder is only read), train --steps steps after it with the reference trainer "
        "and the config's values with --set applied (typically loader.exclude=@rules.yaml from "
        "spikes --exclude-from), then check that every replayed step before --from has the "
        "original's keys and batch digests (exit 1 when one has not) and print where the "
        "replayed loss departs from the original. It trains on one process, its learning-rate "
        "schedule spanning train.steps as the original's did (--set train.steps=N for a run "
        "started with --steps N). See docs/spikes.md.",
    )
    p.add_argument("--run", required=True, help="the original run's folder (log and checkpoints)")
    _add_run_args(p, "loader workers (default: the config's)")
    p.add_argument(
        "--from",
        dest="from_step",
        type=_positive,
        required=True,
        metavar="STEP",
        help="the first step that may differ: the replay starts from the newest checkpoint "
        "saved before it",
    )
    p.add_argument(
        "--steps",
        type=_positive,
        required=True,
        metavar="K",
        help="steps to train after the checkpoint (enough to reach --from)",
    )
    p.add_argument("--out", required=True, help="the replayed run's folder (new or empty)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace the run an earlier replay left in --out"
    )
    p.set_defaults(func=cmd_replay)


def cmd_replay(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.training.replay import ReplayError, mismatch_line, replay, summary

    cfg = load_config(args.config, _overrides(args.set))
    try:
        result = replay(
            cfg,
            args.run,
            args.out,
            args.from_step,
            args.steps,
            num_workers=args.num_workers,
            overwrite=args.overwrite,
        )
    except ReplayError as e:
        raise UsageError(str(e)) from None
    if not result["identical"]:
        print(f"energon-platform replay: {mismatch_line(result)}", file=sys.stderr)
        return 1
    print("\n".join(summary(result, args.run, args.out)))
    return 0


def _add_prepare(sub) -> None:
    p = sub.add_parser(
        "prepare",
        help="index a WebDataset already on object storage (tar headers only)",
        description="Write Energon's index (.tar.idx per shard, .nv-meta) for the *.tar objects "
        "under msc://PROFILE/prefix, reading only their headers with ranged requests. "
        "Refuses (writing nothing) a tar that is not whole or holds no sample, and a "
        "prefix written by `energon-platform convert` (indexed already). A local folder "
        "is Energon's `energon prepare`.",
    )
    p.add_argument(
        "url", help="msc://PROFILE/prefix holding *.tar shards (train/, val/ become splits)"
    )
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args) -> int:
    from converters.remote_prepare import prepare_prefix

    r = prepare_prefix(args.url)
    print(
        f"{r['url']}: {r['samples']} samples in {r['shards']} shards indexed; read {r['bytes_read']} bytes in "
        f"{r['requests']} ranged requests ({100 * r['bytes_read'] / max(r['tar_bytes'], 1):.1f}% of "
        f"{r['tar_bytes']} bytes of tars)"
        + (
            ""
            if r["has_dataset_yaml"]
            else f"; write {r['url']}/.nv-meta/dataset.yaml to name the sample type"
        )
    )
    return 0


#: Libraries that log the errors they raise: the CLI reports each error itself, in one line.
def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="a training run as one self-contained HTML page (curves, spikes and their samples)",
        description="Read RUN/log.jsonl and write one HTML file that opens offline: the loss "
        "curve with its spikes marked (and another run's loss with --compare), the learning "
        "rate, per-rank cost and padding of balanced runs, per-dataset samples and exclusions "
        "of blends, and for each spike its samples as the model sees them (read from the "
        "datasets of --config by key). Lines of the log that are not step rows are counted "
        "and skipped. See docs/spikes.md.",
    )
    p.add_argument("--run", required=True, help="the run's output folder (holds log.jsonl)")
    p.add_argument("--out", required=True, help="the HTML file to write")
    p.add_argument(
        "--config", help="the run config YAML: its datasets and encoder draw the spikes' samples"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a value of --config, e.g. data.path=out/demo/blend.yaml",
    )
    p.add_argument("--compare", metavar="RUN", help="another run folder: its loss drawn against")
    p.add_argument(
        "--z", type=_positive_float, default=4.0, help="spike threshold in z-scores (default 4)"
    )
    p.add_argument(
        "--window",
        type=_positive,
        default=50,
        help="steps before each step that its z-score is taken over (default 50)",
    )
    p.set_defaults(func=cmd_report)


def _report_spikes(args, config) -> list[dict]:
    """The spikes of ``--run``'s log.jsonl (:func:`~energon_platform.training.spikes.find_spikes`),
    each with its samples traced from ``config`` and the run's newest checkpoint (none without
    ``--config``, or in a run without a checkpoint: the panels then list no samples)."""
    from energon_platform.loader.trace import open_tracer
    from energon_platform.training import checkpoint
    from energon_platform.training.spike_samples import LogRows, step_samples
    from energon_platform.training.spikes import find_spikes, spike_rows
    from energon_platform.training.step_log_readers import JsonLines

    log = Path(args.run) / "log.jsonl"
    if not log.is_file():
        return []  # the report names the missing log
    spikes = spike_rows(find_spikes(LogRows(log, JsonLines()), args.z, args.window))
    tracer = None
    if config is not None and spikes:
        try:
            tracer = open_tracer(config, None, checkpoint.loader_state(args.run))
        except checkpoint.CheckpointError as e:
            print(f"note: {e}; the spikes' samples are not listed", file=sys.stderr)
    for spike in spikes:
        row = spike.pop("row")
        if tracer is not None:
            spike["samples"] = step_samples(tracer.step(spike["step"]), row)["samples"]
    return spikes


def cmd_report(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.tools.report import ReportError, build_report

    if args.set and not args.config:
        raise UsageError("--set overrides values of --config; pass --config too")
    config = load_config(args.config, _overrides(args.set)) if args.config else None
    try:
        info = build_report(
            args.run,
            args.out,
            spikes=_report_spikes(args, config),
            compare_run=args.compare,
            config=config,
        )
    except ReportError as e:
        raise UsageError(str(e)) from None
    skipped = f"; {info['corrupt']} corrupt lines skipped" if info["corrupt"] else ""
    print(
        f"{info['path']}: {info['steps']} steps, {info['spikes']} spikes, "
        f"{info['bytes']} bytes{skipped}"
    )
    return 0


QUIET_LOGGERS = ("multistorageclient",)


def _quiet_third_party_logs() -> None:
    """Keep the loggers of :data:`QUIET_LOGGERS` (MSC's "Non-retryable error occurred ..." before
    the exception it raises) to critical messages, in this process and the workers it forks."""
    import logging

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (``energon-platform trace | head -1``)."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (
        OSError,
        ValueError,
    ):  # not a file (replaced, or closed): the pipe that broke was another
        return False
    if not hasattr(select, "poll"):
        return True  # no way to ask: the error came from writing, and stdout is what the CLI writes
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(mask & select.POLLERR for _, mask in poller.poll(0))


def _quiet_stdout() -> None:
    """Point standard output at /dev/null, so that Python's flush at exit has nowhere to fail."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


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
    _add_prepare(sub)
    _add_verify(sub)
    _add_train(sub)
    _add_check_resume(sub)
    _add_calibrate(sub)
    _add_preview(sub)
    _add_trace(sub)
    _add_spikes(sub)
    _add_replay(sub)
    _add_report(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from converters.convert import ConvertError
    from converters.readers import InputError
    from energon_platform.loader.schedule import LayoutError
    from energon_platform.loader.state import StateMismatchError
    from energon_platform.training.checkpoint import CheckpointError
    from energon_platform.training.resume_check.options import OptionError
    from storage import DatasetError
    from task_encoders.config import ConfigError

    args = build_parser().parse_args(argv)
    _quiet_third_party_logs()
    try:
        status = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader gone (``| head -1``) is caught below
        return status
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        _quiet_stdout()
        return 141  # as a process ended by SIGPIPE
    except (
        InputError,
        ConvertError,
        UsageError,
        FileNotFoundError,
        ConfigError,
        DatasetError,
        StateMismatchError,
        LayoutError,
        CheckpointError,
        OptionError,
    ) as e:
        print(f"energon-platform {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
