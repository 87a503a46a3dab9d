"""The uint8-first image path (`task_encoders.image_path`): bit for bit today's float path by default,
draft decoding and uint8 resizes opt-in and fingerprinted, bad images as before."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from webdataset.autodecode import imagehandler

from energon_platform.config import load_config
from energon_platform.loader.state import StateMismatchError
from energon_platform.loader.train_loader import TrainLoader
from energon_platform.training.train import batch_digest
from scripts.bench.data import coco_dataset
from task_encoders.config_parser import At, ConfigError, to_plain
from task_encoders.image_path import ImageBytesDecoder, ImagePath, draft_scale, open_image
from task_encoders.image_text import ImageConfig, ImageTextConfig
from task_encoders.image_transforms import TransformSpec, build_pipeline
from task_encoders.registry import get_encoder
from tests.encoders.image_path_record import FIXTURE, REPO, case_digests

TORCHRGB = imagehandler("torchrgb")


def reference(data: bytes, specs: tuple[TransformSpec, ...], seed: int) -> torch.Tensor:
    """Today's path before this module: Energon's ``torchrgb`` float decode of the whole image,
    then the v2 ``Compose`` of the steps on float."""
    torch.manual_seed(seed)
    return build_pipeline(specs)(TORCHRGB("x.png", data)).to(torch.float32)


def specs(*steps: dict) -> tuple[TransformSpec, ...]:
    return tuple(TransformSpec.from_config_value(s, At()) for s in steps)


def encoded(image: Image.Image, fmt: str, **save) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def odd_images() -> list[tuple[str, bytes]]:
    """Photo-like noise in every mode ``torchrgb`` converts: RGB, L, P, RGBA, CMYK (JPEG), 16-bit
    grayscale, 1-bit, at odd sizes, as PNG and JPEG."""
    rng = np.random.default_rng(7)
    out = []
    for i, (h, w) in enumerate(((61, 97), (120, 80), (33, 200), (96, 96))):
        rgb = Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))
        out += [
            (f"rgb-png-{i}", encoded(rgb, "PNG")),
            (f"rgb-jpeg-{i}", encoded(rgb, "JPEG", quality=85)),
            (f"l-png-{i}", encoded(rgb.convert("L"), "PNG")),
            (f"p-png-{i}", encoded(rgb.convert("P"), "PNG")),
            (f"rgba-png-{i}", encoded(rgb.convert("RGBA"), "PNG")),
            (f"cmyk-jpeg-{i}", encoded(rgb.convert("CMYK"), "JPEG")),
            (
                f"i16-png-{i}",
                encoded(Image.fromarray(rng.integers(0, 65535, (h, w), np.uint16)), "PNG"),
            ),
            (f"1bit-png-{i}", encoded(rgb.convert("1"), "PNG")),
        ]
    return out


PIPELINES = {
    "random_resized_crop": specs(
        {"name": "RandomResizedCrop", "size": 24, "scale": [0.08, 1.0]},
        {"name": "RandomHorizontalFlip"},
        {"name": "ColorJitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
        {"name": "Normalize", "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.3, 0.25]},
    ),
    "rrc_nearest_upscale": specs(
        {"name": "RandomResizedCrop", "size": [150, 90], "interpolation": "nearest"},
    ),
    "flip_then_crop": specs(
        {"name": "RandomHorizontalFlip", "p": 0.7},
        {"name": "RandomCrop", "size": 30},
        {"name": "ColorJitter", "brightness": 0.3},
    ),
    "center_crop_pads": specs({"name": "CenterCrop", "size": [40, 220]}),
    "resize_then_crop": specs(
        {"name": "Resize", "size": 40},
        {"name": "CenterCrop", "size": 32},
        {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    ),
    "whole_image": specs(
        {"name": "RandomHorizontalFlip"}, {"name": "ColorJitter", "contrast": 0.5}
    ),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_default_path_is_bit_identical_to_the_float_path(name):
    steps = PIPELINES[name]
    path = ImagePath(steps)
    for seed, (label, data) in enumerate(odd_images()):
        want = reference(data, steps, seed)
        torch.manual_seed(seed)
        got = path(data)
        assert got.dtype == torch.float32 and got.is_contiguous()
        assert torch.equal(got, want), f"{name}: {label} differs"
        # the same from a decoded float or uint8 tensor
        torch.manual_seed(seed)
        assert torch.equal(path(TORCHRGB("x.png", data)), want), label


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder where ``coco_dataset`` converts ``data/coco_mini`` (as PNG, or JPEGs kept) once."""
    return tmp_path_factory.mktemp("photos")


