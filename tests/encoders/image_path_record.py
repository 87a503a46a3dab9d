"""Per-sample digests of the image encoders' output on the embedded photos, kept as a fixture.

``python -m tests.encoders.image_path_record`` writes ``fixtures/image_path_digests.json``: for each
case (an encoder config, training or eval, the corpus converted as PNG or with its JPEGs kept), the
sha256 of every encoded document's media tensors, for the first `SAMPLES` train samples of
``data/coco_mini``. It was recorded with the image path as it was before images were decoded to
uint8 (Energon's ``torchrgb`` float decode, then the v2 pipeline on the whole image);
``tests/encoders/test_image_path.py`` checks that today's path gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "image_path_digests.json"
SAMPLES = 40

#: case name → (encoder config file, training, image format of the conversion)
CASES = {
    "image_text_small/train/png": ("image_text_small.yaml", True, "png"),
    "image_text_small/train/jpeg": ("image_text_small.yaml", True, "keep"),
    "image_text/train/jpeg": ("image_text.yaml", True, "keep"),
    "image_text/eval/jpeg": ("image_text.yaml", False, "keep"),
    "image_text_vlm_small/train/jpeg": ("image_text_vlm_small.yaml", True, "keep"),
    "image_text_vlm_small/eval/png": ("image_text_vlm_small.yaml", False, "png"),
}


def media_digest(doc) -> str:
    """sha256 of a document's media tensors, by sorted name."""
    h = hashlib.sha256()
    for name in sorted(doc.media):
        value = doc.media[name]
        if hasattr(value, "numpy"):
            h.update(name.encode())
            h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()


def case_digests(base: Path, load) -> dict[str, dict[str, str]]:
    """case → key → `media_digest`; ``load(source, index, encoder)`` is the decoded sample."""
    from energon_platform.loader.source import SampleSource
    from scripts.bench.data import coco_dataset
    from task_encoders.registry import get_encoder

    out = {}
    for name, (config, training, image_format) in CASES.items():
        encoder = get_encoder(REPO / "configs/encoders" / config, training=training)
        source = SampleSource(str(coco_dataset(base, image_format)), "train")
        digests = {}
        for index in range(SAMPLES):
            sample = load(source, index, encoder)
            sample.__subflavors__ = {**(sample.__subflavors__ or {}), "epoch": 0}
            digests[sample.__key__] = media_digest(encoder.encode_sample(sample))
        out[name] = digests
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        found = case_digests(Path(tmp), lambda source, index, encoder: source[index])
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}: {sum(len(v) for v in found.values())} digests")
