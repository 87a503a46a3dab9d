"""Pixels and samples keep what they hold, one test per defect: high bit depth is scaled, not
clipped, transparency is drawn over white (3); audio parts are named by their detected format and
24-bit and float audio keep their depth (8).
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from converters.media import AudioOptions, ImageOptions
from tests.convert.test_convert import convert, members
from tests.helpers.corpora import audio_manifest, wav

# ---------------------------------------------------------------- 3: high bit depth


@pytest.mark.parametrize("mode", ["I;16", "I", "F"])
def test_high_bit_depth_is_scaled_not_clipped(mode):
    from converters.media import encode_image

    ramp = np.tile(np.linspace(0, 65535, 64), (8, 1))
    data = {
        "I;16": ramp.astype(np.uint16),
        "I": ramp.astype(np.int32),
        "F": (ramp / 65535).astype(np.float32),
    }[mode]
    buf = io.BytesIO()
    Image.fromarray(data).save(buf, format="PNG" if mode == "I;16" else "TIFF")
    assert Image.open(io.BytesIO(buf.getvalue())).mode == mode
    for fmt in ("png", "keep"):  # keep: a loader would clip it, so it is re-encoded too
        ext, png, _ = encode_image(buf.getvalue(), ImageOptions(fmt))
        out = np.asarray(Image.open(io.BytesIO(png)))[..., 0].astype(int)
        assert ext == "png" and out[0, 0] == 0 and out[0, -1] == 255
        assert len(np.unique(out)) == 64 and np.all(np.diff(out[0]) > 0)  # a ramp, not 0/255
        assert abs(out[0, 32] - round(ramp[0, 32] * 255 / 65535)) <= 1


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_transparent_pixels_are_drawn_over_white_not_the_colour_hidden_under_them(mode):
    """A fully transparent PNG trained on the colour stored under its alpha (often black or
    noise); ``keep`` re-encodes it too, since a loader would drop the alpha."""
    from converters.media import encode_image

    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., :3] = 17  # the hidden colour
    rgba[:, 4:, 3] = 255  # the right half opaque
    img = Image.fromarray(rgba, "RGBA")
    if mode == "LA":
        img = img.convert("LA")
    elif mode == "P":
        img = img.convert("RGB").quantize(2)
        img.info["transparency"] = img.getpixel((0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    for fmt in ("png", "keep"):
        ext, png, _ = encode_image(buf.getvalue(), ImageOptions(fmt))
        out = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        assert ext == "png" and (out[:, :4] == 255).all(), fmt  # transparent: white
        if mode != "P":
            assert (out[:, 4:] == 17).all(), fmt  # opaque: its own colour


# ---------------------------------------------------------------- 8: audio formats and bit depth


def test_audio_parts_are_named_by_detected_format(tmp_path):
    manifest = audio_manifest(
        tmp_path / "raw",
        {
            "noext": wav("PCM_16"),
            "liar.flac": wav("PCM_16"),
            "real.flac": wav("PCM_16", fmt="FLAC"),
        },
    )
    convert(
        "audio-manifest",
        tmp_path / "keep",
        reader={"manifest": manifest},
        audio=AudioOptions("keep"),
    )
    keep = members(tmp_path / "keep")
    assert sorted(k for k in keep if "audio" in k) == [
        "train/liar.audio.wav",
        "train/noext.audio.wav",
        "train/real.audio.flac",
    ]
    assert keep["train/liar.audio.wav"] == (tmp_path / "raw" / "liar.flac").read_bytes()
    convert("audio-manifest", tmp_path / "flac", reader={"manifest": manifest})
    flac = members(tmp_path / "flac")
    assert sorted(k for k in flac if "audio" in k) == [
        "train/liar.audio.flac",
        "train/noext.audio.flac",
        "train/real.audio.flac",
    ]
    # re-encoded, not WAV bytes under a FLAC name
    assert flac["train/liar.audio.flac"][:4] == b"fLaC"
    assert (
        flac["train/real.audio.flac"]
        == keep["train/real.audio.flac"]
        == (tmp_path / "raw" / "real.flac").read_bytes()
    )


def test_24_bit_and_float_wav_keep_their_depth(tmp_path):
    import soundfile

    manifest = audio_manifest(
        tmp_path / "raw",
        {"deep.wav": wav("PCM_24"), "float.wav": wav("FLOAT"), "plain.wav": wav("PCM_16")},
    )
    convert("audio-manifest", tmp_path / "out", reader={"manifest": manifest})
    m = members(tmp_path / "out")
    assert sorted(k for k in m if "audio" in k) == [
        "train/deep.audio.flac",
        "train/float.audio.wav",
        "train/plain.audio.flac",
    ]
    assert soundfile.info(io.BytesIO(m["train/deep.audio.flac"])).subtype == "PCM_24"
    deep, _ = soundfile.read(io.BytesIO(m["train/deep.audio.flac"]), dtype="int32")
    src, _ = soundfile.read(tmp_path / "raw" / "deep.wav", dtype="int32")
    assert np.array_equal(deep, src)  # lossless, all 24 bits
    assert m["train/float.audio.wav"] == (tmp_path / "raw" / "float.wav").read_bytes()
    assert soundfile.info(io.BytesIO(m["train/plain.audio.flac"])).subtype == "PCM_16"
    meta = {
        k: json.loads(v)["source"]["sample_format"] for k, v in m.items() if k.endswith("text.json")
    }
    assert meta == {
        "train/deep.text.json": "s24",
        "train/float.text.json": "f32",
        "train/plain.text.json": "s16",
    }
