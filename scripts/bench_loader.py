"""Loader throughput, side by side, and padding with and without packing.

    python scripts/bench_loader.py [DATASET] [--json PATH] [--workers 2] [--batch-size 32]

Throughput: the same shards, the same image transforms (``--encoder-config``, default
``configs/encoders/image_text.yaml``), the same tokenization and row layout, with ``--workers``
DataLoader workers each:

* (a) ``ours``: ``ImageTextTaskEncoder`` through Energon's savable loader (per-sample seeds from
  (seed, key, epoch));
* (b) ``webdataset``: the same decode + transforms + tokenization as a plain ``webdataset``
  pipeline in a torch ``DataLoader`` (no savable state, unseeded global RNG);
* (c) ``restore_seeds``: Energon's savable loader with an equivalent encoder whose
  ``encode_sample`` is ``@stateless(restore_seeds=True)`` (Energon reseeds torch, numpy and
  ``random`` per sample);
* (d) ``schedule``: the same encoder through energon_platform's ``TrainLoader`` (global schedule,
  O(1) restore, elastic layouts) at the same physical layout as (a). Target: d/a >= 0.95.
* (e) ``blend``: our ``TrainLoader`` over an Energon metadataset blending the dataset with itself
  at weights 3:1 (two independent streams, exact ratios), against (f) ``energon_blend``: Energon's
  own blend of the same metadataset (``get_train_dataset`` → ``get_savable_loader``), same
  encoder, same layout. Target: e/f >= 1.0.

Each is timed over ``--batches`` batches after ``--warmup`` batches, ``--rounds`` times in
alternation; the table shows the median round, as samples per wall-clock second and as samples per
CPU second of the main process and its workers (on a shared machine the wall clock also measures
the neighbours; the load average is printed). Target: a/b >= 0.95, a/c >= 1.0.

Padding: ``TextTaskEncoder`` (``configs/encoders/text.yaml``: seq_len 2048) on the dataset's
captions through Energon's loader, packed (first-fit decreasing over Energon's packing buffer)
against one caption per row. Target: <= 3% with packing.

DATASET (throughput) defaults to ``--images`` generated 320x256 PNGs with the embedded corpus's
captions, converted with the project's converter into a temporary folder; the padding is always
measured on the embedded caption corpus ``data/coco_mini`` (converted likewise).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import torch  # noqa: E402
import webdataset as wds  # noqa: E402
from megatron.energon import get_savable_loader, get_train_dataset, stateless  # noqa: E402

from scripts.bench_run import check_json_out, finish_record, run_record, write_json  # noqa: E402
from task_encoders.image_text import ImageTextTaskEncoder  # noqa: E402
from task_encoders.registry import get_encoder  # noqa: E402
from task_encoders.sequences import collate_rows, layout_row  # noqa: E402

SHUFFLE = 100


class RestoreSeedsImageText(ImageTextTaskEncoder):
    """(c): the same work, seeded the Energon way: ``@stateless(restore_seeds=True)`` reseeds the
    global torch/numpy/random RNGs from (worker seed, sample index); transforms draw from them."""

    @stateless(restore_seeds=True)
    def encode_sample(self, sample: Any) -> Any:
        return self.encode(sample)

    def encode_media(self, sample: Any) -> dict[str, torch.Tensor]:
        return {"image": self.pipeline(sample.image).contiguous()}


def energon_loader(encoder: Any, dataset: Path, workers: int, batch_size: int) -> Any:
    train = get_train_dataset(
        dataset,
        worker_config=encoder.worker_config(num_workers=workers),
        batch_size=batch_size,
        shuffle_buffer_size=SHUFFLE,
        max_samples_per_sequence=None,
        task_encoder=encoder,
        packing_buffer_size=encoder.packing_buffer_size,
    )
    return get_savable_loader(train)


def webdataset_loader(
    encoder: ImageTextTaskEncoder, dataset: Path, workers: int, batch_size: int
) -> Any:
    """(b): plain webdataset, same decoding (``torchrgb``), transforms, tokenization and layout."""
    tokenizer, pipeline, seq_len = encoder.tokenizer, encoder.pipeline, encoder.seq_len

    def encode(item: tuple) -> tuple:
        key, image, meta = item
        return key, pipeline(image).contiguous(), tokenizer.encode(meta["caption"])

    def collate(items: list) -> dict:
        rows = [layout_row([tokens], seq_len, tokenizer.special.pad) for _, _, tokens in items]
        return {
            "keys": [k for k, _, _ in items],
            "images": torch.stack([i for _, i, _ in items]),
            **collate_rows(rows),
        }

    urls = sorted(str(p) for p in (dataset / "train").glob("*.tar"))
    pipe = (
        wds.WebDataset(
            urls, shardshuffle=False, workersplitter=wds.split_by_worker, empty_check=False
        )
        .repeat()
        .shuffle(SHUFFLE)
        .decode("torchrgb")
        .to_tuple("__key__", "image.png", "text.json")
        .map(encode)
        .batched(batch_size, collation_fn=collate, partial=False)
    )
    return torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers)


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live children (the DataLoader workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:  # ppid; utime and stime are fields 14 and 15 of stat
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def time_batches(
    make: Callable[[], Any], warmup: int, batches: int, batch_size: int
) -> tuple[float, float]:
    """(samples per wall second, samples per CPU second) over ``batches`` batches after ``warmup``
    (worker start, buffer fill). CPU seconds count the main process and its workers: on a shared
    machine they measure the work, where wall time also measures the neighbours."""
    loader = make()
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    wall, cpu = time.perf_counter(), _cpu_seconds()
    for _ in range(batches):
        next(it)
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    del it
    _shutdown(loader)
    return batches * batch_size / wall, batches * batch_size / cpu


def blend_metadataset(dataset: Path, out: Path) -> Path:
    """A ``MetadatasetV2`` blending ``dataset`` with itself at weights 3:1."""
    import yaml

    out.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {
                    "train": {
                        "blend": [
                            {"weight": 3, "path": str(dataset)},
                            {"weight": 1, "path": str(dataset)},
                        ]
                    }
                },
            }
        )
    )
    return out


def schedule_loader(config: Path, dataset: Path, workers: int, batch_size: int) -> Any:
    """energon_platform's TrainLoader: one rank, ``workers`` workers, global batch = batch size."""
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    return TrainLoader(
        load_config(
            {
                "data": {"path": str(dataset), "val_split": None},
                "encoder": str(config),
                "loader": {
                    "global_batch_size": batch_size,
                    "num_workers": workers,
                    "shuffle_buffer": SHUFFLE,
                },
            }
        )
    )


