"""One timed loader run of ``scripts.bench.loader``, in a process of its own.

    python -m scripts.bench.loader_runs KIND DATASET --crop 64 --workers 2 --batch-size 32 ...

prints one JSON line: samples, wall seconds, CPU seconds of this process and its worker processes,
minor page faults of the processes that decode (the workers; this process with no workers), each
over the timed batches only (after ``--warmup`` batches: imports, worker start, first reads).

The kinds, each doing the same work per sample (decode, a random resized crop to ``--crop``, a flip,
a colour jitter, normalize; tokenize the caption to a fixed row), written as each tool's docs
advise:

* ``floor``: PIL decode to uint8 of the image bytes already in memory, then torchvision's advised v2
  pipeline (``ToImage``, geometry on uint8, ``ToDtype(float32, scale=True)`` at the output size,
  colour, normalize); nothing else: no tar read, no tokenizer, no batching. One thread.
* ``webdataset``: a plain ``webdataset`` pipeline (``decode("pil")``, the same v2 pipeline, the
  tokenizer) batched in a torch ``DataLoader``.
* ``energon``: Energon's own loader (``get_train_dataset``, ``get_savable_loader``) with a minimal
  ``DefaultTaskEncoder`` doing the same: its ``decoder`` is ``SampleDecoder(image_decode="pil")``.
* ``ours``: ``energon_platform.TrainLoader`` (the public entry point) with the ``image_text``
  encoder (bit-identical default path); ``ours_draft``: the same with ``image.draft_decode: true``;
  ``ours_u8``: with ``image.uint8_resize: true``.
* ``tiles``: ``--tile`` (448) vision-language tiles instead of a crop: ``floor`` kind
  ``floor_tiles`` (uint8 resize to the tile grid, float, colour, cut), ``ours_tiles`` (the
  bit-identical default) and ``ours_tiles_u8`` (``image.uint8_resize: true``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from task_encoders.tiling import TilingConfig, choose_grid
from task_encoders.tokenization import DEFAULT_TOKENIZER_DIR, load_hf_tokenizer

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
JITTER = {"brightness": 0.2, "contrast": 0.2, "saturation": 0.2}
SCALE = (0.5, 1.0)
SEQ_LEN = 48
SHUFFLE = 100
TILING = {"enabled": True, "max_num_tiles": 4, "use_thumbnail": True}


def user_pipeline(crop: int) -> v2.Compose:
    """torchvision's advice for v2: uint8 image first, geometry on uint8, float at the output size."""
    return v2.Compose(
        [
            v2.ToImage(),
            v2.RandomResizedCrop(crop, scale=SCALE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.ColorJitter(**JITTER),
            v2.Normalize(MEAN, STD),
        ]
    )


def user_tiles(image: Image.Image, tile: int) -> torch.Tensor:
    """A user's dynamic tiling: the grid chosen as ours, the resize to it on uint8, then float,
    colour and normalize, the tiles cut and a thumbnail added."""
    cfg = TilingConfig(**TILING)
    cols, rows = choose_grid(image.width, image.height, tile, cfg)
    bicubic = v2.InterpolationMode.BICUBIC
    grid = F.resize(F.pil_to_tensor(image), [rows * tile, cols * tile], bicubic, antialias=True)
    grid = v2.Normalize(MEAN, STD)(v2.ColorJitter(**JITTER)(grid.float() / 255))
    tiles = [
        grid[:, r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
        for r in range(rows)
        for c in range(cols)
    ]
    if len(tiles) > 1:
        tiles.append(F.resize(grid, [tile, tile], bicubic, antialias=True))
    return torch.stack(tiles)


def tokenize(tokenizer: Any, caption: str) -> torch.Tensor:
    ids = tokenizer(caption, truncation=True, max_length=SEQ_LEN)["input_ids"]
    row = torch.full((SEQ_LEN,), tokenizer.pad_token_id or 0, dtype=torch.int64)
    row[: len(ids)] = torch.tensor(ids)
    return row


# --- the loaders ---------------------------------------------------------------------------------


def webdataset_loader(dataset: Path, args: argparse.Namespace) -> Any:
    import webdataset as wds

    pipeline, tokenizer = user_pipeline(args.crop), load_hf_tokenizer(DEFAULT_TOKENIZER_DIR)

    def encode(item: tuple) -> tuple:
        image, meta = item
        return pipeline(image), tokenize(tokenizer, meta["caption"])

    def collate(items: list) -> dict:
        return {
            "images": torch.stack([i for i, _ in items]),
            "tokens": torch.stack([t for _, t in items]),
        }

    urls = sorted(str(p) for p in (dataset / "train").glob("*.tar"))
    pipe = (
        wds.WebDataset(urls, shardshuffle=len(urls), workersplitter=wds.split_by_worker)
        .repeat()
        .shuffle(SHUFFLE)
        .decode("pil")
        .to_tuple("image.jpg;image.png;image.jpeg", "text.json")
        .map(encode)
        .batched(args.batch_size, collation_fn=collate, partial=False)
    )
    return torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=args.workers)


def energon_loader(dataset: Path, args: argparse.Namespace) -> Any:
    from megatron.energon import (
        DefaultTaskEncoder,
        SampleDecoder,
        get_savable_loader,
        get_train_dataset,
        stateless,
    )

    pipeline, tokenizer = user_pipeline(args.crop), load_hf_tokenizer(DEFAULT_TOKENIZER_DIR)

    class UserEncoder(DefaultTaskEncoder):
        decoder = SampleDecoder(image_decode="pil")

        @stateless
        def encode_sample(self, sample: Any) -> dict:
            return {
                "image": pipeline(sample.image),
                "tokens": tokenize(tokenizer, sample.caption),
            }

        def batch(self, samples: list) -> dict:
            return {
                "images": torch.stack([s["image"] for s in samples]),
                "tokens": torch.stack([s["tokens"] for s in samples]),
            }

    from megatron.energon import WorkerConfig

    train = get_train_dataset(
        dataset,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=args.workers),
        batch_size=args.batch_size,
        shuffle_buffer_size=SHUFFLE,
        max_samples_per_sequence=None,
        task_encoder=UserEncoder(),
    )
    return get_savable_loader(train)


