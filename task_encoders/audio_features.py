"""Audio → log-mel features, and seeded SpecAugment-style masking.

* `decode_audio`: Energon's ``AVDecoder.get_audio()``; when that fails on a seek (Energon
  seeks to 0 first, and PyAV refuses to seek in a FLAC of a single frame, e.g. 0.25 s at 16 kHz),
  the same stream decoded front to back with PyAV.
* `to_float_mono`: Energon's ``AVDecoder.get_audio()`` clip ``(channels, samples)`` — which
  is an *integer* tensor for 16/24-bit FLAC (int16/int32), float for float sources — → float32
  ``(samples,)`` in [-1, 1], channels averaged.
* `LogMel`: resample (``torchaudio.functional.resample``) to ``audio.sample_rate``, cut to
  ``audio.max_seconds``, ``torchaudio.transforms.MelSpectrogram`` → ``log(mel + 1e-6)``, float32
  ``(n_mels, frames)`` with ``frames = samples // hop_length + 1``. Deterministic.
* `audio_header`: ``(samples, sample rate)`` of an audio file's bytes from its header (no
  samples decoded); `LogMel.num_frames` turns them into the frames `LogMel` makes.
* `spec_augment`: frequency and time masks whose widths and positions come from the caller's
  ``torch.Generator`` (not torchaudio's masking, which draws from the global RNG). Masked cells get
  the utterance's mean feature value.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import av
import av.error
import numpy as np
import torch
import torchaudio

from task_encoders.config_parser import At, require


@dataclass(frozen=True)
class SpecAugmentConfig:
    """``audio.spec_augment``: frequency and time masks on the log-mel, drawn from the sample's
    generator, in training only. Counts and widths are integers from 0 to 10000."""

    enabled: bool = True
    """Whether masks are applied (training only)."""
    freq_masks: int = 2
    """Frequency masks per utterance."""
    freq_width: int = 15
    """The widest frequency mask, in mel bins (at most ``audio.n_mels``)."""
    time_masks: int = 2
    """Time masks per utterance."""
    time_width: int = 40
    """The widest time mask, in frames."""
    max_time_fraction: float = 0.2
    """A time mask never covers more than this share of the utterance's frames."""

    def check(self, at: At) -> None:
        for name in ("freq_masks", "freq_width", "time_masks", "time_width"):
            value = getattr(self, name)
            require(
                0 <= value <= 10_000, at.child(name), f"got {value}", "an integer from 0 to 10000"
            )
        require(
            0.0 <= self.max_time_fraction <= 1.0,
            at.child("max_time_fraction"),
            f"got {self.max_time_fraction}",
            "a number from 0 to 1",
        )


@dataclass(frozen=True)
class AudioConfig:
    """``audio:``: resampling, log-mel analysis and SpecAugment.

    ``hop_length`` <= window length <= ``n_fft``; ``n_mels`` <= ``n_fft // 2 + 1``;
    ``spec_augment.freq_width`` <= ``n_mels``."""

    sample_rate: int = 16000
    """The rate (Hz, 1000 to 192000) every utterance is resampled to before the log-mel."""
    n_fft: int = 400
    """FFT size of the mel analysis, in samples (8 to 65536)."""
    hop_length: int = 160
    """Samples between two log-mel frames."""
    win_length: int | None = None
    """Analysis window length, in samples; null: ``n_fft``."""
    n_mels: int = 80
    """Mel bins per frame."""
    max_seconds: float = 30.0
    """The longest utterance kept, in seconds (at most 3600)."""
    spec_augment: SpecAugmentConfig = field(default_factory=SpecAugmentConfig)
    """Frequency and time masks in training (the ``spec_augment`` keys below)."""

    def check(self, at: At) -> None:
        require(
            1000 <= self.sample_rate <= 192_000,
            at.child("sample_rate"),
            f"got {self.sample_rate}",
            "an integer from 1000 to 192000 (Hz)",
        )
        require(
            8 <= self.n_fft <= 65536,
            at.child("n_fft"),
            f"got {self.n_fft}",
            "an integer from 8 to 65536",
        )
        window = self.win_length or self.n_fft
        require(
            1 <= window <= self.n_fft,
            at.child("win_length"),
            f"got {window}",
            f"an integer from 1 to n_fft={self.n_fft}",
        )
        require(
            1 <= self.hop_length <= window,
            at.child("hop_length"),
            f"got {self.hop_length}",
            f"an integer from 1 to the window length {window}",
        )
        require(
            1 <= self.n_mels <= self.n_fft // 2 + 1,
            at.child("n_mels"),
            f"got {self.n_mels}",
            f"an integer from 1 to n_fft // 2 + 1 = {self.n_fft // 2 + 1}",
        )
        require(
            0.0 < self.max_seconds <= 3600.0,
            at.child("max_seconds"),
            f"got {self.max_seconds}",
            "a number of seconds in (0, 3600]",
        )
        require(
            self.spec_augment.freq_width <= self.n_mels,
            at.child("spec_augment").child("freq_width"),
            f"{self.spec_augment.freq_width} is wider than n_mels={self.n_mels}",
            f"at most {self.n_mels}",
        )