def _shutdown(loader: Any) -> None:
    """Stop a DataLoader's (persistent) workers now, not when garbage collection gets to it."""
    if hasattr(loader, "close"):
        return loader.close()
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()


def throughput(dataset: Path, config: Path, args: argparse.Namespace) -> dict:
    ours = get_encoder(config)
    theirs = RestoreSeedsImageText(config)
    loaders = {
        "ours": lambda: energon_loader(ours, dataset, args.workers, args.batch_size),
        "webdataset": lambda: webdataset_loader(ours, dataset, args.workers, args.batch_size),
        "restore_seeds": lambda: energon_loader(theirs, dataset, args.workers, args.batch_size),
        "schedule": lambda: schedule_loader(config, dataset, args.workers, args.batch_size),
        "blend": lambda: schedule_loader(config, args.blend, args.workers, args.batch_size),
        "energon_blend": lambda: energon_loader(ours, args.blend, args.workers, args.batch_size),
    }
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
    for r in range(args.rounds):
        for name in list(loaders) if r % 2 == 0 else list(loaders)[::-1]:
            rounds[name].append(
                time_batches(loaders[name], args.warmup, args.batches, args.batch_size)
            )
    wall = {name: statistics.median(w for w, _ in v) for name, v in rounds.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in rounds.items()}
    return {
        "samples_per_s": wall,
        "samples_per_cpu_s": cpu,
        "rounds": rounds,
        "ratio_a_b": wall["ours"] / wall["webdataset"],
        "ratio_a_c": wall["ours"] / wall["restore_seeds"],
        "cpu_ratio_a_b": cpu["ours"] / cpu["webdataset"],
        "cpu_ratio_a_c": cpu["ours"] / cpu["restore_seeds"],
        "ratio_d_a": wall["schedule"] / wall["ours"],
        "cpu_ratio_d_a": cpu["schedule"] / cpu["ours"],
        "ratio_e_f": wall["blend"] / wall["energon_blend"],
        "cpu_ratio_e_f": cpu["blend"] / cpu["energon_blend"],
    }


