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
    resampling; its dtype is the file's sample format, e.g. int16 for 16-bit FLAC). ``text`` is the transcript. ``meta`` is the whole
    ``text.json`` (provenance: source id, file name, duration, sample rate).
    """

    audio: Any
    text: str
    meta: dict
