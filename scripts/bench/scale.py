"""Schedule scale and shuffle quality: ours (O(1) per position) against an epoch-array schedule.

    python -m scripts.bench.scale [--json PATH] [--sizes 1e6 1e7 1e8 1e9] [--memory-limit-gib 8]

(1) For each corpus size N: the time a *fresh process* takes to compute the samples of one global
batch (256 positions) in the middle of epoch 3 (a restore's work) and at position 0 (a fresh
start's), and that process's peak RSS above its baseline after imports, for

* ``ours``: :class:`energon_platform.loader.schedule.Schedule` (keyed Feistel bijection per
  epoch; nothing stored), full permutation and ``locality`` (``shuffle_buffer`` 10000);
* ``array``: the alternative every loader that stores orders uses (and energon-platform did until
  this schedule): one ``int32/int64`` permutation array of N per epoch built with NumPy's
  ``Generator.permutation``. Sizes whose arrays would exceed ``--memory-limit-gib`` are skipped and
  the table says so.

(2) Shuffle quality at N = 10⁶ with 512-sample shards: distinct shards per window of B samples, the
share of neighbouring positions from the same shard and the correlation of neighbouring indices,
for ``permutation``, ``locality`` and the array permutation.

(3) Object storage (``--s3``; skipped with ``--no-s3``): a generated image-text dataset uploaded to
a SeaweedFS on loopback (``scripts/s3_server.py``), one epoch read by our ``TrainLoader`` (each
shuffle mode), by Energon's own loader (``get_train_dataset`` + ``get_savable_loader``, shuffle
buffer 100) and by a plain ``webdataset`` pipeline streaming the same tars through MSC, all with
the same encoder and workers: samples/s, storage requests per sample and bytes fetched per byte
delivered, counted by the server. Every figure is measured in this run; nothing is typed in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from scripts.bench.common import REPO

CHILD = r"""
import json, resource, sys, time
import numpy as np
kind, n, buf, fresh = {kind!r}, {n}, {buf}, {fresh}
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
positions = np.arange(256) + (0 if fresh else 3 * n + n // 2)
t = time.perf_counter()
if kind == "ours":
    from energon_platform.loader.schedule import Schedule
    s = Schedule.for_dataset(n, seed=1, items_per_batch=256, shuffle_buffer=buf)
    d, e, i = s.samples(positions)
    out = i
else:
    rng = np.random.Generator(np.random.PCG64([1, 3]))
    order = rng.permutation(n).astype(np.int32 if n < 2**31 else np.int64)
    out = order[positions % n]
elapsed = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"seconds": elapsed, "peak_rss_mib": peak / 1024, "rss_above_baseline_mib": (peak - base) / 1024,
                  "checksum": int(out.sum())}}))
"""


def run_child(kind: str, n: int, buf: int | None, fresh: bool = False) -> dict:
    """One measurement in a new process: the first global batch (``fresh``) or one in epoch 3 (a restore)."""
    code = CHILD.format(kind=kind, n=n, buf=buf, fresh=fresh)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} at N={n} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def quality(n: int = 10**6, shard: int = 512, windows=(64, 1024, 10000)) -> list[dict]:
    import numpy as np

    from energon_platform.loader.orders import DatasetOrder

    rng = np.random.Generator(np.random.PCG64([1, 3]))
    variants = {
        "ours permutation": DatasetOrder(n, 11).indices(0, np.arange(n)),
        "ours locality (shuffle_buffer 10000)": DatasetOrder(n, 11, shuffle_buffer=10000).indices(
            0, np.arange(n)
        ),
        "array permutation": rng.permutation(n),
    }
    rows = []
    for name, order in variants.items():
        row = {
            "variant": name,
            "neighbour_corr": round(float(np.corrcoef(order[:-1], order[1:])[0, 1]), 4),
            "same_shard_neighbours": round(
                float(np.mean(order[:-1] // shard == order[1:] // shard)), 4
            ),
        }
        for b in windows:
            m = (n // b) * b
            shards = (order[:m] // shard).reshape(-1, b)
            row[f"shards_per_{b}"] = round(
                float(np.mean([len(np.unique(r)) for r in shards[:200]])), 1
            )
        rows.append(row)
    return rows


def s3_dataset(out: Path, shards: int, per_shard: int, side: int) -> int:
    """A generated image-text dataset (noise PNGs); returns the bytes of all samples' tar members."""
    import io
    import tarfile

    import numpy as np
    import webdataset
    from megatron.energon import BaseWebdatasetFactory
    from PIL import Image

    rng = np.random.default_rng(0)
    (out / "train").mkdir(parents=True)
    tars = []
    for s in range(shards):
        tars.append(f"train/shard-{s:06d}.tar")
        with webdataset.TarWriter(str(out / tars[-1])) as w:
            for i in range(per_shard):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(
                    buf, format="PNG"
                )
                w.write(
                    {
                        "__key__": f"{s:04d}{i:04d}",
                        "image.png": buf.getvalue(),
                        "text.json": json.dumps({"caption": f"sample {s} {i}"}).encode(),
                    }
                )
    BaseWebdatasetFactory.prepare_dataset(
        out, tars, split_parts_patterns=[("train", "train/.*")], workers=1
    )
    (out / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n"
        "field_map:\n  image: image.png\n  caption: text.json[caption]\n"
    )
    delivered = 0
    for t in tars:
        with tarfile.open(out / t) as tf:
            delivered += sum(m.size for m in tf.getmembers() if m.isfile())
    return delivered


