"""The image path of every image-using encoder: file bytes → uint8 → geometry → float at the output.

Energon's default decode (``torchrgb``) turns every whole image into float32 ``(C, H, W)`` before any
crop: for a 640×480 photo cut to a 64-pixel crop, 3.7 MB written and read again per sample, most of
the loader's time. Here the encoders receive the image file's bytes (`ImageBytesDecoder`, their
Energon ``decoder``), and `ImagePath` runs the configured ``torchvision.transforms.v2`` steps:

* the file is decoded to uint8 RGB (`decode_rgb8`: the same PIL calls as ``torchrgb``, without the
  float step);
* steps that only move pixels (``CenterCrop``, ``RandomCrop``, ``RandomHorizontalFlip``) run on
  uint8 while no other step came before them;
* ``RandomResizedCrop``: its box is drawn on the full size with the same random draws, only the box
  becomes float, then it is resized;
* every other step (``Resize``, ``ColorJitter``, ``Normalize``) runs on float, as before.

**Contract (the default):** the output is bit for bit what ``torchrgb`` followed by the whole
pipeline on float gives (float conversion is per pixel, so it commutes with crops and flips;
``tests/encoders/test_image_path.py`` holds it, with digests recorded before this path existed).
Grayscale, palette, CMYK, 16-bit and RGBA images take the same conversions as ``torchrgb``
(``Image.convert("RGB")``); EXIF orientation is not applied (the converter applies it when it
writes PNG); a corrupt file raises from the encoder, which the loader's stand-in rule treats like a
decode failure.

Two opt-in options change the bytes and are part of the encoder's config, so of its fingerprint:

* ``image.draft_decode`` (`draft_scale`): a JPEG is decoded at the smallest DCT scale (1/2, 1/4,
  1/8) that still gives at least the output size across the crop box; the box is drawn on the full
  size and scaled (fractional, so the random crop is the same region), and PIL resizes it.
* ``image.uint8_resize``: resizes run on uint8 before the float step (torchvision's advice for v2),
  the ``RandomResizedCrop`` and ``Resize`` steps both, and with tiles the resize to the tile grid
  (`ImagePath.resized`), so the whole-image steps run at the grid's size and the thumbnail is
  made from the grid.

An image given as a float tensor (an encoder used with Energon's default decoder) runs the whole
pipeline on float, exactly as before; a uint8 tensor starts at the uint8 stage.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import torch
import webdataset
from megatron.energon import SampleDecoder
from megatron.energon.flavors.webdataset.sample_decoder import AVWebdatasetDecoder
from PIL import Image
from torchvision.transforms.v2 import functional as F

from task_encoders.image_transforms import TransformSpec

#: steps that only move pixels (or pad with zeros): exact on uint8 while no other step came first
PIXEL_MOVES = ("CenterCrop", "RandomCrop", "RandomHorizontalFlip")
#: the DCT scales a JPEG can be decoded at (1/2, 1/4, 1/8), largest reduction first
DRAFT_FACTORS = (8, 4, 2)
#: torchvision's interpolation modes → PIL's resampling filters (draft decoding resizes with PIL)
PIL_FILTERS = {
    F.InterpolationMode.NEAREST: Image.Resampling.NEAREST,
    F.InterpolationMode.BILINEAR: Image.Resampling.BILINEAR,
    F.InterpolationMode.BICUBIC: Image.Resampling.BICUBIC,
}


class ImageBytesDecoder(SampleDecoder):
    """Energon's ``SampleDecoder`` with images left as file bytes (audio and video decoded as by
    default): the encoder decodes them with `ImagePath`."""

    #: images reach the encoder as bytes (`images_as_bytes`)
    images_as_bytes = True

    def __init__(self):
        super().__init__()
        self._decoder = webdataset.autodecode.Decoder(
            [AVWebdatasetDecoder(video_decode_audio=False, av_decode="AVDecoder")]
        )
        self._config = {**self._config, "image_decode": "bytes (decoded by the encoder)"}


def images_as_bytes(decoder: Any) -> bool:
    """Whether ``decoder`` (an Energon ``SampleDecoder``) leaves images as file bytes."""
    return bool(getattr(decoder, "images_as_bytes", False))


def open_image(data: bytes | bytearray | memoryview) -> Image.Image:
    """The image file ``data`` opened (its header read, no pixel decoded)."""
    return Image.open(io.BytesIO(bytes(data)))


def decode_rgb8(image: Image.Image) -> torch.Tensor:
    """uint8 ``(3, H, W)`` (a view of an ``(H, W, 3)`` array) of an opened image, converted as
    Energon's ``torchrgb`` does (``load``, then ``convert("RGB")``)."""
    image.load()
    if image.mode != "RGB":
        image = image.convert("RGB")
    array = np.asarray(image)
    with warnings.catch_warnings():  # read-only memory: the path never writes into it
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).permute(2, 0, 1)


