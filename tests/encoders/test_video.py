"""``video_text``: clip choice, seeking through Energon's AVDecoder (frames decoded only around the
clip), one transform draw per clip, audio features, determinism per (seed, key, epoch) across
worker counts and processes, exact resume after SIGKILL and elastic resume through
energon_platform's TrainLoader, and the ``multimodal`` encoder's video documents."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import warnings
from pathlib import Path

import pytest
import torch

from task_encoders.config_parser import ConfigError
from task_encoders.registry import get_encoder
from task_encoders.video_text import VideoConfig, VideoTextBatch, clip_indices, decode_frames
from tests.helpers import layouts
from tests.helpers.cli import run_python
from tests.helpers.run_configs import loader_config
from tests.helpers.video_corpus import make_video, read_index, video_dataset

SMALL_VIDEO = {
    "num_frames": 4,
    "stride": 3,
    "transforms": [
        {"name": "RandomResizedCrop", "size": 24, "scale": [0.5, 1.0]},
        {"name": "ColorJitter", "brightness": 0.4, "contrast": 0.4},
        {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
    ],
}
SMALL_AUDIO = {
    "n_fft": 256,
    "hop_length": 128,
    "n_mels": 16,
    "spec_augment": {"freq_width": 4, "time_width": 4},
}


def video_encoder(tokenizer_dir=None, seed=None, training=True, **video):
    text = {"seq_len": 32, **({"tokenizer": str(tokenizer_dir)} if tokenizer_dir else {})}
    return get_encoder(
        {"encoder": "video_text", "seed": 1234, "text": text, "video": {**SMALL_VIDEO, **video}},
        seed=seed,
        training=training,
    )


def with_epoch(sample, epoch):
    sample = copy.copy(sample)
    sample.__subflavors__ = {**(sample.__subflavors__ or {}), "epoch": epoch}
    return sample


def digests(batch: VideoTextBatch) -> dict[str, str]:
    """key → sha256 of the document's tokens, real clip frames and audio features."""
    flat = batch.tokens.flatten()
    out = {}
    for j, key in enumerate(batch.keys):
        start = int(batch.cu_seqlens[j])
        parts = [
            flat[start : start + int(batch.doc_lengths[j])],
            batch.videos[j, : int(batch.num_frames[j])],
            batch.audio_features[j, :, : int(batch.audio_lengths[j])],
        ]
        out[key] = hashlib.sha256(
            b"".join(p.contiguous().numpy().tobytes() for p in parts)
        ).hexdigest()
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return video_dataset(tmp_path_factory.getbasetemp(), n=12)