def s3_loaders(url: str, workers: int, batch: int) -> dict:
    """name → a function making an iterator of batches over ``url`` (one epoch's worth is read)."""
    import torch
    import webdataset as wds
    from megatron.energon import get_savable_loader, get_train_dataset
    from megatron.energon.epathlib import EPath

    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader
    from task_encoders.registry import get_encoder

    encoder_config = str(REPO / "configs/encoders/image_text_small.yaml")

    def ours(shuffle_buffer, run=1):
        return lambda: TrainLoader(
            load_config(
                {
                    "data": {"path": url, "val_split": None},
                    "encoder": encoder_config,
                    "loader": {
                        "global_batch_size": batch,
                        "num_workers": workers,
                        "shuffle_buffer": shuffle_buffer,
                        "shuffle_run": run,
                    },
                }
            )
        )

    def energon():
        enc = get_encoder(encoder_config)
        ds = get_train_dataset(
            url,
            worker_config=enc.worker_config(num_workers=workers),
            batch_size=batch,
            shuffle_buffer_size=100,
            max_samples_per_sequence=None,
            task_encoder=enc,
        )
        return iter(get_savable_loader(ds))

    def plain():
        enc = get_encoder(encoder_config)
        sys.modules["webdataset.gopen"].gopen_schemes["msc"] = (
            lambda u, mode="rb", bufsize=8192, **kw: EPath(u).open("rb")
        )
        urls = sorted(str(p) for p in (EPath(url) / "train").glob("*.tar"))

        def encode(item):
            key, image, meta = item
            return key, enc.pipeline(image).contiguous(), meta["caption"]

        pipe = (
            wds.WebDataset(
                urls, shardshuffle=False, workersplitter=wds.split_by_worker, empty_check=False
            )
            .shuffle(100)
            .decode("torchrgb")
            .to_tuple("__key__", "image.png", "text.json")
            .map(encode)
            .batched(batch, partial=False)
        )
        return iter(torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers))

    return {
        "ours permutation": ours(None),
        "ours locality (shuffle_buffer 64)": ours(64),
        "ours locality (buffer 64, run 8)": ours(64, 8),
        "energon loader": energon,
        "plain webdataset (streaming)": plain,
    }


