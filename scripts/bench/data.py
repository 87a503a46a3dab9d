"""The embedded corpora (``data/``) converted into Energon datasets, for the benchmarks and the tests.

Each function converts one corpus under ``base`` and returns the dataset folder; the converter's
resume makes a second call with the same arguments a no-op, so callers can simply ask again."""

from __future__ import annotations

from pathlib import Path

from converters.convert import ConvertOptions, run_conversion
from converters.media import ImageOptions
from scripts.bench.common import REPO


def coco_dataset(base: Path, image_format: str = "png") -> Path:
    """``data/coco_mini`` under ``base``: re-encoded as PNG (the default, ``coco_mini``), or with
    ``image_format="keep"`` its JPEGs as they are (``coco_mini_keep``)."""
    out = base / ("coco_mini" if image_format == "png" else f"coco_mini_{image_format}")
    run_conversion(
        "coco",
        {
            "annotations": str(REPO / "data/coco_mini/captions.json"),
            "images": str(REPO / "data/coco_mini/images"),
        },
        ConvertOptions(
            out=str(out),
            samples_per_shard=64,
            val_fraction=0.1,
            progress=False,
            image=ImageOptions(image_format=image_format),
        ),
    )
    return out


def librispeech_dataset(base: Path) -> Path:
    out = base / "librispeech_mini"
    run_conversion(
        "librispeech",
        {"root": str(REPO / "data/librispeech_mini")},
        ConvertOptions(out=str(out), samples_per_shard=16, val_fraction=0.1, progress=False),
    )
    return out


def text_dataset(base: Path) -> Path:
    out = base / "text_mini"
    run_conversion(
        "text",
        {
            "manifest": str(REPO / "data/text_mini/documents.jsonl"),
            "text_column": "text",
            "id_column": "id",
            "fmt": None,
        },
        ConvertOptions(out=str(out), samples_per_shard=32, progress=False),
    )
    return out


def three_modality_blend(base: Path, val: bool = False) -> Path:
    """The embedded image-text, audio-text and text corpora converted under ``base``, as a 2:1:1
    metadataset ``base/blend.yaml`` (with a ``val`` split of the image-text val part if ``val``)."""
    import yaml

    coco, speech, text = coco_dataset(base), librispeech_dataset(base), text_dataset(base)
    splits = {
        "train": {
            "blend": [
                {"weight": 2, "path": str(coco)},
                {"weight": 1, "path": str(speech)},
                {"weight": 1, "path": str(text)},
            ]
        }
    }
    if val:
        splits["val"] = {"blend": [{"weight": 1, "path": str(coco), "split_part": "val"}]}
    mds = base / "blend.yaml"
    mds.write_text(
        yaml.safe_dump(
            {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": splits}
        )
    )
    return mds


#: `skewed_captions_dataset`: tiles per image (before the thumbnail) and caption words (lognormal)
SKEW_TILES = range(1, 13)
SKEW_WORDS_MEDIAN, SKEW_WORDS_SIGMA, SKEW_WORDS_MAX = 12, 1.0, 300


def skewed_captions_dataset(base: Path, tile: int, seed: int = 0) -> Path:
    """The embedded COCO images and captions, skewed as the measured balance bench's simulated
    blend is: each image resized to an exact grid of 1-12 tiles of ``tile`` pixels (drawn
    uniformly), so a tiling encoder with that tile side and ``max_num_tiles: 12`` cuts exactly
    that grid; each caption extended to a lognormal number of words (median 12, at most 300) with
    words of the other captions. Vision work per sample then varies 12-fold and independently of
    the caption's length. Converted as COCO under ``base/skewed_captions``; deterministic in
    ``seed``."""
    import json
    import random

    from PIL import Image

    from task_encoders.tiling import candidate_grids

    root = base / "skewed_captions_raw"
    out = base / "skewed_captions"
    if not (root / "captions.json").exists():
        rng = random.Random(seed)
        source = json.loads((REPO / "data/coco_mini/captions.json").read_text(encoding="utf-8"))
        words = [w for a in source["annotations"] for w in a["caption"].split()]
        first = {}
        for a in source["annotations"]:
            first.setdefault(a["image_id"], a["caption"])
        (root / "images").mkdir(parents=True, exist_ok=True)
        images, annotations = [], []
        for row in source["images"]:
            n = rng.choice(SKEW_TILES)
            cols, rows = rng.choice(candidate_grids(n, n))
            name = f"{row['id']:06d}.png"
            with Image.open(REPO / "data/coco_mini/images" / row["file_name"]) as im:
                im.convert("RGB").resize((cols * tile, rows * tile)).save(root / "images" / name)
            caption = first[row["id"]].split()
            want = min(
                SKEW_WORDS_MAX, round(rng.lognormvariate(0, SKEW_WORDS_SIGMA) * SKEW_WORDS_MEDIAN)
            )
            caption += [rng.choice(words) for _ in range(max(0, want - len(caption)))]
            images.append(
                {"id": row["id"], "file_name": name, "width": cols * tile, "height": rows * tile}
            )
            annotations.append(
                {"id": row["id"], "image_id": row["id"], "caption": " ".join(caption)}
            )
        (root / "captions.json").write_text(
            json.dumps({"images": images, "annotations": annotations}), encoding="utf-8"
        )
    run_conversion(
        "coco",
        {"annotations": str(root / "captions.json"), "images": str(root / "images")},
        ConvertOptions(out=str(out), samples_per_shard=64, val_fraction=0.0, progress=False),
    )
    return out