def ours_loader(dataset: Path, args: argparse.Namespace) -> Any:
    from energon_platform import TrainLoader, load_config

    image: dict[str, Any] = {
        "transforms": [
            {"name": "RandomResizedCrop", "size": args.crop, "scale": list(SCALE)},
            {"name": "RandomHorizontalFlip"},
            {"name": "ColorJitter", **JITTER},
            {"name": "Normalize", "mean": MEAN, "std": STD},
        ],
        "draft_decode": args.kind == "ours_draft",
        "uint8_resize": args.kind == "ours_u8",
    }
    encoder: dict[str, Any] = {"encoder": "image_text", "text": {"seq_len": SEQ_LEN}}
    if args.kind.startswith("ours_tiles"):
        image = {
            "uint8_resize": args.kind == "ours_tiles_u8",
            "tiling": TILING,
            "transforms": [
                {"name": "ColorJitter", **JITTER},
                {"name": "Normalize", "mean": MEAN, "std": STD},
            ],
        }
        encoder.update(
            text={"seq_len": 8192},
            prompt={"enabled": True},
            vision={"model_type": "clip", "image_size": args.tile, "patch_dim": 14},
        )
    config = {
        "data": {"path": str(dataset), "val_split": None},
        "encoder": {**encoder, "image": image},
        "loader": {
            "global_batch_size": args.batch_size,
            "num_workers": args.workers,
            "shuffle_buffer": SHUFFLE,
        },
    }
    if args.blend:
        config["data"]["path"] = str(args.blend)
    return TrainLoader(load_config(config))


# --- one-thread floors ---------------------------------------------------------------------------


