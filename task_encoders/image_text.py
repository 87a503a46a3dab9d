"""Image-caption pairs → augmented images + caption tokens (``encoder: image_text``).

Input: Energon ``CaptioningSample`` (``image``: the file's bytes, from the encoder's
`task_encoders.image_path.ImageBytesDecoder`, or a decoded ``(C, H, W)`` tensor; ``caption`` str).
Per sample: the ``image.transforms`` pipeline (``image.eval_transforms`` with ``training=False``),
run by `task_encoders.image_path.ImagePath` (uint8 until the crop, float at the output size, bit
for bit the float pipeline's output) seeded by (seed, key, epoch); the caption as
``[BOS, ..., EOS]``. With ``packing.enabled`` several image-caption documents share a row; the
images stay one per document, in document order.

With ``prompt.enabled: true`` (vision-language mode: a prompt template, ``<image>`` placeholders,
tiles, spliced lengths) `task_encoders.registry.get_encoder` builds
`task_encoders.vision_language.VisionLanguageTaskEncoder` instead, from the same
`ImageTextConfig`; this class refuses such a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from string import Formatter
from typing import Any, ClassVar

import torch
from megatron.energon import edataclass
from PIL import Image

from task_encoders.batch_fields import ImageFields
from task_encoders.batch_tensors import Medium
from task_encoders.config import EncoderConfig
from task_encoders.config_parser import OMITTED_WHEN_DEFAULT, At, require
from task_encoders.documents import DocumentTaskEncoder, EncodedDoc, TextBatch
from task_encoders.features import features
from task_encoders.image_path import ImageBytesDecoder, build_image_path, open_image
from task_encoders.image_transforms import TransformSpec, default_eval_specs, output_size
from task_encoders.registry import register
from task_encoders.seeding import seeded_global_torch
from task_encoders.tiling import TilingConfig, VisionConfig

_IMAGENET_MEAN = {"name": "Normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
#: Transforms allowed with tiling: they keep the image's size, so they can run before the tiles are cut.
WHOLE_IMAGE_TRANSFORMS = ("RandomHorizontalFlip", "ColorJitter", "Normalize")


def image_size(image: Any) -> tuple[int, int]:
    """``(width, height)`` of an image part: file bytes (read from the header, no pixels decoded),
    an opened PIL image, or a decoded ``(C, H, W)`` tensor."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        with open_image(image) as img:
            return img.size
    if isinstance(image, Image.Image):
        return image.size
    if isinstance(image, torch.Tensor) and image.ndim == 3:
        return int(image.shape[-1]), int(image.shape[-2])
    raise TypeError(f"expected image bytes or a (C, H, W) tensor, got {type(image).__name__}")


def _default_transforms() -> tuple[TransformSpec, ...]:
    return tuple(
        TransformSpec.from_config_value(v, At(key="image.transforms"))
        for v in (
            {"name": "RandomResizedCrop", "size": 224, "scale": [0.5, 1.0]},
            {"name": "RandomHorizontalFlip"},
            _IMAGENET_MEAN,
        )
    )


