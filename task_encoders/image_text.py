"""Image-caption pairs → augmented images + caption tokens (``encoder: image_text``).

Input: Energon ``CaptioningSample`` (``image`` float (C, H, W) in [0, 1], ``caption`` str).
Per sample: the ``image.transforms`` pipeline (``image.eval_transforms`` with ``training=False``)
seeded by (seed, key, epoch); the caption as ``[BOS, ..., EOS]``. With ``packing.enabled`` several
image-caption documents share a row; the images stay one per document, in document order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.energon import edataclass

from task_encoders.config import At, EncoderConfig
from task_encoders.documents import DocumentTaskEncoder, EncodedDoc, TextBatch
from task_encoders.image_transforms import TransformSpec, build_pipeline, default_eval_specs, output_size
from task_encoders.registry import register
from task_encoders.seeding import seeded_global_torch

_IMAGENET_MEAN = {"name": "Normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def _default_transforms() -> tuple[TransformSpec, ...]:
    return tuple(TransformSpec.from_config_value(v, At(key="image.transforms")) for v in (
        {"name": "RandomResizedCrop", "size": 224, "scale": [0.5, 1.0]},
        {"name": "RandomHorizontalFlip"},
        _IMAGENET_MEAN))


@dataclass(frozen=True)
class ImageConfig:
    """``image:``: ``transforms`` (training) and ``eval_transforms`` (default: Resize + CenterCrop
    to the training size + the training Normalize); see :mod:`task_encoders.image_transforms`."""

    transforms: tuple[TransformSpec, ...] = field(default_factory=_default_transforms)
    eval_transforms: tuple[TransformSpec, ...] | None = None

    def check(self, at: At) -> None:
        size = output_size(self.transforms, at.child("transforms"))
        if self.eval_transforms is not None:
            eval_size = output_size(self.eval_transforms, at.child("eval_transforms"))
            if eval_size != size:
                raise at.child("eval_transforms").error(f"output size {list(eval_size)}", f"the training size {list(size)}")

    @property
    def size(self) -> tuple[int, int]:
        """Output (height, width)."""
        return output_size(self.transforms, At())

    def pipeline_specs(self, training: bool) -> tuple[TransformSpec, ...]:
        if training:
            return self.transforms
        return self.eval_transforms or default_eval_specs(self.transforms, self.size)


@dataclass(frozen=True)
class ImageTextConfig(EncoderConfig):
    encoder: str = "image_text"
    image: ImageConfig = field(default_factory=ImageConfig)


@edataclass
class ImageTextBatch(TextBatch):
    """:class:`task_encoders.documents.TextBatch` plus ``images``: float32 ``(D, C, h, w)``, one per
    document in ``keys`` order (``D == N`` without packing; ``num_docs`` splits them per row)."""

    images: torch.Tensor


@register("image_text")
class ImageTextTaskEncoder(DocumentTaskEncoder):
    """``ImageTextTaskEncoder(config=None, *, seed=None, training=True)``; batches are
    :class:`ImageTextBatch`. ``training=False`` uses ``image.eval_transforms``."""

    config_class = ImageTextConfig
    batch_type = ImageTextBatch

    def __init__(self, config: Any = None, *, seed: int | None = None, training: bool = True):
        super().__init__(config, seed=seed, training=training)
        self.pipeline = build_pipeline(self.config.image.pipeline_specs(training))

    def encode_media(self, sample: Any) -> dict[str, torch.Tensor]:
        image = sample.image
        if not isinstance(image, torch.Tensor) or image.ndim != 3:
            raise TypeError(f"expected a (C, H, W) image tensor, got {type(image).__name__}")
        if not image.is_floating_point():
            image = image.float() / 255.0
        with seeded_global_torch(self.sample_seed(sample, "image")):
            image = self.pipeline(image)
        return {"image": image.to(torch.float32).contiguous()}

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        return {"images": torch.stack([d.media["image"] for d in docs])}