def storage(args) -> list[dict]:
    """Part (3): each loader reads one epoch from a local SeaweedFS; the server counts the cost."""
    import os
    import tempfile
    import time

    from converters.remote import upload_dataset
    from scripts.s3_server import S3Server

    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-s3-"))
    n = args.shards * args.per_shard
    delivered = s3_dataset(tmp / "ds", args.shards, args.per_shard, args.side)
    server = S3Server.launch(tmp / "s3")
    os.environ["MSC_CONFIG"] = str(server.msc_config)
    # botocore validates whole-object checksums on GET where the server sends them; SeaweedFS's
    # can disagree with its own stored object on whole-shard downloads (Energon's reader)
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    rows = []
    try:
        url = server.url("ds")
        upload_dataset(tmp / "ds", url)
        for name, make in s3_loaders(url, args.workers, 8).items():
            before, t = server.counters(), time.perf_counter()
            it = make()
            for _ in range(n // 8):
                next(it)
            elapsed = time.perf_counter() - t
            cost = server.counters() - before
            if hasattr(it, "close"):
                it.close()
            del it
            rows.append(
                {
                    "loader": name,
                    "samples": n,
                    "samples_per_s": n / elapsed,
                    "requests": cost.requests,
                    "requests_per_sample": cost.requests / n,
                    "fetched_per_delivered": cost.bytes_out / delivered,
                }
            )
    finally:
        server.stop(kill=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", help="write the results here")
    p.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 1e8, 1e9])
    p.add_argument(
        "--memory-limit-gib",
        type=float,
        default=8.0,
        help="skip array schedules whose permutation (8 bytes/sample while built) exceeds this",
    )
    p.add_argument(
        "--no-s3", action="store_true", help="skip part (3), the object-storage read cost"
    )
    p.add_argument("--shards", type=int, default=16, help="(3): shards of the generated dataset")
    p.add_argument("--per-shard", type=int, default=32, help="(3): samples per shard")
    p.add_argument(
        "--side", type=int, default=96, help="(3): image side in pixels (noise PNG, ~28 kB)"
    )
    p.add_argument("--workers", type=int, default=2, help="(3): DataLoader workers of every loader")
    args = p.parse_args()
    from scripts.bench.common import check_json_out, finish_record, run_record, write_json

    check_json_out(args.json)  # before any work: new, or a benchmark JSON

    record = run_record()
    rows = []
    for n in (int(x) for x in args.sizes):
        for kind, buf, label in (
            ("ours", None, "ours permutation"),
            ("ours", 10000, "ours locality"),
            ("array", None, "array permutation"),
        ):
            if kind == "array" and n * 8 / 2**30 > args.memory_limit_gib:
                rows.append(
                    {
                        "samples": n,
                        "variant": label,
                        "skipped": f"needs > {args.memory_limit_gib:g} GiB",
                    }
                )
                continue
            row = {"samples": n, "variant": label, **run_child(kind, n, buf)}
            row["fresh_seconds"] = run_child(kind, n, buf, fresh=True)["seconds"]
            rows.append(row)
    print(
        f"{'samples':>12} {'variant':<20} {'restore s':>10} {'fresh s':>9} {'restore/fresh':>13} "
        f"{'peak RSS MiB':>13} {'above base MiB':>15}"
    )
    for r in rows:
        if "skipped" in r:
            print(f"{r['samples']:>12.0e} {r['variant']:<20} skipped: {r['skipped']}")
        else:
            print(
                f"{r['samples']:>12.0e} {r['variant']:<20} {r['seconds']:>10.4f} {r['fresh_seconds']:>9.4f} "
                f"{r['seconds'] / r['fresh_seconds']:>13.2f} {r['peak_rss_mib']:>13.1f} "
                f"{r['rss_above_baseline_mib']:>15.1f}"
            )
    ratios = []
    for n in sorted({r["samples"] for r in rows}):
        ours = next(r for r in rows if r["samples"] == n and r["variant"] == "ours permutation")
        arr = next(r for r in rows if r["samples"] == n and r["variant"] == "array permutation")
        if "skipped" not in arr:
            ratios.append(
                {
                    "samples": n,
                    "restore_time_array_over_ours": arr["seconds"] / ours["seconds"],
                    "rss_above_base_array_over_ours": arr["rss_above_baseline_mib"]
                    / max(ours["rss_above_baseline_mib"], 0.1),
                }
            )
    for r in ratios:
        print(
            f"N={r['samples']:.0e}: array/ours restore time {r['restore_time_array_over_ours']:.1f}x, "
            f"memory {r['rss_above_base_array_over_ours']:.1f}x"
        )
    q = quality()
    print(
        "\nshuffle quality at N=1e6, 512-sample shards (distinct shards per window of B samples):"
    )
    for r in q:
        print("  " + ", ".join(f"{k}={v}" for k, v in r.items()))
    s3 = [] if args.no_s3 else storage(args)
    if s3:
        print(
            f"\nobject storage (SeaweedFS on loopback), one epoch of {s3[0]['samples']} samples, "
            f"{args.workers} workers:"
        )
        print(
            f"  {'loader':<36} {'samples/s':>10} {'requests/sample':>16} {'fetched/delivered':>18}"
        )
        for r in s3:
            print(
                f"  {r['loader']:<36} {r['samples_per_s']:>10.1f} {r['requests_per_sample']:>16.2f} "
                f"{r['fetched_per_delivered']:>18.2f}"
            )
        energon = next(r for r in s3 if r["loader"] == "energon loader")
        for r in s3:
            if r["loader"].startswith("ours"):
                print(
                    f"  {r['loader']} / energon loader: "
                    f"{r['samples_per_s'] / energon['samples_per_s']:.2f}x samples/s, "
                    f"{energon['fetched_per_delivered'] / r['fetched_per_delivered']:.1f}x fewer bytes fetched"
                )
    write_json(
        args.json,
        finish_record({**record, "schedule": rows, "ratios": ratios, "quality": q, "storage": s3}),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
