#!/usr/bin/env python
"""Conversion throughput: a naive single-process ``webdataset.ShardWriter`` loop vs ours.

All three runs convert the same generated COCO-style corpus (JPEG photos cut from scikit-image's
sample images) to the same output format (RGB PNG at the same zlib level + ``text.json``):
  naive      one process: PIL open → exif_transpose → RGB → PNG → ShardWriter, nothing else;
  ours, 1w   ``energon-platform convert coco`` with 1 worker: also validation, report, resume
             bookkeeping, checksums and Energon's index;
  ours, 2w   the same with 2 worker processes.
Prints a table and writes JSON (``--json``). Figures are measured each run, never stored.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps


def make_corpus(root: Path, n: int, side: int = 256) -> tuple[Path, Path]:
    """``n`` JPEG crops of scikit-image photos (deterministic) and a COCO captions file."""
    from skimage import data

    photos = [np.asarray(getattr(data, name)()) for name in ("astronaut", "chelsea", "coffee", "rocket")]
    images = root / "images"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows, anns = [], []
    for i in range(1, n + 1):
        photo = photos[i % len(photos)]
        y = rng.integers(0, photo.shape[0] - side)
        x = rng.integers(0, photo.shape[1] - side)
        name = f"{i:08d}.jpg"
        Image.fromarray(photo[y:y + side, x:x + side]).save(images / name, quality=90)
        rows.append({"id": i, "file_name": name, "width": side, "height": side})
        anns.append({"id": i, "image_id": i, "caption": f"crop {i} of a sample photograph"})
    ann = root / "captions.json"
    ann.write_text(json.dumps({"images": rows, "annotations": anns}))
    return ann, images


def naive(ann: Path, images: Path, out: Path, per_shard: int) -> int:
    """The loop a user writes by hand with webdataset."""
    import webdataset as wds

    from converters.media import PNG_COMPRESS_LEVEL

    doc = json.loads(ann.read_text())
    captions = {a["image_id"]: a["caption"] for a in doc["annotations"]}
    out.mkdir(parents=True)
    n = 0
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for row in doc["images"]:
            img = ImageOps.exif_transpose(Image.open(images / row["file_name"])).convert("RGB")
            buf = io.BytesIO()
            img.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
            sink.write({"__key__": f"{row['id']:012d}", "image.png": buf.getvalue(),
                        "text.json": json.dumps({"caption": captions[row["id"]]}).encode()})
            n += 1
    return n


def ours(ann: Path, images: Path, out: Path, per_shard: int, workers: int) -> int:
    from converters.convert import ConvertOptions, run_conversion

    outcome = run_conversion("coco", {"annotations": str(ann), "images": str(images)},
                             ConvertOptions(out=str(out), samples_per_shard=per_shard, workers=workers, progress=False))
    return outcome.report["totals"]["written"]


def timed(fn, *args) -> tuple[float, int]:
    t = time.perf_counter()
    n = fn(*args)
    return time.perf_counter() - t, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4000, help="corpus size (default 4000)")
    ap.add_argument("--samples-per-shard", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2, help="runs per variant; the best is kept (default 2)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    try:
        print(f"generating {args.images} JPEG images in {tmp} ...", file=sys.stderr)
        ann, images = make_corpus(tmp / "raw", args.images)
        variants = {
            "naive ShardWriter loop": lambda out: naive(ann, images, out, args.samples_per_shard),
            "ours, 1 worker": lambda out: ours(ann, images, out, args.samples_per_shard, 1),
            "ours, 2 workers": lambda out: ours(ann, images, out, args.samples_per_shard, 2),
        }
        best = {}
        for rep in range(args.repeats):
            for name, fn in variants.items():  # interleaved, so drift affects all alike
                out = tmp / f"out-{rep}-{len(best)}-{name[:5]}"
                seconds, n = timed(fn, out)
                assert n == args.images, (name, n)
                best[name] = min(best.get(name, float("inf")), seconds)
                shutil.rmtree(out)
        rates = {name: args.images / s for name, s in best.items()}
        base, one, two = rates["naive ShardWriter loop"], rates["ours, 1 worker"], rates["ours, 2 workers"]
        ratios = {"ours_1w_over_naive": one / base, "ours_2w_over_ours_1w": two / one}
        print(f"\n{'variant':26s} {'seconds':>9s} {'samples/s':>10s}")
        for name, s in best.items():
            print(f"{name:26s} {s:9.2f} {rates[name]:10.1f}")
        print(f"\nours 1 worker / naive   = {ratios['ours_1w_over_naive']:.3f}   (target >= 0.95)")
        print(f"ours 2 workers / 1      = {ratios['ours_2w_over_ours_1w']:.3f}   (target >= 1.7)")
        result = {"images": args.images, "samples_per_shard": args.samples_per_shard, "cpus": os.cpu_count(),
                  "seconds": best, "samples_per_s": rates, "ratios": ratios}
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