@dataclass(frozen=True)
class ImageConfig:
    """``image:``: the image pipelines (`task_encoders.image_transforms`) and tiling.

    Without tiling both pipelines give the same fixed output size. With ``tiling.enabled`` both
    lists may only hold `WHOLE_IMAGE_TRANSFORMS` (eval default: the training Normalize steps)."""

    transforms: tuple[TransformSpec, ...] = field(default_factory=_default_transforms)
    """The training pipeline: a list of ``{name: TRANSFORM, PARAMETER: VALUE, ...}`` steps, run in
    order with the sample's seeded generator."""
    eval_transforms: tuple[TransformSpec, ...] | None = None
    """The pipeline with ``training=False``; null: Resize + CenterCrop to the training size + the
    training Normalize steps."""
    tiling: TilingConfig = field(default_factory=TilingConfig)
    """Dynamic-resolution tiles (`task_encoders.tiling.TilingConfig`), vision-language mode only."""
    draft_decode: bool = field(default=False, metadata={OMITTED_WHEN_DEFAULT: True})
    """Decode JPEGs at the smallest DCT scale (1/2, 1/4, 1/8) that still covers the random crop at
    the output size (`task_encoders.image_path.draft_scale`): about 2x cheaper on photos cut to
    small crops, not bit-identical to a full decode (the mean pixel error is on the measurements
    page). Only with a leading ``RandomResizedCrop``; other pipelines decode in full."""
    uint8_resize: bool = field(default=False, metadata={OMITTED_WHEN_DEFAULT: True})
    """Resize on uint8 before the float step (torchvision's advice for v2): cheaper where a
    ``Resize`` comes before the crop, for large crops, and for tiles (the image is resized to the
    tile grid first, the whole-image steps run at the grid's size, the thumbnail is made from the
    grid); not bit-identical to the default path, which resizes float."""

    def check(self, at: At) -> None:
        require(
            not self.draft_decode
            or (bool(self.transforms) and self.transforms[0].name == "RandomResizedCrop"),
            at.child("draft_decode"),
            "true, but image.transforms do not start with RandomResizedCrop",
            "false, or a pipeline whose first step is RandomResizedCrop (the crop decides the scale)",
        )
        if self.tiling.enabled:
            for key, specs in (
                ("transforms", self.transforms),
                ("eval_transforms", self.eval_transforms or ()),
            ):
                for i, spec in enumerate(specs):
                    require(
                        spec.name in WHOLE_IMAGE_TRANSFORMS,
                        at.child(key).item(i).child("name"),
                        f"{spec.name} with image.tiling.enabled (tiles are cut after the transforms, "
                        f"at vision.image_size)",
                        "one of " + ", ".join(WHOLE_IMAGE_TRANSFORMS),
                    )
            return
        size = output_size(self.transforms, at.child("transforms"))
        if self.eval_transforms is not None:
            eval_size = output_size(self.eval_transforms, at.child("eval_transforms"))
            if eval_size != size:
                raise at.child("eval_transforms").error(
                    f"output size {list(eval_size)}", f"the training size {list(size)}"
                )

    @property
    def size(self) -> tuple[int, int]:
        """Output (height, width) without tiling."""
        return output_size(self.transforms, At())

    def pipeline_specs(self, training: bool) -> tuple[TransformSpec, ...]:
        if training:
            return self.transforms
        if self.eval_transforms is not None:
            return self.eval_transforms
        if self.tiling.enabled:
            return tuple(s for s in self.transforms if s.name == "Normalize")
        return default_eval_specs(self.transforms, self.size)


@dataclass(frozen=True)
class PromptConfig:
    """``prompt:``: vision-language mode (`task_encoders.vision_language`).

    ``special_tokens`` must hold ``image_token``; ``template`` holds ``{image}`` exactly once and
    ``{instruction}`` at most once, and needs ``instructions`` when it holds ``{instruction}``."""

    enabled: bool = False
    """Whether the encoder builds vision-language batches (prompt, placeholders, tiles); false:
    plain captions, no placeholder."""
    image_token: str = "<image>"
    """The placeholder that stands for one image in the text."""
    special_tokens: tuple[str, ...] = ("<image>",)
    """Megatron's ``--special-tokens`` list, in its order, added to the tokenizer."""
    template: str = "{image}\n{instruction}\n"
    """The text before the caption: ``{image}`` becomes the placeholders, ``{instruction}`` one of
    ``instructions``."""
    instructions: tuple[str, ...] = ("Give a short description of the image.",)
    """The instructions; one is picked per sample with the sample's seeded generator."""

    def check(self, at: At) -> None:
        require(
            self.image_token in self.special_tokens,
            at.child("special_tokens"),
            f"{list(self.special_tokens)} lacks image_token {self.image_token!r}",
            "a list holding prompt.image_token",
        )
        try:
            names = [name for _, name, _, _ in Formatter().parse(self.template) if name is not None]
        except ValueError as e:
            raise at.child("template").error(
                f"{self.template!r}: {e}", "a template with {image} and {instruction}"
            ) from None
        require(
            names.count("image") == 1 and set(names) <= {"image", "instruction"},
            at.child("template"),
            f"{self.template!r} has fields {names}",
            "{image} exactly once and {instruction} at most once",
        )
        require(
            bool(self.instructions) or "instruction" not in names,
            at.child("instructions"),
            "empty",
            "at least one instruction for the template's {instruction}",
        )

    def user_text(self, instruction: str, num_images: int = 1) -> str:
        return self.template.format(image=self.image_token * num_images, instruction=instruction)


