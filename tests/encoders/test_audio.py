"""AudioTextTaskEncoder: decoding, resampling, log-mel, seeded SpecAugment, padded batches."""

import dataclasses
import io

import numpy as np
import pytest
import soundfile
import torch
from megatron.energon.av import AVDecoder

from task_encoders.audio_features import (
    SpecAugmentConfig,
    decode_audio,
    spec_augment,
    to_float_mono,
)
from task_encoders.audio_text import AudioTextBatch


def test_batch_shapes_dtypes_lengths_and_tokens(
    audio_text_encoder, audio_text_shards, one_pass, caption_of
):
    batches = one_pass(audio_text_encoder, audio_text_shards, batch_size=4)
    assert sorted(k for b in batches for k in b.keys) == [f"9001-1-{i:04d}" for i in range(12)]
    batch = batches[0]
    assert isinstance(batch, AudioTextBatch)
    assert batch.features.dtype == torch.float32 and batch.features.shape[:2] == (4, 32)
    assert (
        batch.feature_lengths.dtype == torch.int64
        and int(batch.feature_lengths.max()) == batch.features.shape[2]
    )
    for i, key in enumerate(batch.keys):
        seconds = 0.25 + 0.05 * (int(key[-4:]) % 5)  # resampled to 16 kHz whatever the file's rate
        assert int(batch.feature_lengths[i]) == int(seconds * 16000) // 128 + 1
        assert (batch.features[i, :, int(batch.feature_lengths[i]) :] == 0).all()
        length = int(batch.doc_lengths[i])
        assert audio_text_encoder.tokenizer.decode(batch.tokens[i, :length]) == caption_of(key)
    assert batch.tokens.dtype == torch.int64 and batch.loss_mask.dtype == torch.float32


@pytest.mark.parametrize("num_workers", [2])
def test_features_per_key_do_not_depend_on_workers(
    audio_text_encoder, audio_text_shards, one_pass, doc_digests, num_workers
):
    def digests(workers):
        return {
            k: v
            for b in one_pass(audio_text_encoder, audio_text_shards, num_workers=workers)
            for k, v in doc_digests(b).items()
        }

    assert digests(num_workers) == digests(0)


def test_spec_augment_is_seeded_per_key_and_epoch(make_encoder, raw_samples):
    encoder, plain = make_encoder("audio_text"), make_encoder("audio_text", training=False)
    for sample in raw_samples("audio_text")[:3]:
        clean = plain.encode_sample(sample).media["features"]
        first = encoder.encode_sample(sample).media["features"]
        again = encoder.encode_sample(sample).media["features"]
        later = encoder.encode_sample(
            dataclasses.replace(sample, __subflavors__={"epoch": 1})
        ).media["features"]
        assert (
            torch.equal(first, again)
            and not torch.equal(first, later)
            and not torch.equal(first, clean)
        )
        assert first.shape == clean.shape


def test_spec_augment_masks_stay_within_limits():
    features = torch.randn(32, 100)
    config = SpecAugmentConfig(
        freq_masks=1, freq_width=5, time_masks=2, time_width=50, max_time_fraction=0.1
    )
    widths = set()
    for seed in range(30):
        masked = (
            spec_augment(features, config, torch.Generator().manual_seed(seed)) == features.mean()
        )
        rows, cols = int(masked.all(dim=1).sum()), int(masked.all(dim=0).sum())
        assert rows <= 5 and cols <= 2 * 10  # time masks: at most 10% of 100 frames each
        assert (masked == (masked.all(dim=1, keepdim=True) | masked.all(dim=0, keepdim=True))).all()
        widths.add((rows, cols))
    assert len(widths) > 5  # widths vary with the seed
    assert torch.equal(
        spec_augment(features, config, torch.Generator().manual_seed(3)),
        spec_augment(features, config, torch.Generator().manual_seed(3)),
    )


def test_decoding_converts_integer_pcm_and_survives_single_frame_flac():
    wave = (0.5 * np.sin(np.linspace(0, 100, 4000))).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, np.stack([wave, wave], axis=1), 16000, format="FLAC", subtype="PCM_16")
    # 4000 samples fit in one FLAC frame: Energon's get_audio() fails to seek there (PyAV EPERM).
    clip, rate = decode_audio(AVDecoder(io.BytesIO(buf.getvalue())))
    assert rate == 16000 and clip.shape == (2, 4000) and clip.dtype == torch.int16
    mono = to_float_mono(clip)
    assert mono.dtype == torch.float32 and torch.allclose(mono, torch.from_numpy(wave), atol=1e-4)
