"""Media validation and encoding for the writer: bytes in, (extension, bytes, provenance) out.

Failures raise :class:`MediaError` with a reason from ``records.REASONS``; nothing else escapes for
bad input. Encoding is deterministic: fixed encoder settings, no timestamps, no metadata copied.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

#: PNG zlib level: PIL's default. Changing it changes every output byte.
PNG_COMPRESS_LEVEL = 6
#: ``--image-format keep`` stores these formats as they are; anything else is re-encoded as PNG.
KEEP_IMAGE_FORMATS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}


class MediaError(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class ImageOptions:
    image_format: str = "png"  #: "png" (lossless re-encode, RGB, EXIF applied) or "keep"
    max_side: int | None = None  #: downscale so that max(width, height) <= max_side
    max_pixels: int = 89_478_485  #: larger images are rejected as decompression bombs (PIL default)


def _open_image(data: bytes, max_pixels: int) -> Image.Image:
    if not data:
        raise MediaError("empty_file", "zero bytes")
    pil_limit = Image.MAX_IMAGE_PIXELS
    try:
        # Image.open reads only the header; PIL's own limit is lifted so that ``max_pixels`` (checked
        # before any pixel is decoded) decides, above or below PIL's default alike
        Image.MAX_IMAGE_PIXELS = None
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > max_pixels:
            raise MediaError("decompression_bomb", f"{img.width}x{img.height} > {max_pixels} pixels")
        img.load()
    except UnidentifiedImageError as e:
        raise MediaError("not_an_image", "not a recognised image format") from e
    except MediaError:
        raise
    except Exception as e:  # truncated files raise OSError, broken headers SyntaxError/ValueError
        raise MediaError("undecodable_image", f"{type(e).__name__}: {e}") from e
    finally:
        Image.MAX_IMAGE_PIXELS = pil_limit
    return img


def _png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


def _resized(img: Image.Image, max_side: int | None) -> Image.Image:
    if max_side and max(img.size) > max_side:
        scale = max_side / max(img.size)
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        return img.resize(size, Image.Resampling.LANCZOS)
    return img


def encode_image(data: bytes, opts: ImageOptions) -> tuple[str, bytes, dict]:
    """Validate and encode one image. Returns ``(extension, bytes, provenance)``.

    ``png``: decoded, EXIF orientation applied, converted to RGB, optionally downscaled, written as
    PNG. ``keep``: the original bytes when the format is one Energon decodes (JPEG/PNG/WebP) and
    no downscale is needed; otherwise as ``png``. Provenance has the stored ``width``/``height``
    and the original ``format``.
    """
    img = _open_image(data, opts.max_pixels)
    original = img.format or "unknown"
    if opts.image_format == "keep" and original in KEEP_IMAGE_FORMATS and not (
        opts.max_side and max(img.size) > opts.max_side
    ):
        return KEEP_IMAGE_FORMATS[original], data, {"width": img.width, "height": img.height, "format": original}
    try:
        out = _resized(ImageOps.exif_transpose(img).convert("RGB"), opts.max_side)
    except Exception as e:
        raise MediaError("undecodable_image", f"{type(e).__name__}: {e}") from e
    return "png", _png_bytes(out), {"width": out.width, "height": out.height, "format": original}


@dataclass(frozen=True)
class AudioOptions:
    audio_format: str = "flac"  #: "flac" (FLAC sources kept, others re-encoded) or "keep"


def _decode_audio(data: bytes):
    import av

    if not data:
        raise MediaError("empty_file", "zero bytes")
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise MediaError("undecodable_audio", "no audio stream")
            stream = container.streams.audio[0]
            frames = list(container.decode(stream))
    except MediaError:
        raise
    except Exception as e:
        raise MediaError("undecodable_audio", f"{type(e).__name__}: {e}") from e
    n = sum(f.samples for f in frames)
    if not frames or n == 0:
        raise MediaError("undecodable_audio", "no audio samples")
    return frames, stream.codec_context.name, frames[0].sample_rate, n


def _flac_bytes(frames) -> bytes:
    import av

    rate, layout = frames[0].sample_rate, frames[0].layout.name
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="flac") as out:
        out.metadata.clear()
        stream = out.add_stream("flac", rate=rate, layout=layout)
        stream.codec_context.format = "s16"
        resampler = av.AudioResampler(format="s16", layout=layout, rate=rate)
        for frame in frames:
            frame.pts = None
            for f in resampler.resample(frame):
                for packet in stream.encode(f):
                    out.mux(packet)
        for f in resampler.resample(None):
            for packet in stream.encode(f):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def encode_audio(data: bytes, source_ext: str, opts: AudioOptions) -> tuple[str, bytes, dict]:
    """Validate (full decode) and encode one audio file. Returns ``(extension, bytes, provenance)``.

    Provenance: ``sample_rate``, ``duration`` (seconds, from the decoded sample count), ``channels``,
    original ``codec``.
    """
    frames, codec, rate, n = _decode_audio(data)
    info = {"sample_rate": rate, "duration": round(n / rate, 6), "channels": frames[0].layout.nb_channels,
            "codec": codec}
    ext = source_ext.lower().lstrip(".")
    if opts.audio_format == "keep" or ext == "flac":
        return ext, data, info
    try:
        return "flac", _flac_bytes(frames), info
    except Exception as e:
        raise MediaError("undecodable_audio", f"cannot re-encode: {type(e).__name__}: {e}") from e
