"""Commands on data: ``convert``, ``info``, ``verify``, ``prepare``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from energon_platform.cli.common import (
    HelpFormatter,
    UsageError,
    folder_or_manifest,
    format_arg,
    fraction,
    overrides,
    positive,
    positive_float,
)

EXAMPLES = """examples:
  energon-platform convert coco --annotations captions.json --images images/ --out shards/
  energon-platform convert folder --root photos/ --out shards/ --image-format keep --max-side 1024
  energon-platform convert manifest --manifest laion.parquet --image-column jpg \\
      --text-column caption --out shards/
  energon-platform convert librispeech --root LibriSpeech/train-clean-100 --out speech/ --workers 8
  energon-platform convert audio-manifest --manifest train.jsonl --out speech/ --executor ray
  energon-platform convert text --manifest data/text_mini/documents.jsonl --id-column id --out docs/
  energon-platform convert video --root clips/ --out shards/ --max-side 256 --max-seconds 10
  energon-platform convert video --manifest webvid.csv --out shards/   # videoid, name, path columns
  energon-platform convert 3d --root data/mesh_mini/shapes --out shapes/   # or --manifest cap3d.csv
  energon-platform convert llava --json llava_instruct.json --images coco/ --out sft/
  energon-platform info shards/
"""


def add_convert(sub) -> None:
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
        type=positive,
        default=512,
        help="samples per tar shard (default 512)",
    )
    g.add_argument(
        "--val-fraction",
        type=fraction,
        default=0.0,
        help="fraction of keys (chosen by a hash of the key) written as the val split (default 0)",
    )
    g.add_argument(
        "--max-error-fraction",
        type=fraction,
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
    g.add_argument(
        "--index-encoder",
        metavar="ENCODER.yaml",
        help="after the conversion, build the train split's length index under this encoder "
        "config and store it with the data, as `energon-platform index` would (a local --out)",
    )
    g = common.add_argument_group("execution")
    g.add_argument(
        "--workers", type=positive, default=1, help="parallel work units (processes or Ray CPUs)"
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
        "--max-side", type=positive, help="downscale images whose longest side exceeds this"
    )
    g.add_argument(
        "--max-pixels",
        type=positive,
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
        formatter_class=HelpFormatter,
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
    format_arg(k)
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
    format_arg(k)
    k = kinds.add_parser(
        "video",
        parents=[common],
        help="videos with .txt/.json sidecars, or a WebVid-style manifest",
        description="Videos (MP4/MOV, WebM/MKV kept as their bytes after a full decode check; "
        "other containers re-encoded as MP4) with captions, from a folder or a manifest. "
        "--max-side/--max-seconds re-encode videos that exceed them (H.264, fixed settings).",
    )
    folder_or_manifest(k, "videos", "VID", "video paths")
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
    format_arg(k)
    g = k.add_argument_group("video")
    g.add_argument(
        "--max-side", type=positive, help="re-encode videos whose longest side exceeds this"
    )
    g.add_argument(
        "--max-seconds",
        type=positive_float,
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
    folder_or_manifest(k, "3D files", "NAME", "paths")
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
    format_arg(k)
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

    encoder = _index_encoder(args) if args.index_encoder else None  # refused before any work

    # --max-side re-encodes videos there, and leaves the image options alone
    video = args.kind == "video"
    # kinds without them: defaults
    image = ImageOptions(
        getattr(args, "image_format", "png"),
        None if video else getattr(args, "max_side", None),
        getattr(args, "max_pixels", ImageOptions().max_pixels),
    )
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
    if encoder is not None and outcome.ok:
        from energon_platform.loader.source import SampleSource
        from energon_platform.tools.length_index import index_dataset, summary

        stats = index_dataset(
            SampleSource(str(where)), encoder, workers=args.workers, progress=not args.no_progress
        )
        print(summary(stats))
    return 0 if outcome.ok else 1


def _index_encoder(args) -> object:
    """The encoder ``convert --index-encoder`` names, built before the conversion starts:
    `UsageError` (one line) for an object-storage ``--out``, a config that cannot be read, or an
    encoder that states no length facts."""
    from storage.paths import is_remote
    from task_encoders.abilities import StatesFacts, missing
    from task_encoders.config_parser import ConfigError
    from task_encoders.registry import get_encoder

    if is_remote(args.out):
        raise UsageError(
            "--index-encoder with an msc:// --out: run `energon-platform index` on the dataset "
            "instead (its index goes to loader.length_cache)"
        )
    try:
        encoder = get_encoder(args.index_encoder)
    except (ConfigError, OSError, ValueError) as e:
        raise UsageError(f"--index-encoder {args.index_encoder}: {e}") from None
    gone = missing(encoder, StatesFacts)
    if gone:
        raise UsageError(
            f"--index-encoder: {type(encoder).__name__} states no length facts "
            f"(it has no {', '.join(gone)})"
        )
    return encoder


def add_index(sub) -> None:
    p = sub.add_parser(
        "index",
        help="build the length index of a run config's datasets ahead of training",
        description="Build the length index (each sample's length facts and key, which balanced "
        "batching reads) of every dataset of a run config under its encoder, shard by shard, and "
        "store it with the data (DATASET/.energon-platform/lengths; a dataset on object storage "
        "or in a read-only folder: loader.length_cache, else the local cache), so that no "
        "training job builds it at start-up. Resumable: the shards a killed run indexed are kept, "
        "and a dataset that gained or changed shards indexes only those.",
    )
    p.add_argument("--config", required=True, help="run config YAML (see configs/train_*.yaml)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, as the training run will (data.path, encoder, ...)",
    )
    p.add_argument(
        "--workers",
        type=positive,
        default=1,
        help="processes (or Ray CPUs) indexing shards at once (default 1)",
    )
    p.add_argument(
        "--ray", action="store_true", help="run the shards as Ray tasks (a local Ray instance)"
    )
    p.add_argument(
        "--ray-address",
        help="run the shards as tasks of the Ray cluster at HOST:PORT, ray://HOST:PORT or auto "
        "(the dataset and the index's place must be paths every node sees)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_index)


def cmd_index(args) -> int:
    from energon_platform.config import load_config
    from energon_platform.tools.length_index import index_run, summary
    from task_encoders.config_parser import ConfigError

    cfg = load_config(args.config, overrides(args.set))
    try:
        done = index_run(
            cfg,
            workers=args.workers,
            use_ray=args.ray,
            ray_address=args.ray_address,
            progress=not args.no_progress,
        )
    except NotImplementedError as e:
        raise ConfigError(cfg.source, "encoder", str(e)) from None
    for stats in done:
        print(summary(stats))
    return 0


def add_info(sub) -> None:
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


def add_verify(sub) -> None:
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


def add_prepare(sub) -> None:
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