def to_float(image: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1], contiguous: ``uint8 / 255`` (``torchrgb``'s values, bit for bit); the
    bytes are laid out (C, H, W) first, a quarter of the copying of doing it on floats."""
    return image.contiguous().float().div_(255.0)


def draft_scale(
    image: Image.Image, box: tuple[int, int, int, int], out: tuple[int, int]
) -> tuple[float, float, float, float] | None:
    """Set ``image`` (opened, not loaded) to decode at the smallest JPEG DCT scale whose version of
    ``box`` (top, left, height, width on the full size) still covers ``out`` (height, width), and
    return the box on that scale as PIL's ``(left, top, right, bottom)``, in fractional pixels (the
    same region, not rounded to the smaller grid). None, and nothing set, for a non-JPEG image or a
    box smaller than twice ``out``."""
    top, left, height, width = box
    factor = next((f for f in DRAFT_FACTORS if height >= out[0] * f and width >= out[1] * f), 1)
    if image.format not in ("JPEG", "MPO") or factor == 1:
        return None
    full_w, full_h = image.size
    # PIL takes the largest scale whose size is at least the one asked: ask for the floor
    image.draft(image.mode, (max(1, full_w // factor), max(1, full_h // factor)))
    config = getattr(image, "decoderconfig", None)  # set by draft(): (scale, ...)
    scale = config[0] if config else 1  # exactly 1/scale per side
    return (left / scale, top / scale, (left + width) / scale, (top + height) / scale)


class ImagePath:
    """``path(image)`` → float32 ``(C, h, w)``: the steps of ``specs`` on ``image`` (file bytes, a
    PIL image, or a ``(C, H, W)`` tensor), uint8 as long as the module doc allows. Draws randomness
    from torch's global RNG exactly as the v2 ``Compose`` of the same steps: call it inside the
    sample's seeded context."""

    def __init__(
        self,
        specs: tuple[TransformSpec, ...],
        *,
        draft_decode: bool = False,
        uint8_resize: bool = False,
    ):
        self.specs = tuple(specs)
        self.steps = [spec.build() for spec in self.specs]
        self.draft_decode, self.uint8_resize = draft_decode, uint8_resize

    @property
    def transforms(self) -> list:
        """The built steps, under the name torchvision's ``Compose`` gives them (what a reader of
        a pipeline, such as ``preview``'s un-normalizing, looks for)."""
        return self.steps

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, (bytes, bytearray, memoryview)):
            image = open_image(image)
        if isinstance(image, torch.Tensor) and image.is_floating_point():
            for step in self.steps:
                image = step(image)
            return image.to(torch.float32)
        for spec, step in zip(self.specs, self.steps):
            if isinstance(image, torch.Tensor) and image.is_floating_point():
                image = step(image)
            elif spec.name == "RandomResizedCrop":
                image = self._resized_crop(image, step)
            elif spec.name in PIXEL_MOVES or (spec.name == "Resize" and self.uint8_resize):
                image = step(self._uint8(image))
            else:
                image = step(to_float(self._uint8(image)))
        if not (isinstance(image, torch.Tensor) and image.is_floating_point()):
            image = to_float(self._uint8(image))
        return image.to(torch.float32)

    def resized(self, image: Any, size: tuple[int, int], interpolation: str) -> torch.Tensor:
        """``image`` (bytes, PIL or uint8) decoded and resized to ``size`` (height, width) on uint8,
        antialiased: the first step of ``uint8_resize`` tiling, before the whole-image steps. A
        float image (decoded by Energon's default decoder) is resized as it is, in float."""
        if isinstance(image, (bytes, bytearray, memoryview)):
            image = open_image(image)
        if not (isinstance(image, torch.Tensor) and image.is_floating_point()):
            image = self._uint8(image)  # a float image (Energon's float decode) resizes as float
        mode = F.InterpolationMode(interpolation)
        return F.resize(image, list(size), interpolation=mode, antialias=True)

    @staticmethod
    def _uint8(image: Image.Image | torch.Tensor) -> torch.Tensor:
        if isinstance(image, torch.Tensor):
            if image.dtype != torch.uint8 or image.ndim != 3:
                raise TypeError(
                    f"expected a (C, H, W) image tensor, got {image.dtype} {image.ndim}D"
                )
            return image
        if isinstance(image, Image.Image):
            return decode_rgb8(image)
        raise TypeError(f"expected image bytes or a (C, H, W) tensor, got {type(image).__name__}")

    def _resized_crop(self, image: Image.Image | torch.Tensor, step: Any) -> torch.Tensor:
        """``RandomResizedCrop`` with its box drawn on the full size (the same draws as on float),
        the box cut from uint8, then resized (module doc: on float unless ``uint8_resize``)."""
        params = step.make_params([image])  # the full size: from the header for a PIL image
        box = (params["top"], params["left"], params["height"], params["width"])
        if self.draft_decode and isinstance(image, Image.Image):
            scaled = draft_scale(image, box, tuple(step.size))
            if scaled is not None:  # PIL resizes the fractional box of the smaller decode
                image.load()
                rgb = image if image.mode == "RGB" else image.convert("RGB")
                size = (step.size[1], step.size[0])
                return to_float(
                    decode_rgb8(
                        rgb.resize(
                            size, PIL_FILTERS[F.InterpolationMode(step.interpolation)], scaled
                        )
                    )
                )
        crop = F.crop(self._uint8(image), *box)
        if not self.uint8_resize:  # float, pixels interleaved: resized as fast, to the same bits
            crop = crop.permute(1, 2, 0).contiguous().float().div_(255.0).permute(2, 0, 1)
        out = F.resize(
            crop, list(step.size), interpolation=step.interpolation, antialias=step.antialias
        )
        return out.contiguous() if out.is_floating_point() else to_float(out)


def build_image_path(specs: tuple[TransformSpec, ...], image_config: Any) -> ImagePath:
    """`ImagePath` of ``specs`` with the options of an encoder's ``image`` config section."""
    return ImagePath(
        specs,
        draft_decode=image_config.draft_decode,
        uint8_resize=image_config.uint8_resize,
    )


__all__ = [
    "ImageBytesDecoder",
    "ImagePath",
    "build_image_path",
    "decode_rgb8",
    "draft_scale",
    "images_as_bytes",
    "open_image",
    "to_float",
]
