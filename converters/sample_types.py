"""Energon sample types for the shards the converters write.

Image-text shards use Energon's own ``CaptioningSample`` (``image``: float32 (C, H, W) in [0, 1]
after Energon's decoder, ``caption``: str). Energon has no audio-text type, so this module defines
one; ``.nv-meta/dataset.yaml`` of an audio dataset names it by module and class, which is why it
lives in an importable package rather than in the dataset folder.
"""

from __future__ import annotations

from typing import Any

from megatron.energon import Sample
from megatron.energon.edataclass import edataclass


@edataclass
class AudioTextSample(Sample):
    """One utterance and its transcript.

    ``audio`` is what Energon's decoder returns for an audio part: by default an
    ``megatron.energon.av.AVDecoder`` (call ``get_audio()`` for an ``AVData`` whose
    ``audio_clips[0]`` is a tensor ``(channels, samples)`` at the file's own sample rate, no
    resampling; its dtype is the file's sample format: int16 for 16-bit FLAC, int32 for 24-bit FLAC,
    float32 for float WAV). ``text`` is the transcript. ``meta`` is the whole
    ``text.json`` (provenance: source id, file name, duration, sample rate).
    """

    audio: Any
    text: str
    meta: dict


@edataclass
class VideoTextSample(Sample):
    """One video and its caption (``energon-platform convert video``).

    ``video`` is what Energon's decoder returns for a ``video.mp4``/``.webm``/``.mkv`` part: by
    default an ``megatron.energon.av.AVDecoder``, which decodes only what is asked for
    (``get_video_clips(ranges)`` seeks to the keyframe before each range; frames come out as uint8
    ``(T, 3, H, W)``; ``get_audio_clips`` for the audio track). ``text`` is the caption (the first
    one; ``meta["captions"]`` has them all). ``meta`` is the whole ``text.json``; its ``source``
    has the provenance the converter measured: ``frames``, ``fps``, ``duration``, ``width``,
    ``height``, ``codec``, ``audio`` (bool), ``container``.
    """

    video: Any
    text: str
    meta: dict


@edataclass
class ConversationSample(Sample):
    """One instruction conversation (``energon-platform convert llava``).

    ``images``: the sample's images in placeholder order, each what Energon's decoder gives for an
    image part (float32 (C, H, W) in [0, 1]); empty for a text-only conversation.
    ``conversation``: the turns as written in the source, ``[{"from": "human" | "gpt" | "system",
    "value": str}, ...]``, with ``<image>`` placeholders in the text. ``meta``: the whole
    ``conversation.json`` (provenance: source id, image file names and sizes).
    """

    images: list
    conversation: list
    meta: dict


@edataclass
class PointCloudTextSample(Sample):
    """One mesh or point cloud and its caption (``energon-platform convert 3d``).

    ``geometry``: what Energon's decoder gives for the ``pointcloud.<ext>`` part: the file's bytes
    for ``obj``/``ply``/``off``/``stl``/``glb``, a numpy array ``(N, 3|6)`` for ``npy`` (read either
    with `converters.mesh3d.load`). ``text``: the caption (the first one;
    ``meta["captions"]`` has them all). ``meta``: the whole ``text.json``; its ``source`` has what
    the converter measured: ``format``, ``kind`` (``mesh``/``points``), ``vertices``, ``faces``,
    ``colors`` (bool), ``bounds`` and, for meshes, ``area``.
    """

    geometry: Any
    text: str
    meta: dict