def padding(dataset: Path, rows_wanted: int, workers: int) -> dict:
    """Padding share of all token slots, packed vs one caption per row, on the same documents."""
    encoder = get_encoder(REPO / "configs" / "encoders" / "text.yaml")
    seq_len = encoder.seq_len
    rows, lengths = 0, []
    loader = energon_loader(encoder, dataset, workers, batch_size=8)
    for batch in itertools.islice(iter(loader), -(-rows_wanted // 8)):
        rows += batch.tokens.shape[0]
        lengths += batch.doc_lengths.tolist()
    _shutdown(loader)
    real = sum(lengths)
    return {
        "seq_len": seq_len,
        "packing_buffer_size": encoder.packing_buffer_size,
        "rows": rows,
        "documents": len(lengths),
        "mean_doc_tokens": real / len(lengths),
        "padding_packed": 1 - real / (rows * seq_len),
        "padding_unpacked": 1 - real / (len(lengths) * seq_len),
    }


def convert_coco(annotations: Path, images: Path, out: Path) -> Path:
    """A raw COCO-captions corpus → Energon-ready shards, through the project's converter."""
    from converters.convert import ConvertOptions, run_conversion

    outcome = run_conversion(
        "coco",
        {"annotations": str(annotations), "images": str(images)},
        ConvertOptions(out=str(out), samples_per_shard=64, progress=False),
    )
    if not outcome.ok:
        raise SystemExit(f"converting {annotations} failed: {outcome.report['status']}")
    return out


def generated_dataset(tmp: Path, count: int, size: tuple[int, int] = (320, 256)) -> Path:
    """``count`` photo-sized PNGs (smooth gradients, shapes and mild noise: they compress and
    decode like photos, not like noise or flat colour) with the embedded corpus's captions."""
    import numpy as np
    from PIL import Image, ImageDraw

    captions = [
        a["caption"]
        for a in json.loads((REPO / "data" / "coco_mini" / "captions.json").read_text())[
            "annotations"
        ]
    ]
    (tmp / "raw").mkdir()
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width] / max(size)
    for i in range(count):
        rng = np.random.default_rng(i)
        a, b, c = rng.uniform(0, 255, (3, 3))
        pixels = np.stack([a[k] * xx + b[k] * yy + c[k] * xx * yy for k in range(3)], axis=-1)
        pixels += rng.normal(0, 6, pixels.shape)
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for _ in range(6):
            x0, y0 = rng.integers(0, width - 40), rng.integers(0, height - 40)
            draw.ellipse(
                [x0, y0, x0 + rng.integers(20, 120), y0 + rng.integers(20, 120)],
                fill=tuple(rng.integers(0, 256, 3).tolist()),
            )
        image.save(tmp / "raw" / f"{i:06d}.png")
    coco = {
        "images": [{"id": i, "file_name": f"{i:06d}.png"} for i in range(count)],
        "annotations": [
            {"id": i, "image_id": i, "caption": captions[i % len(captions)]} for i in range(count)
        ],
    }
    (tmp / "captions.json").write_text(json.dumps(coco))
    return convert_coco(tmp / "captions.json", tmp / "raw", tmp / "generated")


def report(result: dict) -> str:
    t, p = result["throughput"], result["padding"]
    names = {
        "ours": "(a) ours: Energon savable loader, per-key seeds",
        "webdataset": "(b) plain webdataset + DataLoader",
        "restore_seeds": "(c) Energon savable loader, @stateless(restore_seeds=True)",
        "schedule": "(d) ours: energon_platform TrainLoader (elastic schedule)",
        "blend": "(e) ours: TrainLoader over a 3:1 metadataset blend",
        "energon_blend": "(f) Energon's own blend of the same metadataset",
    }
    lines = [
        f"dataset {result['dataset']}: {result['settings']}",
        f"load average before/after: {result['load_before']} / {result['load_after']} on {os.cpu_count()} CPUs",
        "",
        f"{'loader':<62} {'samples/s':>10} {'per CPU-s':>10}",
        "-" * 84,
    ]
    lines += [
        f"{names[k]:<62} {v:>10.1f} {t['samples_per_cpu_s'][k]:>10.1f}"
        for k, v in t["samples_per_s"].items()
    ]
    lines += [
        "",
        f"samples/s:         a/b = {t['ratio_a_b']:.3f} (target >= 0.95)   a/c = {t['ratio_a_c']:.3f} (target >= 1.0)",
        f"samples per CPU-s: a/b = {t['cpu_ratio_a_b']:.3f}                  a/c = {t['cpu_ratio_a_c']:.3f}",
        f"elastic schedule vs plain Energon, same layout: d/a = {t['ratio_d_a']:.3f} (target >= 0.95), "
        f"per CPU-s {t['cpu_ratio_d_a']:.3f}",
        f"blend, ours vs Energon's, same metadataset and layout: e/f = {t['ratio_e_f']:.3f} (target >= 1.0), "
        f"per CPU-s {t['cpu_ratio_e_f']:.3f}",
        "",
        f"padding at seq_len={p['seq_len']} over {p['documents']} captions "
        f"({p['mean_doc_tokens']:.1f} tokens each): packed {100 * p['padding_packed']:.2f}% "
        f"in {p['rows']} rows (buffer {p['packing_buffer_size']}; target <= 3%), "
        f"unpacked {100 * p['padding_unpacked']:.2f}%",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "dataset", nargs="?", type=Path, help="Energon image-text dataset (default: generated)"
    )
    parser.add_argument(
        "--images", type=int, default=512, help="images in the generated default dataset"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--encoder-config", type=Path, default=REPO / "configs" / "encoders" / "image_text.yaml"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--padding-rows", type=int, default=240)
    args = parser.parse_args(argv)
    check_json_out(args.json)  # before any work: new, or a benchmark JSON

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dataset = args.dataset or generated_dataset(tmp, args.images)
        args.blend = blend_metadataset(dataset, tmp / "blend.yaml")
        coco = REPO / "data" / "coco_mini"
        captions = convert_coco(coco / "captions.json", coco / "images", tmp / "coco_mini")
        settings = {
            k: getattr(args, k) for k in ("workers", "batch_size", "warmup", "batches", "rounds")
        }
        result = {
            **run_record(),
            "dataset": str(args.dataset or f"{args.images} generated 320x256 PNGs"),
            "settings": {
                **settings,
                "encoder_config": str(args.encoder_config),
                "shuffle_buffer": SHUFFLE,
            },
        }
        result["throughput"] = throughput(dataset, args.encoder_config, args)
        result["padding"] = padding(captions, args.padding_rows, args.workers)
        finish_record(result)
    print(report(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