@dataclass(frozen=True)
class ImageTextConfig(EncoderConfig):
    """Top level of an ``image_text`` config: the shared sections plus ``image``, ``prompt`` and
    ``vision``. Tiling needs ``prompt.enabled`` and ``vision.image_size``; vision-language mode
    without tiling needs square images whose side ``vision.patch_dim`` divides (and equals
    ``vision.image_size`` when that is set)."""

    encoder: str = "image_text"
    """The registered name of the encoder: ``image_text``."""
    image: ImageConfig = field(default_factory=ImageConfig)
    """The image pipelines and tiling (the ``image`` keys below)."""
    prompt: PromptConfig = field(default_factory=PromptConfig)
    """Vision-language mode: prompt template and placeholder (the ``prompt`` keys below)."""
    vision: VisionConfig = field(default_factory=VisionConfig)
    """The vision encoder the batches are for, in vision-language mode (the ``vision`` keys
    below)."""

    def check(self, at: At) -> None:
        super().check(at)
        if self.image.tiling.enabled:
            require(
                self.prompt.enabled,
                at.child("prompt").child("enabled"),
                "false with image.tiling.enabled",
                "true: tiles need image placeholders and num_tiles (vision-language mode)",
            )
            require(
                self.vision.image_size is not None,
                at.child("vision").child("image_size"),
                "missing with tiling",
                "the vision encoder's image size (Megatron --img-h), the tile side",
            )
        elif self.prompt.enabled:
            height, width = self.image.size
            require(
                height == width,
                at.child("image").child("transforms"),
                f"output size {[height, width]}",
                "square images (the vision encoder's img_h = img_w)",
            )
            require(
                self.vision.image_size in (None, height),
                at.child("vision").child("image_size"),
                f"{self.vision.image_size} but image.transforms give {height}",
                "the image pipeline's output size (or none)",
            )
            require(
                height % self.vision.patch_dim == 0,
                at.child("vision").child("patch_dim"),
                f"{self.vision.patch_dim} does not divide the image size {height}",
                "a divisor of the image size",
            )

    @property
    def tile_size(self) -> int:
        """The side of one tile (the vision encoder's image size)."""
        return self.vision.image_size if self.vision.image_size is not None else self.image.size[0]


@edataclass
class ImageTextBatch(TextBatch):
    """`task_encoders.documents.TextBatch` plus ``images``: float32 ``(D, C, h, w)``, one per
    document in ``keys`` order (``D == N`` without packing; ``num_docs`` splits them per row)."""

    media = (Medium("images"),)

    images: torch.Tensor


@register("image_text")
class ImageTextTaskEncoder(DocumentTaskEncoder):
    """``ImageTextTaskEncoder(config=None, *, seed=None, training=True)``; batches are
    `ImageTextBatch`. ``training=False`` uses ``image.eval_transforms``. A config with
    ``prompt.enabled: true`` raises `task_encoders.config_parser.ConfigError` (module doc)."""

    config_class = ImageTextConfig
    config: ImageTextConfig
    batch_type = ImageTextBatch
    #: The ``prompt.enabled`` this class encodes (True for the vision-language encoders).
    vision_language: ClassVar[bool] = False
    #: The image placeholder's id (None: plain captions have none).
    image_token_index: int | None = None

    #: images reach `encode_media` as file bytes: `task_encoders.image_path` decodes them to uint8
    decoder = ImageBytesDecoder()

    def __init__(self, config: Any = None, *, seed: int | None = None, training: bool = True):
        super().__init__(config, seed=seed, training=training)
        self._check_prompt_mode()
        image = self.config.image
        self.pipeline = build_image_path(image.pipeline_specs(training), image)

    def _check_prompt_mode(self) -> None:
        """``ConfigError`` unless ``prompt.enabled`` is the mode this class encodes."""
        enabled = self.config.prompt.enabled
        require(
            enabled == self.vision_language,
            self.config_at.child("prompt").child("enabled"),
            f"{str(enabled).lower()} for {type(self).__name__}",
            "true for task_encoders.vision_language.VisionLanguageTaskEncoder and its subclasses "
            "(what get_encoder builds for it), false for the plain image-caption encoder",
        )

    # --- per sample ----------------------------------------------------------------------------

    def encode_media(self, sample: Any) -> dict[str, torch.Tensor]:
        with seeded_global_torch(self.sample_seed(sample, "image")):
            image = self.pipeline(sample.image)
        return {"image": image.contiguous()}

    # --- cost features: one whole image per document through the vision tower -------------------

    def fact_media_features(
        self, facts: tuple[int, ...], key: str, epoch: int, lengths: tuple[int, int] | None = None
    ) -> dict[str, float]:
        return features(vision_tiles=1)

    def doc_media_features(self, doc: EncodedDoc) -> dict[str, float]:
        return features(vision_tiles=1)  # doc.media["image"]: its one image

    def batch_media_features(self, batch: ImageFields) -> dict[str, float]:
        return features(vision_tiles=batch.images.shape[0])

    # --- batching ------------------------------------------------------------------------------

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        return {"images": torch.stack([d.media["image"] for d in docs])}