def test_the_recorded_digests_of_the_embedded_photos_hold(photos):
    """The image encoders' output on ``data/coco_mini`` (PNG and kept JPEG, crops, eval resizes,
    tiles) is byte for byte what it was before images were decoded to uint8: the digests were
    recorded then (``python -m tests.encoders.image_path_record``)."""
    found = case_digests(photos, lambda source, index, encoder: source.load(index, encoder.decoder))
    assert found == json.loads(FIXTURE.read_text())


def draft_config(data, draft: bool, workers: int = 0):
    return load_config(
        {
            "data": {"path": str(data)},
            "encoder": {
                "encoder": "image_text",
                "text": {"seq_len": 48},
                "image": {
                    "transforms": [{"name": "RandomResizedCrop", "size": 16, "scale": [0.5, 1.0]}],
                    "draft_decode": draft,
                },
            },
            "loader": {"global_batch_size": 8, "num_workers": workers},
        }
    )


def batches(config, steps: int, state: dict | None = None) -> list[list[str]]:
    loader = TrainLoader(config)
    if state is not None:
        loader.load_state_dict(state)
    out = [batch_digest(next(loader)) for _ in range(steps)]
    loader.close()
    return out


def test_draft_decoding_resumes_exactly_on_other_workers_and_a_flip_is_refused(photos):
    data = coco_dataset(photos, "keep")  # JPEG: draft decoding applies
    reference = batches(draft_config(data, True), 5)
    assert reference != batches(draft_config(data, False), 5)  # it did decode smaller
    loader = TrainLoader(draft_config(data, True))
    for _ in range(2):
        next(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    assert batches(draft_config(data, True, workers=2), 3, state) == reference[2:]
    with pytest.raises(StateMismatchError, match="encoder.config_sha"):
        TrainLoader(draft_config(data, False)).load_state_dict(state)


def test_the_encoders_take_images_as_bytes():
    for config in ("image_text_small", "image_text_vlm_small", "conversation_small", "multimodal"):
        encoder = get_encoder(REPO / "configs/encoders" / f"{config}.yaml")
        assert isinstance(encoder.decoder, ImageBytesDecoder), config


def test_options_are_out_of_the_fingerprint_until_set():
    """A config written before the options existed keeps its plain form (so its fingerprint and
    length-index digest); setting one changes it."""
    plain = to_plain(ImageConfig())
    assert "draft_decode" not in plain and "uint8_resize" not in plain
    assert to_plain(ImageConfig(draft_decode=True))["draft_decode"] is True
    assert to_plain(ImageConfig(uint8_resize=True))["uint8_resize"] is True


def test_draft_decode_needs_a_leading_random_resized_crop():
    config = {"image": {"draft_decode": True, "transforms": [{"name": "Resize", "size": [8, 8]}]}}
    with pytest.raises(ConfigError, match="draft_decode.*RandomResizedCrop"):
        get_encoder({"encoder": "image_text", **config})


def jpeg_photo(h: int = 480, w: int = 640) -> bytes:
    """A smooth photo-like JPEG (gradients and blobs, mild noise)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(3)
    img = np.stack(
        [
            128 + 100 * np.sin(x / 37 + c) * np.cos(y / 23 - c) + rng.normal(0, 4, (h, w))
            for c in range(3)
        ],
        axis=-1,
    )
    return encoded(Image.fromarray(img.clip(0, 255).astype(np.uint8)), "JPEG", quality=90)


def test_draft_scale_picks_the_smallest_dct_scale_that_covers_the_crop():
    data = jpeg_photo()
    image = open_image(data)
    box = draft_scale(image, (40, 80, 400, 480), (64, 64))  # 400/64 = 6.25: 1/4 is the smallest
    assert image.size == (160, 120) and box == (20.0, 10.0, 140.0, 110.0)
    image = open_image(data)
    assert draft_scale(image, (0, 0, 100, 100), (64, 64)) is None  # < 2x the output: full size
    assert image.size == (640, 480)
    png = open_image(encoded(Image.open(io.BytesIO(data)), "PNG"))
    assert draft_scale(png, (40, 80, 400, 480), (64, 64)) is None


@pytest.mark.parametrize("size", [(480, 640), (427, 640), (481, 641)])
def test_draft_decode_is_close_deterministic_and_cheaper(size):
    """Also at sizes the DCT scale does not divide (COCO's 640x427): the box maps by the scale
    itself, not by the rounded-up decoded size."""
    steps = specs({"name": "RandomResizedCrop", "size": 64, "scale": [0.5, 1.0]})
    data = jpeg_photo(*size)
    full, draft = ImagePath(steps), ImagePath(steps, draft_decode=True)
    errors = []
    for seed in range(20):
        torch.manual_seed(seed)
        want = full(data)
        torch.manual_seed(seed)
        got = draft(data)
        torch.manual_seed(seed)
        assert torch.equal(draft(data), got)  # a pure function of the seed
        assert got.shape == want.shape
        errors.append(float((got - want).abs().mean()))
    assert max(errors) < 1.2 / 255, errors  # the same region, decoded smaller
    assert sum(errors) > 0  # it did decode smaller


def test_uint8_resize_is_close_and_opt_in():
    steps = PIPELINES["resize_then_crop"]
    data = jpeg_photo(120, 160)
    torch.manual_seed(0)
    want = ImagePath(steps)(data)
    torch.manual_seed(0)
    got = ImagePath(steps, uint8_resize=True)(data)
    assert got.shape == want.shape and not torch.equal(got, want)
    assert float((got - want).abs().max()) < 0.05  # Normalize scales [0,1] by 2: ~2.5/255 at most


@pytest.mark.parametrize("draft_decode", [False, True])
def test_a_corrupt_image_fails_in_the_encoder_as_a_decode_failure(draft_decode):
    steps = specs({"name": "RandomResizedCrop", "size": 16})
    data = jpeg_photo(120, 160)
    with pytest.raises(OSError):
        ImagePath(steps, draft_decode=draft_decode)(data[: len(data) // 2])
    with pytest.raises(Image.UnidentifiedImageError):
        ImagePath(steps, draft_decode=draft_decode)(b"not an image")


def test_a_truncated_jpeg_under_draft_decoding_fails_as_in_full_decoding():
    steps = specs({"name": "RandomResizedCrop", "size": 16})
    cut = jpeg_photo()[:5000]
    errors = []
    for path in (ImagePath(steps), ImagePath(steps, draft_decode=True)):
        with pytest.raises(OSError) as e:
            torch.manual_seed(0)
            path(cut)
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_encoder_config_keys_are_read_and_checked():
    cfg = ImageTextConfig(
        image=ImageConfig(
            transforms=specs({"name": "RandomResizedCrop", "size": 16}), draft_decode=True
        )
    )
    encoder = get_encoder(cfg)
    assert encoder.pipeline.draft_decode and not encoder.pipeline.uint8_resize
    with pytest.raises(ConfigError, match="uint8_resize"):
        get_encoder({"encoder": "image_text", "image": {"uint8_resize": "yes"}})


def test_uint8_resize_tiles_match_the_default_tiles_closely():
    config = {
        "encoder": "image_text",
        "prompt": {"enabled": True},
        "vision": {"model_type": "clip", "image_size": 32, "patch_dim": 8},
        "image": {
            "tiling": {"enabled": True, "max_num_tiles": 4, "use_thumbnail": True},
            "transforms": [
                {"name": "RandomHorizontalFlip"},
                {"name": "ColorJitter", "brightness": 0.2},
            ],
        },
    }
    default = get_encoder(config)
    fast = get_encoder({**config, "image": {**config["image"], "uint8_resize": True}})
    sample = SimpleNamespace(image=jpeg_photo(90, 150), __key__="k", __subflavors__={"epoch": 0})
    want, got = (
        default.encode_images(sample, [sample.image]),
        fast.encode_images(sample, [sample.image]),
    )
    assert (
        torch.equal(want["num_tiles"], got["num_tiles"])
        and got["images"].shape == want["images"].shape
    )
    assert not torch.equal(got["images"], want["images"])
    assert float((got["images"] - want["images"]).abs().mean()) < 3 / 255


def test_multimodal_takes_bytes_or_refuses_the_byte_options(monkeypatch):
    """A modality whose encoder needs Energon's float decode makes the multimodal encoder decode
    images to float; an image option that acts on bytes is then refused, not silently ignored."""
    from megatron.energon import SampleDecoder

    from task_encoders.audio_text import AudioTextTaskEncoder

    config = {
        "encoder": "multimodal",
        "modalities": {
            "image_text": {"image": {"transforms": [{"name": "RandomResizedCrop", "size": 16}]}},
            "audio_text": {},
        },
    }
    assert isinstance(get_encoder(config).decoder, ImageBytesDecoder)
    monkeypatch.setattr(AudioTextTaskEncoder, "decoder", SampleDecoder())
    assert not isinstance(get_encoder(config).decoder, ImageBytesDecoder)
    config["modalities"]["image_text"]["image"]["draft_decode"] = True
    with pytest.raises(ConfigError, match=r"draft_decode.*'audio_text' decodes images to float"):
        get_encoder(config)


def test_uint8_resize_tiles_accept_a_float_image():
    path = ImagePath(specs({"name": "RandomHorizontalFlip"}), uint8_resize=True)
    image = TORCHRGB("x.jpg", jpeg_photo(50, 70))
    assert path.resized(image, (32, 64), "bicubic").shape == (3, 32, 64)
