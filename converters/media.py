"""Media validation and encoding for the writer: bytes in, (extension, bytes, provenance) out.

Failures raise `MediaError` with a reason from ``records.REASONS``; nothing else escapes for
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
            raise MediaError(
                "decompression_bomb", f"{img.width}x{img.height} > {max_pixels} pixels"
            )
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


def _high_depth(img: Image.Image) -> bool:
    return img.mode.startswith("I") or img.mode == "F"


def to_8bit(img: Image.Image) -> Image.Image:
    """High bit depth single-channel modes scaled (not clipped) to 8-bit ``L``; others unchanged.

    ``I;16*`` (16-bit PNG/TIFF): ``v * 255 / 65535``. ``I`` (32-bit integers; 16-bit PNGs in some
    Pillow versions): by the range of its source, 16 bits when the values fit, else 32 bits.
    ``F`` (float): values in [0, 1] times 255, anything else scaled from its own min..max.
    """
    import numpy as np

    if not _high_depth(img):
        return img
    a = np.asarray(img, dtype=np.float64)
    if img.mode == "F":
        lo, hi = (
            (0.0, 1.0)
            if a.size and a.min() >= 0 and a.max() <= 1
            else (float(a.min()), float(a.max()))
        )
    elif img.mode.startswith("I;16"):
        lo, hi = 0.0, 65535.0
    else:
        lo, hi = (
            (0.0, 65535.0)
            if a.size and a.min() >= 0 and a.max() <= 65535
            else (-(2.0**31), 2.0**31 - 1)
        )
    scaled = np.rint((a - lo) * (255.0 / (hi - lo))) if hi > lo else np.zeros_like(a)
    return Image.fromarray(np.clip(scaled, 0, 255).astype(np.uint8), "L")


def _png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


def has_alpha(img: Image.Image) -> bool:
    """Whether ``img`` has transparency: an alpha channel, or a palette or mode with a
    transparent colour."""
    return img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info


def on_white(img: Image.Image) -> Image.Image:
    """``img`` as RGB, its transparent pixels drawn over white as a viewer shows them (a plain
    conversion drops the alpha and shows the colour stored under it: a fully transparent PNG
    often hides black or noise there)."""
    if not has_alpha(img):
        return img.convert("RGB")
    rgba = img.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def _resized(img: Image.Image, max_side: int | None) -> Image.Image:
    if max_side and max(img.size) > max_side:
        scale = max_side / max(img.size)
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        return img.resize(size, Image.Resampling.LANCZOS)
    return img


def encode_image(data: bytes, opts: ImageOptions) -> tuple[str, bytes, dict]:
    """Validate and encode one image. Returns ``(extension, bytes, provenance)``.

    ``png``: decoded, EXIF orientation applied, high bit depth scaled to 8 bits (`to_8bit`),
    converted to RGB (transparent pixels drawn over white, `on_white`), optionally downscaled,
    written as PNG. ``keep``: the original bytes when the format is one Energon decodes
    (JPEG/PNG/WebP), the depth is 8 bits (a loader would clip more), the image is opaque (a
    loader would drop the alpha and show the colour under it) and no downscale is needed;
    otherwise as ``png``. Provenance has the stored ``width``/``height``
    and the original ``format``.
    """
    img = _open_image(data, opts.max_pixels)
    original = img.format or "unknown"
    if (
        opts.image_format == "keep"
        and original in KEEP_IMAGE_FORMATS
        and not _high_depth(img)
        and not has_alpha(img)
        and not (opts.max_side and max(img.size) > opts.max_side)
    ):
        return (
            KEEP_IMAGE_FORMATS[original],
            data,
            {"width": img.width, "height": img.height, "format": original},
        )
    try:
        out = _resized(on_white(to_8bit(ImageOps.exif_transpose(img))), opts.max_side)
    except Exception as e:
        raise MediaError("undecodable_image", f"{type(e).__name__}: {e}") from e
    return "png", _png_bytes(out), {"width": out.width, "height": out.height, "format": original}


@dataclass(frozen=True)
class AudioOptions:
    audio_format: str = "flac"  #: "flac" (FLAC sources kept, others re-encoded) or "keep"


#: Containers Energon's AV decoder reads by part extension; ``keep`` stores these as they are.
KEEP_AUDIO_FORMATS = {"flac": "flac", "wav": "wav", "mp3": "mp3"}
#: How each decoded sample format is stored: FLAC holds integers of up to 24 bits losslessly
#: (``s16``/``s24``); 32-bit integer and float PCM cannot go into FLAC and are stored as WAV.
_WAV_CODECS = {"s32": "pcm_s32le", "f32": "pcm_f32le", "f64": "pcm_f64le"}


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
            fmt_name = container.format.name
    except MediaError:
        raise
    except Exception as e:
        raise MediaError("undecodable_audio", f"{type(e).__name__}: {e}") from e
    n = sum(f.samples for f in frames)
    if not frames or n == 0:
        raise MediaError("undecodable_audio", "no audio samples")
    return frames, fmt_name, stream.codec_context.name, n


def _sample_format(codec: str, decoded: str) -> str:
    """The source's sample format: ``u8``, ``s16``, ``s24`` (≤ 24-bit integers decoded as s32),
    ``s32``, ``f32``, ``f64``; lossy codecs (decoded as float) count as ``s16``."""
    base = decoded.rstrip("p")
    if base in ("u8", "s16"):
        return base
    if base == "s32":
        return "s32" if codec.startswith("pcm_s32") or codec.startswith("pcm_u32") else "s24"
    if not codec.startswith("pcm_"):
        return "s16"  # mp3, aac, vorbis, opus: float decoding of a lossy stream
    return "f64" if base == "dbl" else "f32"


def _encode(frames, container: str, codec: str, sample_fmt: str) -> bytes:
    """Re-encode decoded frames (no metadata, fixed settings: deterministic bytes)."""
    import av

    rate, layout = frames[0].sample_rate, frames[0].layout.name
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        out.metadata.clear()
        stream = out.add_stream(codec, rate=rate, layout=layout)
        stream.codec_context.format = sample_fmt
        resampler = av.AudioResampler(format=sample_fmt, layout=layout, rate=rate)
        for frame in [*frames, None]:
            if frame is not None:
                frame.pts = None
            for f in resampler.resample(frame):
                for packet in stream.encode(f):
                    out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def encode_audio(data: bytes, opts: AudioOptions) -> tuple[str, bytes, dict]:
    """Validate (full decode) and encode one audio file. Returns ``(extension, bytes, provenance)``.

    The container is detected from the bytes, never from the file name. ``flac``: FLAC sources are
    kept as they are; others become FLAC at their own bit depth (16 or 24 bits), except 32-bit
    integer and float PCM, which FLAC cannot hold: kept as they are when WAV, else re-encoded as
    WAV with the same sample format. ``keep``: the original bytes when the container is one
    Energon decodes (FLAC/WAV/MP3), else as ``flac``. The extension always names the stored
    container. Provenance: ``sample_rate``, ``duration`` (seconds, from the decoded sample
    count), ``channels``, original ``codec`` and stored ``sample_format`` (``s16``, ``s24``, ...).
    """
    frames, container, codec, n = _decode_audio(data)
    rate = frames[0].sample_rate
    source_fmt = _sample_format(codec, frames[0].format.name)
    info = {
        "sample_rate": rate,
        "duration": round(n / rate, 6),
        "channels": frames[0].layout.nb_channels,
        "codec": codec,
        "sample_format": source_fmt,
    }
    wav_codec = _WAV_CODECS.get(source_fmt)
    if container in KEEP_AUDIO_FORMATS and (
        opts.audio_format == "keep" or container == "flac" or (container == "wav" and wav_codec)
    ):
        return KEEP_AUDIO_FORMATS[container], data, info
    try:
        if wav_codec:
            return "wav", _encode(frames, "wav", wav_codec, frames[0].format.name.rstrip("p")), info
        flac_fmt = "s32" if source_fmt == "s24" else "s16"
        return (
            "flac",
            _encode(frames, "flac", "flac", flac_fmt),
            {**info, "sample_format": "s24" if flac_fmt == "s32" else "s16"},
        )
    except Exception as e:
        raise MediaError("undecodable_audio", f"cannot re-encode: {type(e).__name__}: {e}") from e


# --- video ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoOptions:
    """``convert video``: the original bytes are kept unless one of these asks for a re-encode."""

    max_side: int | None = None  #: re-encode (scaled down) when max(width, height) exceeds this
    max_seconds: float | None = (
        None  #: re-encode, cut to this many seconds, when the video is longer
    )


#: Demuxer names (PyAV ``container.format.name``) whose files are kept as they are.
KEEP_VIDEO_FORMATS = {"mov,mp4,m4a,3gp,3g2,mj2": "mp4", "matroska,webm": "mkv"}
#: Video containers that are read but stored re-encoded as MP4 (Energon names parts by extension).
OTHER_VIDEO_FORMATS = {"avi", "flv", "mpegts", "mpeg", "ogg", "asf", "m4v", "h264", "hevc", "mjpeg"}
#: Byte signatures of video containers: a file that has one but cannot be read is truncated/corrupt.
_VIDEO_MAGIC = ((4, b"ftyp"), (0, b"\x1a\x45\xdf\xa3"), (8, b"AVI "), (0, b"FLV"))
#: Re-encoding (``--max-side``/``--max-seconds``, or a container that is not kept): fixed settings,
#: one thread and no metadata, so the bytes are a pure function of the decoded frames (x264's
#: macroblock tree is off: with it, small videos came out different from run to run); a keyframe
#: every 2 seconds, so that a clip decodes at most 2 s of frames before its start.
REENCODE_VIDEO = {
    "codec": "libx264",
    "options": {"preset": "medium", "crf": "23", "threads": "1", "x264-params": "mbtree=0"},
    "gop_seconds": 2,
}
REENCODE_AUDIO_BITRATE = 64_000
_BITEXACT = {"fflags": "+bitexact"}


def _has_video_magic(data: bytes) -> bool:
    return any(data[at : at + len(magic)] == magic for at, magic in _VIDEO_MAGIC)


def _video_streams(container) -> list:
    """Real video streams (cover art of an audio file is a video stream with ``attached_pic``)."""
    import av

    attached = int(av.stream.Disposition.attached_pic)
    return [s for s in container.streams.video if not int(s.disposition) & attached]


@dataclass
class _VideoProbe:
    container: str  #: demuxer name
    codec: str
    frames: int
    width: int
    height: int
    fps: float
    rate: object  #: ``Fraction`` frame rate (re-encoding keeps it)
    duration: float  #: seconds, decoded (first frame start to last frame end)
    audio: dict | None  #: codec, sample_rate, channels of the first audio stream, or None


def _probe_video(data: bytes) -> _VideoProbe:
    """Open and fully decode the first video stream (and the first audio stream): the decode check.

    Reasons: ``empty_file``; ``not_a_video`` (not a media file, or an image); ``no_video_stream``
    (a media file without video, e.g. audio only); ``truncated_video`` (a video container that cannot
    be opened, or that decodes to fewer frames / less time than its header declares);
    ``undecodable_video`` (no decoder for the codec, or decoding fails)."""
    import av

    if not data:
        raise MediaError("empty_file", "zero bytes")
    try:
        container = av.open(io.BytesIO(data))
    except Exception as e:
        if _has_video_magic(data):
            raise MediaError(
                "truncated_video",
                f"a video container that cannot be read (truncated or corrupt): "
                f"{type(e).__name__}: {e}",
            ) from e
        raise MediaError(
            "not_a_video", f"not a recognised media format ({type(e).__name__})"
        ) from e
    with container:
        fmt = container.format.name
        streams = _video_streams(container)
        if fmt not in KEEP_VIDEO_FORMATS and fmt not in OTHER_VIDEO_FORMATS:
            if streams and not container.streams.audio:  # png_pipe, gif, image2, ...: a picture
                raise MediaError("not_a_video", f"{fmt}: an image format, not a video")
        # e.g. MP4 without its moov index
        if not streams and not container.streams and _has_video_magic(data):
            raise MediaError(
                "truncated_video", f"{fmt}: a video container with no readable stream (truncated)"
            )
        if not streams:
            raise MediaError(
                "no_video_stream",
                f"{fmt}: no video stream" + (" (audio only)" if container.streams.audio else ""),
            )
        stream = streams[0]
        if stream.codec_context is None:
            raise MediaError("undecodable_video", f"{fmt}: no decoder for the video codec")
        codec, declared = stream.codec_context.name, stream.frames
        n, first, end = 0, None, 0.0
        try:
            for frame in container.decode(stream):
                start = (
                    float(frame.pts * frame.time_base)
                    if frame.pts is not None
                    else n / float(stream.average_rate or 25)
                )
                first = start if first is None else first
                step = (
                    float(frame.duration * frame.time_base)
                    if frame.duration
                    else 1 / float(stream.average_rate or 25)
                )
                end = max(end, start + step)
                width, height = frame.width, frame.height
                n += 1
        except Exception as e:
            if n:
                raise MediaError(
                    "truncated_video",
                    f"{codec}: decoding stopped after {n} frames: {type(e).__name__}: {e}",
                ) from e
            raise MediaError("undecodable_video", f"{codec}: {type(e).__name__}: {e}") from e
        if not n:
            raise MediaError("undecodable_video", f"{codec}: no frame decoded")
        duration = end - first
        rate = stream.average_rate or stream.guessed_rate
        declared_s = container.duration / 1e6 if container.duration else None
        if declared and n < declared:
            raise MediaError("truncated_video", f"{codec}: {n} frames decoded, {declared} declared")
        if declared_s and duration < declared_s - max(0.1, 2 / float(rate or 25)):
            raise MediaError(
                "truncated_video", f"{codec}: {duration:.3f} s decoded, {declared_s:.3f} s declared"
            )
        audio = None
        if container.streams.audio:
            a = container.streams.audio[0]
            audio = {
                "codec": a.codec_context.name if a.codec_context else "unknown",
                "sample_rate": a.sample_rate,
                "channels": a.channels,
            }
    if audio is not None:
        _check_audio_track(data)
    return _VideoProbe(
        fmt,
        codec,
        n,
        width,
        height,
        round(float(rate), 6) if rate else round(n / duration, 6),
        rate,
        round(duration, 6),
        audio,
    )


def _check_audio_track(data: bytes) -> None:
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            for _ in container.decode(audio=0):
                pass
    except Exception as e:
        raise MediaError("undecodable_video", f"audio track: {type(e).__name__}: {e}") from e


def _even(x: float) -> int:
    return max(2, int(round(x / 2)) * 2)


def _reencode_video(
    data: bytes, probe: _VideoProbe, opts: VideoOptions
) -> tuple[bytes, _VideoProbe]:
    """MP4 (H.264 yuv420p, AAC audio) of the first ``max_seconds``, scaled to fit ``max_side``.
    Both streams are declared before anything is muxed (the header is written with the first packet)."""
    from fractions import Fraction

    import av

    scale = min(1.0, opts.max_side / max(probe.width, probe.height)) if opts.max_side else 1.0
    width, height = _even(probe.width * scale), _even(probe.height * scale)
    rate = Fraction(probe.rate).limit_denominator(1001 * 120) if probe.rate else Fraction(25)
    max_frames = int(opts.max_seconds * rate + 1e-9) if opts.max_seconds else None
    buf = io.BytesIO()
    with (
        av.open(io.BytesIO(data)) as src,
        av.open(buf, "w", format="mp4", options=_BITEXACT) as out,
    ):
        out.metadata.clear()
        vs = out.add_stream(REENCODE_VIDEO["codec"], rate=rate)
        vs.width, vs.height, vs.pix_fmt = width, height, "yuv420p"
        vs.options = dict(REENCODE_VIDEO["options"])
        vs.codec_context.thread_count = 1
        vs.codec_context.gop_size = max(1, round(REENCODE_VIDEO["gop_seconds"] * float(rate)))
        sa = src.streams.audio[0] if probe.audio is not None else None
        if sa is not None:
            layout = "stereo" if sa.channels >= 2 else "mono"
            aus = out.add_stream("aac", rate=sa.sample_rate, layout=layout)
            aus.bit_rate = REENCODE_AUDIO_BITRATE
        n = 0
        for frame in src.decode(_video_streams(src)[0]):
            if max_frames is not None and n >= max_frames:
                break
            f = frame.reformat(width=width, height=height, format="yuv420p", interpolation="AREA")
            f.pts, f.time_base = n, 1 / rate
            for packet in vs.encode(f):
                out.mux(packet)
            n += 1
        for packet in vs.encode(None):
            out.mux(packet)
        if sa is not None:
            src.seek(0)
            _reencode_audio_track(src, aus, out, layout, opts.max_seconds)
    duration = float(n / rate)
    return buf.getvalue(), _VideoProbe(
        "mov,mp4,m4a,3gp,3g2,mj2",
        "h264",
        n,
        width,
        height,
        round(float(rate), 6),
        rate,
        round(duration, 6),
        probe.audio and {**probe.audio, "codec": "aac"},
    )


def _reencode_audio_track(src, stream, out, layout: str, seconds: float | None) -> None:
    """The first audio stream of ``src`` (cut at ``seconds``) encoded into ``stream`` of ``out``."""
    from fractions import Fraction

    import av
    import numpy as np

    rate = stream.codec_context.sample_rate
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
    limit = int(seconds * rate) if seconds else None
    written = 0
    for frame in [*src.decode(audio=0), None]:
        if frame is not None:
            frame.pts = None
        for f in resampler.resample(frame):
            if limit is not None and written + f.samples > limit:
                if written >= limit:
                    continue
                f_cut = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(f.to_ndarray()[:, : limit - written]),
                    format="fltp",
                    layout=layout,
                )
                f_cut.sample_rate, f = rate, f_cut
            f.pts, f.time_base = written, Fraction(1, rate)
            written += f.samples
            for packet in stream.encode(f):
                out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)


def _video_info(p: _VideoProbe, reencoded: bool) -> dict:
    info = {
        "container": p.container,
        "codec": p.codec,
        "width": p.width,
        "height": p.height,
        "fps": p.fps,
        "frames": p.frames,
        "duration": p.duration,
        "audio": p.audio is not None,
        "reencoded": reencoded,
    }
    if p.audio is not None:
        info.update(
            audio_codec=p.audio["codec"],
            audio_sample_rate=p.audio["sample_rate"],
            audio_channels=p.audio["channels"],
        )
    return info


def encode_video(data: bytes, opts: VideoOptions) -> tuple[str, bytes, dict]:
    """Validate (full decode, `_probe_video`) and store one video. Returns ``(extension,
    bytes, provenance)``.

    MP4/MOV and Matroska/WebM are kept as their original bytes (``mp4``, ``webm`` when the EBML
    DocType is ``webm``, else ``mkv``), unless ``max_side``/``max_seconds`` is exceeded; then, and
    for any other container (AVI, FLV, MPEG-TS, ...), the video is re-encoded as MP4 (H.264,
    `REENCODE_VIDEO`; audio as AAC) with fixed settings, one thread and no metadata: the same
    input gives the same bytes on the same kind of CPU (FFmpeg's AAC encoder follows the CPU's
    float instructions, so a re-encoded video with audio may differ in bytes on another).
    Provenance: ``container``, ``codec``, ``width``/``height``, ``fps``,
    ``frames`` and ``duration`` (decoded), ``audio`` (bool) with ``audio_codec``/
    ``audio_sample_rate``/``audio_channels`` when present, ``reencoded``; a video cut to
    ``max_seconds`` also has ``original_duration`` (seconds, decoded) and ``cut_to_seconds``.
    """
    probe = _probe_video(data)
    too_big = bool(opts.max_side and max(probe.width, probe.height) > opts.max_side)
    too_long = bool(opts.max_seconds and probe.duration > opts.max_seconds + 1e-6)
    if probe.container in KEEP_VIDEO_FORMATS and not (too_big or too_long):
        ext = KEEP_VIDEO_FORMATS[probe.container]
        if ext == "mkv" and b"webm" in data[:64]:
            ext = "webm"
        return ext, data, _video_info(probe, False)
    try:
        payload, stored = _reencode_video(data, probe, opts)
    except MediaError:
        raise
    except Exception as e:
        raise MediaError("undecodable_video", f"cannot re-encode: {type(e).__name__}: {e}") from e
    info = _video_info(stored, True)
    if too_long:
        info.update(original_duration=probe.duration, cut_to_seconds=opts.max_seconds)
    return "mp4", payload, info