def image_bytes(dataset: Path, count: int) -> list[bytes]:
    """The first ``count`` images of the train split, as bytes in memory."""
    import tarfile

    out = []
    for shard in sorted((dataset / "train").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.rsplit(".", 1)[-1] in ("jpg", "jpeg", "png"):
                    out.append(tar.extractfile(member).read())
                    if len(out) == count:
                        return out
    return out


def floor(dataset: Path, args: argparse.Namespace) -> dict:
    """Per sample: PIL decode of bytes in memory + the advised pipeline (or tiles), one thread."""
    torch.set_num_threads(1)
    pipeline = user_pipeline(args.crop)
    n = (args.warmup + args.batches) * args.batch_size
    data = image_bytes(dataset, n)
    data = (data * (n // len(data) + 1))[:n]

    def one(raw: bytes) -> torch.Tensor:
        image = Image.open(io.BytesIO(raw))
        image.load()
        image = image if image.mode == "RGB" else image.convert("RGB")  # no copy when already RGB
        return user_tiles(image, args.tile) if args.kind == "floor_tiles" else pipeline(image)

    warm = args.warmup * args.batch_size
    for raw in data[:warm]:
        one(raw)
    before = snapshot()
    for raw in data[warm:]:
        one(raw)
    return measured(before, snapshot(), len(data) - warm)


# --- measuring -----------------------------------------------------------------------------------


def _children() -> list[int]:
    me, found = str(os.getpid()), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            found.append(int(stat.parent.name))
    return found


def _proc(pid: int) -> tuple[float, int]:
    """(CPU seconds, minor faults) of a live process (``/proc/PID/stat`` fields 14+15 and 10)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def snapshot(workers: int = 0) -> dict:
    """Wall time, CPU of this process and its children, minor faults of the processes that decode:
    the worker processes, or this one with ``workers`` 0."""
    cpu, faults = _proc(os.getpid())
    children = [(pid, _proc(pid)) for pid in _children()]
    return {
        "wall": time.perf_counter(),
        "cpu": time.process_time() + sum(c for _, (c, _) in children),
        "faults": {pid: f for pid, (_, f) in children} if workers else {os.getpid(): faults},
    }


def measured(before: dict, after: dict, samples: int) -> dict:
    common = set(before["faults"]) & set(after["faults"])
    faults = sum(after["faults"][p] - before["faults"][p] for p in common)
    return {
        "samples": samples,
        "wall_s": after["wall"] - before["wall"],
        "cpu_s": after["cpu"] - before["cpu"],
        "faults": faults,
        "samples_per_s": samples / (after["wall"] - before["wall"]),
        "cpu_ms_per_sample": 1000 * (after["cpu"] - before["cpu"]) / samples,
        "faults_per_sample": faults / samples,
    }


def timed(loader: Any, args: argparse.Namespace) -> dict:
    it = iter(loader)
    for _ in range(args.warmup):
        next(it)
    before = snapshot(args.workers)
    for _ in range(args.batches):
        next(it)
    result = measured(before, snapshot(args.workers), args.batches * args.batch_size)
    if hasattr(loader, "close"):
        loader.close()
    return result


LOADERS = {
    "webdataset": webdataset_loader,
    "energon": energon_loader,
    "ours": ours_loader,
    "ours_draft": ours_loader,
    "ours_u8": ours_loader,
    "ours_tiles": ours_loader,
    "ours_tiles_u8": ours_loader,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.loader_runs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("kind", choices=[*LOADERS, "floor", "floor_tiles"])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--blend", type=Path, help="read this metadataset instead (ours only)")
    parser.add_argument("--crop", type=int, default=64)
    parser.add_argument("--tile", type=int, default=448)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args(argv)
    if args.kind.startswith("floor"):
        result = floor(args.dataset, args)
    else:
        if args.workers == 0:
            torch.set_num_threads(1)
        result = timed(LOADERS[args.kind](args.dataset, args), args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
