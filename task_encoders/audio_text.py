"""Utterance + transcript → log-mel features + transcript tokens (``encoder: audio_text``).

Input: `converters.sample_types.AudioTextSample` (``audio``: Energon ``AVDecoder``, ``text``).
Per sample: decode (Energon's ``AVDecoder``, the file's own rate) → mono float → resample to ``audio.sample_rate`` →
log-mel → SpecAugment masks drawn from the sample's generator (training only) →
`AudioTextBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.energon import edataclass

from task_encoders.audio_features import (
    AudioConfig,
    LogMel,
    audio_header,
    decode_audio,
    spec_augment,
    to_float_mono,
)
from task_encoders.batch_fields import AudioFields
from task_encoders.batch_tensors import Medium
from task_encoders.config import EncoderConfig
from task_encoders.documents import DocumentTaskEncoder, EncodedDoc, TextBatch
from task_encoders.features import features
from task_encoders.image_path import ImageBytesDecoder
from task_encoders.registry import register
from task_encoders.sequences import pad_stack


@dataclass(frozen=True)
class AudioTextConfig(EncoderConfig):
    """Top level of an ``audio_text`` config: the shared sections plus ``audio``."""

    encoder: str = "audio_text"
    """The registered name of the encoder: ``audio_text``."""
    audio: AudioConfig = field(default_factory=AudioConfig)
    """Resampling, log-mel analysis and SpecAugment (the ``audio`` keys below)."""


@edataclass
class AudioTextBatch(TextBatch):
    """`task_encoders.documents.TextBatch` plus ``features``: float32 ``(D, n_mels, T)``
    log-mel, zero-padded along time to the longest utterance, and ``feature_lengths``: int64 ``(D,)``
    valid frames per utterance (``D == N`` without packing)."""

    media = (Medium("features", lengths="feature_lengths", axis=-1),)

    features: torch.Tensor
    feature_lengths: torch.Tensor


@register("audio_text")
class AudioTextTaskEncoder(DocumentTaskEncoder):
    """``AudioTextTaskEncoder(config=None, *, seed=None, training=True)``; ``training=False`` skips
    SpecAugment."""

    config_class = AudioTextConfig
    config: AudioTextConfig
    #: images, which this encoder never reads, stay undecoded bytes
    decoder = ImageBytesDecoder()
    batch_type = AudioTextBatch

    def __init__(self, config: Any = None, *, seed: int | None = None, training: bool = True):
        super().__init__(config, seed=seed, training=training)
        self.log_mel = LogMel(self.config.audio)

    # --- lengths without decoding (DocumentTaskEncoder's contract): work adds the log-mel frames ----

    facts_width = 3

    def sample_facts(self, sample: Any) -> tuple[int, ...]:
        """``(transcript tokens, audio samples, sample rate)`` (the audio file's header)."""
        return (*super().sample_facts(sample), *audio_header(sample.audio))

    def sample_length(self, facts: tuple[int, ...], key: str, epoch: int) -> tuple[int, int]:
        row, _ = super().sample_length(facts[:1], key, epoch)
        return row, row + self.log_mel.num_frames(facts[1], facts[2])

    def encoded_length(self, doc: EncodedDoc) -> tuple[int, int]:
        row, _ = super().encoded_length(doc)
        return row, row + int(doc.media["features"].shape[-1])

    # --- cost features: the work outside the row is the log-mel frames ---------------------------

    work_feature = "audio_frames"

    def batch_media_features(self, batch: AudioFields) -> dict[str, float]:
        return features(audio_frames=int(batch.feature_lengths.sum()))

    def encode_media(self, sample: Any) -> dict[str, torch.Tensor]:
        clip, rate = decode_audio(sample.audio)
        features = self.log_mel(to_float_mono(clip), rate)
        augment = self.config.audio.spec_augment
        if self.training and augment.enabled:
            features = spec_augment(
                features, augment, self.sample_generator(sample, "spec_augment")
            )
        return {"features": features}

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        features, lengths = pad_stack([d.media["features"] for d in docs])
        return {"features": features, "feature_lengths": lengths}