@pytest.fixture(scope="module")
def samples(shards):
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    ds = get_val_dataset(
        shards,
        split_part="train",
        batch_size=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    return list(get_loader(ds))


def one_pass(encoder, path, num_workers=0, batch_size=3):
    from megatron.energon import get_savable_loader, get_val_dataset

    ds = get_val_dataset(
        path,
        split_part="train",
        batch_size=batch_size,
        task_encoder=encoder,
        worker_config=encoder.worker_config(num_workers=num_workers),
    )
    return list(get_savable_loader(ds))


# ---------------------------------------------------------------- clip choice


def test_clip_indices_stride_fps_centre_random_and_short_videos():
    cfg = VideoConfig(num_frames=4, stride=3)
    # centred: starts 0..30, the middle one
    assert clip_indices(40, 12.0, cfg, False, None) == [
        15,
        18,
        21,
        24,
    ]
    assert clip_indices(10, 12.0, cfg, False, None) == [0, 3, 6, 9]
    assert clip_indices(7, 12.0, cfg, True, torch.Generator()) == [0, 3, 6]  # shorter than the clip
    fps_cfg = VideoConfig(num_frames=3, fps=4.0)  # 30 fps source: every 7.5 frames
    assert clip_indices(16, 30.0, fps_cfg, False, None) == [0, 8, 15]
    starts = set()
    for seed in range(1000):
        g = torch.Generator().manual_seed(seed)
        idx = clip_indices(40, 12.0, cfg, True, g)
        assert (
            len(idx) == 4 and idx[-1] <= 39 and [b - a for a, b in zip(idx, idx[1:])] == [3, 3, 3]
        )
        starts.add(idx[0])
    assert starts == set(range(31))  # every start that keeps the clip inside the video


def test_config_errors_name_the_key():
    for bad, key in (
        ({"num_frames": 0}, "video.num_frames"),
        ({"stride": 0}, "video.stride"),
        ({"fps": -1.0}, "video.fps"),
        ({"transforms": [{"name": "ColorJitter"}]}, "video.transforms"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            video_encoder(**bad)


# ---------------------------------------------------------------- decoding


@pytest.mark.parametrize("fmt", ["mp4", "webm", "mkv"])
def test_decoded_frames_are_the_chosen_ones_and_only_the_clip_is_decoded(fmt, monkeypatch):
    """A 600-frame video, keyframe every 12 frames: a clip near the end decodes at most one GOP
    before it (Energon seeks), and the frames are exactly the requested ones (read from the pixels)."""
    from megatron.energon.av import AVDecoder, av_reader

    readers = []
    original = av_reader.AVReader.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        readers.append(self)

    monkeypatch.setattr(av_reader.AVReader, "__init__", spy)
    decoder = AVDecoder(io.BytesIO(make_video(fmt, frames=600, width=128, height=64, gop=12)))
    for indices in ([0, 2, 4, 6], [300, 303, 306, 309], [590, 593, 596, 599]):
        readers.clear()
        frames = decode_frames(decoder, indices, 12.0)
        assert [read_index(f.numpy()) % 256 for f in frames] == [i % 256 for i in indices]
        (reader,) = readers
        assert reader.skipped <= 12 + 9, f"{reader.skipped} frames decoded and dropped: not a seek"
        with warnings.catch_warnings():  # the same pixels as Energon's own get_video_clips
            warnings.simplefilter("ignore")
            ref, _ = decoder.get_video_clips([((i + 0.5) / 12, (i + 0.5) / 12) for i in indices])
        assert torch.equal(frames, torch.cat([c[:1] for c in ref]))


def test_one_transform_draw_for_all_frames_of_a_clip(monkeypatch):
    """One crop and one colour jitter for the whole clip: each random step of the pipeline draws
    its parameters once per clip (not per frame), and a clip whose decoded frames are made the same
    picture on purpose (decoded video frames are never reliably identical: MJPEG is lossy, with
    per-frame rate control) comes out as identical frames; another key draws other parameters."""
    import av
    from megatron.energon.av import AVDecoder
    from torchvision.transforms import v2

    import task_encoders.video_text as video_text
    from converters.sample_types import VideoTextSample

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        s = out.add_stream("mjpeg", rate=12)
        s.width, s.height, s.pix_fmt = 64, 48, "yuvj420p"
        for i in range(20):
            picture = torch.randint(
                0, 255, (48, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(i)
            )
            f = av.VideoFrame.from_ndarray(picture.numpy(), format="rgb24")
            f.pts = i
            for p in s.encode(f):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)

    draws = []  # (transform, parameters) of every draw, in order
    for kind in (v2.RandomResizedCrop, v2.ColorJitter):

        def make_params(self, flat_inputs, _real=kind.make_params):
            params = _real(self, flat_inputs)
            draws.append((type(self).__name__, repr(params)))
            return params

        monkeypatch.setattr(kind, "make_params", make_params)
    real_decode = video_text.decode_frames
    same_picture = {"on": False}

    def decode(decoder, indices, fps):
        frames = real_decode(decoder, indices, fps)
        assert frames.shape[0] == 4
        return frames[:1].expand_as(frames).clone() if same_picture["on"] else frames

    monkeypatch.setattr(video_text, "decode_frames", decode)
    encoder = video_encoder()
    clips, params = {}, {}
    for same in (False, True):
        same_picture["on"] = same
        for key in ("k1", "k2"):
            sample = VideoTextSample(
                __key__=key,
                __restore_key__=(),
                __subflavors__={},
                __sources__=(),
                video=AVDecoder(io.BytesIO(buf.getvalue())),
                text="same",
                meta={},
            )
            draws.clear()
            clip = encoder.encode_media(sample)["video"]
            assert clip.shape == (4, 3, 24, 24)
            assert [name for name, _ in draws] == ["RandomResizedCrop", "ColorJitter"], draws
            clips[same, key], params[same, key] = clip, draws[:]
    assert params[False, "k1"] == params[True, "k1"], (
        "the draw depends on the key, not on the pixels"
    )
    assert params[True, "k1"] != params[True, "k2"]
    assert not torch.equal(clips[False, "k1"][0], clips[False, "k1"][1]), "the real frames differ"
    for key in ("k1", "k2"):
        clip = clips[True, key]
        assert all(torch.equal(clip[0], clip[t]) for t in range(4)), key
    assert not torch.equal(clips[True, "k1"], clips[True, "k2"])


def test_batch_fields_padding_and_audio_features(shards, tokenizer_dir):
    encoder = video_encoder(tokenizer_dir, audio=SMALL_AUDIO, num_frames=12, stride=3)
    batches = one_pass(encoder, shards)
    keys = [k for b in batches for k in b.keys]
    assert len(keys) == 12
    for b in batches:
        assert isinstance(b, VideoTextBatch) and b.videos.dtype == torch.float32
        assert b.videos.shape[1:] == (12, 3, 24, 24) and b.num_frames.dtype == torch.int32
        for j, key in enumerate(b.keys):
            i = int(key.split("_")[1])
            total = (24, 36, 48)[i % 3]
            # a 24-frame video gives 8 of 12 frames
            assert int(b.num_frames[j]) == min(12, -(-total // 3))
            assert torch.count_nonzero(b.videos[j, int(b.num_frames[j]) :]) == 0
            has_audio = i % 4 == 1
            assert (int(b.audio_lengths[j]) > 0) == has_audio, key
        assert b.audio_features.shape[:2] == (len(b.keys), 16)
    plain = one_pass(video_encoder(tokenizer_dir), shards)[0]
    assert plain.audio_features.shape == (3, 0, 0) and plain.audio_lengths.tolist() == [0, 0, 0]


def test_cost_features_count_clip_frames_and_their_audio_frames(samples, tokenizer_dir):
    """With ``video.audio`` (whose lengths are not derived from headers) the document and batch
    views of the cost still agree: frames as vision tiles, the clip's log-mel frames as audio."""
    from task_encoders.features import summed
    from tests.encoders.test_lengths import check_batch_features, encoded_views

    encoder = video_encoder(tokenizer_dir, audio=SMALL_AUDIO, num_frames=12, stride=3)
    docs = [encoder.encode(s) for s in samples]
    vectors = [encoded_views(encoder, d)[1] for d in docs]
    check_batch_features(encoder, docs)
    total = summed(vectors)
    assert total["audio_frames"] > 0 and total["vision_tiles"] > len(docs), total


# ---------------------------------------------------------------- determinism


def test_same_tensors_per_key_for_0_1_2_workers_and_they_depend_on_key_and_epoch(
    shards, samples, tokenizer_dir
):
    encoder = video_encoder(tokenizer_dir)
    runs = [
        {k: v for b in one_pass(encoder, shards, num_workers=w) for k, v in digests(b).items()}
        for w in (0, 1, 2)
    ]
    assert len(runs[0]) == 12 and runs[0] == runs[1] == runs[2]
    sample = samples[0]
    clips = {e: encoder.clip_of(with_epoch(sample, e)) for e in range(6)}
    assert len({tuple(c) for c in clips.values()}) > 1, "the clip start must change between epochs"
    again = video_encoder(tokenizer_dir)
    assert clips == {e: again.clip_of(with_epoch(sample, e)) for e in range(6)}
    a = encoder.encode_sample(with_epoch(sample, 0)).media["video"]
    assert torch.equal(a, again.encode_sample(with_epoch(sample, 0)).media["video"])
    assert not torch.equal(a, encoder.encode_sample(with_epoch(sample, 1)).media["video"])
    assert not torch.equal(
        a, video_encoder(tokenizer_dir, seed=99).encode_sample(with_epoch(sample, 0)).media["video"]
    )
    evaluation = video_encoder(tokenizer_dir, training=False)
    # centred in 24 frames
    assert {tuple(evaluation.clip_of(with_epoch(sample, e))) for e in range(6)} == {(7, 10, 13, 16)}


PROCESS_SCRIPT = """
import json, sys
from tests.encoders.test_video import digests, one_pass, video_encoder
encoder = video_encoder(sys.argv[2])
out = {}
for batch in one_pass(encoder, sys.argv[1], num_workers=2, batch_size=5):
    out.update(digests(batch))
print("DIGESTS " + json.dumps(out))
"""


@pytest.mark.slow
def test_another_process_with_other_workers_gives_the_same_tensors(shards, tokenizer_dir):
    r = run_python(PROCESS_SCRIPT, shards, tokenizer_dir, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("DIGESTS "))[8:])
    ours = {
        k: v for b in one_pass(video_encoder(tokenizer_dir), shards) for k, v in digests(b).items()
    }
    assert len(ours) == 12 and theirs == ours


# ---------------------------------------------------------------- resume through TrainLoader


def shards_config(path: Path, **loader):
    """The loaded config of the shards at ``path`` (no validation split), seed 7, ``loader``."""
    from energon_platform.config import load_config

    encoder = {"encoder": "video_text", "text": {"seq_len": 32}, "video": SMALL_VIDEO}
    return load_config(
        loader_config({"path": str(path), "val_split": None}, encoder, seed=7, **loader)
    )


def layout_batches(config, ranks: int, workers: int, steps: int, states=None):
    """``steps`` global batches as per-key digests (ranks in order), then every rank's state."""
    return layouts.layout_batches(config, ranks, workers, steps, digests, states)


@pytest.mark.slow
def test_elastic_resume_changes_ranks_and_workers_tensors_identical(shards):
    config = shards_config(shards)
    reference, _ = layout_batches(config, 1, 0, 8)  # 12 samples: epochs 0, 1 and part of 2
    before, states = layout_batches(config, 1, 2, 3)
    assert before == reference[:3]
    after, _ = layout_batches(config, 2, 1, 5, states)
    assert after == reference[3:], "the resumed layout must give the same keys and tensors"
    epoch0 = {k for batch in reference[:3] for k, _ in batch}
    assert len(epoch0) == 12


@pytest.mark.slow
def test_sigkill_then_resume_gives_identical_tensors(shards, tmp_path):
    layouts.assert_sigkill_resume_identical(
        "tests.encoders.test_video", shards, tmp_path / "killed", steps=9
    )


# ---------------------------------------------------------------- multimodal


def test_multimodal_takes_video_documents_bit_identical_to_video_text(
    samples, tokenizer_dir, raw_samples
):
    from task_encoders.multimodal import MultimodalBatch
    from tests.conftest import SMALL_IMAGE

    config = {
        "encoder": "multimodal",
        "seed": 1234,
        "text": {"tokenizer": str(tokenizer_dir), "seq_len": 32},
        "modalities": {"image_text": {"image": SMALL_IMAGE}, "video_text": {"video": SMALL_VIDEO}},
    }
    encoder = get_encoder(config)
    own = video_encoder(tokenizer_dir)
    mixed = [
        raw_samples("image_text")[0],
        samples[0],
        samples[1],
        raw_samples("image_text")[1],
        samples[2],
    ]
    batch = encoder.batch([encoder.encode_sample(s) for s in mixed])
    assert isinstance(batch, MultimodalBatch)
    assert batch.modalities == [
        "image_text",
        "video_text",
        "video_text",
        "image_text",
        "video_text",
    ]
    assert batch.num_videos.tolist() == [0, 1, 1, 0, 1] and batch.num_images.tolist() == [
        1,
        0,
        0,
        1,
        0,
    ]
    assert batch.videos.shape == (3, 4, 3, 24, 24) and batch.num_frames.tolist() == [4, 4, 4]
    assert batch.video_docs.tolist() == [1, 2, 4]
    for i, sample in enumerate(samples[:3]):
        assert torch.equal(batch.videos[i], own.encode_sample(sample).media["video"])
    text_only = get_encoder({**config, "modalities": {**config["modalities"], "text": {}}})
    empty = text_only.batch([text_only.encode_sample(raw_samples("image_text")[0])])
    assert empty.videos.shape == (0, 4, 3, 24, 24) and empty.num_videos.tolist() == [0]
    with pytest.raises(ConfigError, match=r"modalities\.video_text\.video\.audio"):
        get_encoder(
            {
                **config,
                "modalities": {"video_text": {"video": {**SMALL_VIDEO, "audio": SMALL_AUDIO}}},
            }
        )
