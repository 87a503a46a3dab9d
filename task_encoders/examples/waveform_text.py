"""Example modality: raw waveforms + transcripts (``encoder: waveform_text``), for models that
read audio samples directly (wav2vec-style) instead of mel features.

Input: `converters.sample_types.AudioTextSample`. Per sample: decode, mono, resample to
``waveform.sample_rate``, cut to ``waveform.max_seconds``; in training, a random gain in
``waveform.gain_db`` drawn from the sample's own generator (so the same key in the same epoch
always gets the same gain, whatever the worker layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torchaudio
from megatron.energon import edataclass

from task_encoders.audio_features import audio_header, decode_audio, resampled_length, to_float_mono
from task_encoders.batch_tensors import Medium
from task_encoders.config import EncoderConfig
from task_encoders.config_parser import At, require
from task_encoders.documents import DocumentTaskEncoder, EncodedDoc, TextBatch
from task_encoders.features import features
from task_encoders.registry import register
from task_encoders.sequences import pad_stack


@dataclass(frozen=True)
class WaveformConfig:
    """``waveform:`` section of the config file."""

    sample_rate: int = 16000
    max_seconds: float = 10.0
    gain_db: tuple[float, float] = (-6.0, 6.0)

    def check(self, at: At) -> None:
        require(
            1000 <= self.sample_rate <= 192_000,
            at.child("sample_rate"),
            f"got {self.sample_rate}",
            "an integer from 1000 to 192000 (Hz)",
        )
        require(
            0 < self.max_seconds <= 3600,
            at.child("max_seconds"),
            f"got {self.max_seconds}",
            "seconds in (0, 3600]",
        )
        low, high = self.gain_db
        require(
            -60 <= low <= high <= 60,
            at.child("gain_db"),
            f"got {list(self.gain_db)}",
            "[low, high] dB within [-60, 60]",
        )


@dataclass(frozen=True)
class WaveformTextConfig(EncoderConfig):
    encoder: str = "waveform_text"
    waveform: WaveformConfig = field(default_factory=WaveformConfig)


@edataclass
class WaveformTextBatch(TextBatch):
    """`task_encoders.documents.TextBatch` plus ``waveforms``: float32 ``(D, T)`` zero-padded
    to the longest utterance, and ``waveform_lengths``: int64 ``(D,)`` valid samples per
    utterance."""

    media = (Medium("waveforms", lengths="waveform_lengths", axis=-1),)

    waveforms: torch.Tensor
    waveform_lengths: torch.Tensor


@register("waveform_text")
class WaveformTextTaskEncoder(DocumentTaskEncoder):
    """``WaveformTextTaskEncoder(config=None, *, seed=None, training=True)``; no gain when not
    training."""

    config_class = WaveformTextConfig
    config: WaveformTextConfig
    batch_type = WaveformTextBatch

    def encode_media(self, sample: Any) -> dict[str, torch.Tensor]:
        cfg = self.config.waveform
        clip, rate = decode_audio(sample.audio)
        wave = to_float_mono(clip)
        if rate != cfg.sample_rate:
            wave = torchaudio.functional.resample(wave, rate, cfg.sample_rate)
        wave = wave[: int(cfg.max_seconds * cfg.sample_rate)]
        if self.training:
            low, high = cfg.gain_db
            u = torch.rand((), generator=self.sample_generator(sample, "gain")).item()
            wave = wave * 10 ** ((low + (high - low) * u) / 20)
        return {"waveform": wave}

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        waves, lengths = pad_stack([d.media["waveform"] for d in docs])
        return {"waveforms": waves, "waveform_lengths": lengths}

    # --- lengths and cost without decoding: the work outside the row is the waveform's samples ---

    facts_width = 3
    work_feature = "audio_frames"

    def sample_facts(self, sample: Any) -> tuple[int, ...]:
        """``(transcript tokens, audio samples, sample rate)`` (the audio file's header)."""
        return (*super().sample_facts(sample), *audio_header(sample.audio))

    def sample_length(self, facts: tuple[int, ...], key: str, epoch: int) -> tuple[int, int]:
        cfg = self.config.waveform
        row, _ = super().sample_length(facts[:1], key, epoch)
        samples = resampled_length(facts[1], facts[2], cfg.sample_rate)
        return row, row + min(samples, int(cfg.max_seconds * cfg.sample_rate))

    def encoded_length(self, doc: EncodedDoc) -> tuple[int, int]:
        row, _ = super().encoded_length(doc)
        return row, row + int(doc.media["waveform"].numel())

    def batch_media_features(self, batch: WaveformTextBatch) -> dict[str, float]:
        return features(audio_frames=int(batch.waveform_lengths.sum()))