def decode_audio(decoder: Any) -> tuple[torch.Tensor, int]:
    """``(clip (channels, samples) as decoded, sample rate)`` from an Energon ``AVDecoder``."""
    rate = decoder.get_audio_samples_per_second()
    try:
        clips = decoder.get_audio().audio_clips
    except av.error.PermissionError:  # seek refused: decode without seeking
        clips = [_decode_front_to_back(decoder.stream)]
    if not clips or clips[0].numel() == 0:
        raise ValueError("no audio decoded")
    return clips[0], rate


def _decode_front_to_back(stream: BinaryIO) -> torch.Tensor:
    stream.seek(0)
    with av.open(stream, mode="r") as container:
        arrays = []
        for frame in container.decode(audio=0):
            array = frame.to_ndarray()
            if not frame.format.is_planar:  # interleaved (1, samples * channels)
                array = array.reshape(frame.samples, len(frame.layout.channels)).T
            arrays.append(array)
    return torch.from_numpy(np.concatenate(arrays, axis=-1))


def audio_header(audio: Any) -> tuple[int, int]:
    """``(samples per channel, sample rate)`` of an audio part: file bytes (WAV, FLAC, OGG, ... read by
    libsndfile from the header) or an Energon ``AVDecoder`` (its stream's bytes). ``ValueError`` for a
    format libsndfile cannot read."""
    import soundfile

    if hasattr(audio, "stream"):
        audio.stream.seek(0)
        audio = audio.stream.read()
    if not isinstance(audio, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected audio bytes or an AVDecoder, got {type(audio).__name__}")
    try:
        info = soundfile.info(io.BytesIO(bytes(audio)))
    except RuntimeError as e:  # soundfile's LibsndfileError
        raise ValueError(f"cannot read the audio header: {e}") from None
    return int(info.frames), int(info.samplerate)


def resampled_length(num_samples: int, orig_rate: int, new_rate: int) -> int:
    """Samples of ``torchaudio.functional.resample`` of ``num_samples`` samples from ``orig_rate`` to
    ``new_rate``, without it: ``ceil(new * n / orig)`` after dividing both rates by their gcd, in
    float32 as torchaudio computes it (``num_samples`` when the rates are equal)."""
    if orig_rate == new_rate:
        return num_samples
    gcd = math.gcd(int(orig_rate), int(new_rate))
    orig, new = int(orig_rate) // gcd, int(new_rate) // gcd
    return int(torch.ceil(torch.as_tensor(new * num_samples / orig)).long())


def to_float_mono(clip: torch.Tensor) -> torch.Tensor:
    """``(channels, samples)`` of any dtype → float32 ``(samples,)`` in [-1, 1] (channel mean)."""
    if clip.dtype == torch.uint8:
        clip = (clip.to(torch.float32) - 128.0) / 128.0
    elif not clip.is_floating_point():
        clip = clip.to(torch.float32) / float(-torch.iinfo(clip.dtype).min)
    return clip.to(torch.float32).mean(dim=0)


class LogMel:
    """Waveform at any rate → float32 ``(n_mels, frames)`` log-mel (module doc)."""

    def __init__(self, config: AudioConfig):
        self.config = config
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=config.sample_rate,
            n_fft=config.n_fft,
            win_length=config.win_length,
            hop_length=config.hop_length,
            n_mels=config.n_mels,
            power=2.0,
        )

    @property
    def max_samples(self) -> int:
        """Samples kept at ``audio.sample_rate`` (``audio.max_seconds``)."""
        return int(self.config.max_seconds * self.config.sample_rate)

    def num_frames(self, num_samples: int, sample_rate: int) -> int:
        """Frames of ``self(waveform, sample_rate)`` for a waveform of ``num_samples`` samples, without
        it: the resampled length (`resampled_length`), the cut, then the centred STFT's frame
        count."""
        n = min(
            resampled_length(num_samples, sample_rate, self.config.sample_rate), self.max_samples
        )
        n_fft = self.config.n_fft
        return 1 + (n + 2 * (n_fft // 2) - n_fft) // self.config.hop_length

    def __call__(self, waveform: torch.Tensor, sample_rate: int) -> torch.Tensor:
        if waveform.numel() == 0:
            raise ValueError("empty audio")
        if sample_rate != self.config.sample_rate:
            waveform = torchaudio.functional.resample(
                waveform, sample_rate, self.config.sample_rate
            )
        waveform = waveform[: self.max_samples]
        with torch.no_grad():
            return torch.log(self.mel(waveform) + 1e-6).to(torch.float32)


def spec_augment(
    features: torch.Tensor, config: SpecAugmentConfig, generator: torch.Generator
) -> torch.Tensor:
    """A masked copy of ``(n_mels, frames)`` features; every draw from ``generator``."""
    out = features.clone()
    n_mels, frames = out.shape
    fill = features.mean()
    max_time = min(config.time_width, int(config.max_time_fraction * frames))
    for count, width_limit, size, axis in (
        (config.freq_masks, config.freq_width, n_mels, 0),
        (config.time_masks, max_time, frames, 1),
    ):
        for _ in range(count):
            width = int(torch.randint(0, width_limit + 1, (1,), generator=generator))
            start = int(torch.randint(0, size - width + 1, (1,), generator=generator))
            out.narrow(axis, start, width).fill_(fill)
    return out
