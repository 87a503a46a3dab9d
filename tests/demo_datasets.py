"""The embedded corpora converted once per test session (the converter's resume makes a second
call with the same arguments a no-op, so every test module can simply ask for them)."""

from __future__ import annotations

from pathlib import Path

from converters.convert import ConvertOptions, run_conversion

REPO = Path(__file__).resolve().parents[1]


def coco_dataset(base: Path) -> Path:
    out = base / "coco_mini"
    run_conversion("coco", {"annotations": str(REPO / "data/coco_mini/captions.json"),
                            "images": str(REPO / "data/coco_mini/images")},
                   ConvertOptions(out=str(out), samples_per_shard=64, val_fraction=0.1, progress=False))
    return out


def librispeech_dataset(base: Path) -> Path:
    out = base / "librispeech_mini"
    run_conversion("librispeech", {"root": str(REPO / "data/librispeech_mini")},
                   ConvertOptions(out=str(out), samples_per_shard=16, val_fraction=0.1, progress=False))
    return out
