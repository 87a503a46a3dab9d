"""The embedded corpora (``data/``) converted into Energon datasets, for the benchmarks and the tests.

Each function converts one corpus under ``base`` and returns the dataset folder; the converter's
resume makes a second call with the same arguments a no-op, so callers can simply ask again."""

from __future__ import annotations

from pathlib import Path

from converters.convert import ConvertOptions, run_conversion

REPO = Path(__file__).resolve().parents[1]


def coco_dataset(base: Path) -> Path:
    out = base / "coco_mini"
    run_conversion(
        "coco",
        {
            "annotations": str(REPO / "data/coco_mini/captions.json"),
            "images": str(REPO / "data/coco_mini/images"),
        },
        ConvertOptions(out=str(out), samples_per_shard=64, val_fraction=0.1, progress=False),
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
