"""Video + caption → a seeded clip of frames + caption tokens (``encoder: video_text``).

Input: `converters.sample_types.VideoTextSample` (``video``: Energon ``AVDecoder``,
``text``, ``meta``: the converter's ``text.json`` with the frame count and fps).

Per sample:

1. **Clip choice** (`clip_indices`): ``video.num_frames`` frames, ``video.stride`` source
   frames apart, or at ``video.fps`` frames per second when that is set (the step is then
   ``native_fps / fps`` source frames, rounded per frame). Training: a random start drawn from the
   sample's own generator (stream ``"clip"``: a pure function of run seed, key and epoch);
   evaluation: the centred clip. A video shorter than the clip gives the frames it has.
2. **Decoding** with Energon's AV readers, as ``AVDecoder.get_video_clips`` does (`decode_frames`,
   `read_frames`): one single-frame range per chosen frame, in order, so the reader seeks to
   the keyframe before the clip and decodes forward from there; frames before that keyframe and
   after the clip are never decoded, whatever the video's length.
3. **Transforms**: the ``video.transforms`` (training) or ``video.eval_transforms`` pipeline, the
   same torchvision v2 steps and checks as ``image_text``
   (`task_encoders.image_transforms`), run once on the whole clip as a
   ``tv_tensors.Video``: one crop, one flip and one colour jitter for every frame of the clip,
   seeded by (seed, key, epoch) (stream ``"video"``); the leading crops/resizes run on the uint8
   frames, then values become float32 in [0, 1] (`clip_pipeline`).
4. **Audio** (``video.audio``, off by default): the audio track under the clip's time span through
   the ``audio_text`` path (`task_encoders.audio_features.LogMel`, seeded SpecAugment in
   training); a video without audio gives zero frames of features.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from megatron.energon import edataclass
from torchvision import tv_tensors

from task_encoders.audio_features import AudioConfig, LogMel, spec_augment, to_float_mono
from task_encoders.batch_fields import VideoFields
from task_encoders.batch_tensors import Medium
from task_encoders.config import EncoderConfig
from task_encoders.config_parser import At, require
from task_encoders.documents import DocumentTaskEncoder, EncodedDoc, TextBatch
from task_encoders.features import features
from task_encoders.image_path import ImageBytesDecoder
from task_encoders.image_text import ImageConfig
from task_encoders.image_transforms import TransformSpec
from task_encoders.registry import register
from task_encoders.seeding import seeded_global_torch
from task_encoders.sequences import pad_stack


def _default_transforms() -> tuple[TransformSpec, ...]:
    return tuple(
        TransformSpec.from_config_value(v, At(key="video.transforms"))
        for v in (
            {"name": "RandomResizedCrop", "size": 112, "scale": [0.5, 1.0]},
            {"name": "Normalize", "mean": [0.45, 0.45, 0.45], "std": [0.225, 0.225, 0.225]},
        )
    )


@dataclass(frozen=True)
class VideoConfig:
    """``video:`` section: clip length and spacing, frame transforms, optional audio features.

    The pipelines follow ``image_text``'s rules (same catalogue, same fixed-output-size rule). The
    default has no ``RandomHorizontalFlip``: a flipped clip of "moves from left to right" shows the
    opposite of its caption; add one only for captions without left/right.
    """

    num_frames: int = 8
    """Frames per clip (1 to 1024)."""
    stride: int = 2
    """Source frames between two clip frames (used when ``fps`` is null)."""
    fps: float | None = None
    """Sample the clip at this rate instead of ``stride`` (source frames ``native_fps / fps``
    apart); null: use ``stride``."""
    transforms: tuple[TransformSpec, ...] = field(default_factory=_default_transforms)
    """The training pipeline of every frame, as ``image.transforms`` of ``image_text``."""
    eval_transforms: tuple[TransformSpec, ...] | None = None
    """The pipeline with ``training=False``, as ``image.eval_transforms`` of ``image_text``."""
    audio: AudioConfig | None = None
    """Log-mel features of the clip's audio: an ``audio:`` section as in ``audio_text`` (the
    ``video.audio`` keys below); null: none."""

    def check(self, at: At) -> None:
        require(
            1 <= self.num_frames <= 1024,
            at.child("num_frames"),
            f"got {self.num_frames}",
            "an integer from 1 to 1024",
        )
        require(
            1 <= self.stride <= 1000,
            at.child("stride"),
            f"got {self.stride}",
            "an integer from 1 to 1000",
        )
        if self.fps is not None:
            require(
                0 < self.fps <= 1000,
                at.child("fps"),
                f"got {self.fps}",
                "null or frames per second in (0, 1000]",
            )
        self.frames.check(at)

    @property
    def frames(self) -> ImageConfig:
        """The per-frame pipelines as an ``image_text`` image section (same checks, same eval default)."""
        return ImageConfig(self.transforms, self.eval_transforms)

    @property
    def size(self) -> tuple[int, int]:
        """Output (height, width) of every frame."""
        return self.frames.size


@dataclass(frozen=True)
class VideoTextConfig(EncoderConfig):
    """Top level of a ``video_text`` config: the shared sections plus ``video``."""

    encoder: str = "video_text"
    """The registered name of the encoder: ``video_text``."""
    video: VideoConfig = field(default_factory=VideoConfig)
    """Clip sampling, frame pipelines and audio features (the ``video`` keys below)."""


@edataclass
class VideoTextBatch(TextBatch):
    """`task_encoders.documents.TextBatch` plus, per document (``D == N`` without packing):

    * ``videos``: float32 ``(D, T, C, h, w)``, ``T = video.num_frames``; a clip of a video shorter
      than the clip is zero-padded after its last frame.
    * ``num_frames``: int32 ``(D,)``, real frames of each clip (``videos[i, :num_frames[i]]``).
    * ``audio_features``: float32 ``(D, n_mels, A)`` log-mel of the clip's audio, zero-padded along
      time; ``audio_lengths``: int64 ``(D,)`` valid frames (0 for a video without audio). Without
      ``video.audio``: ``(D, 0, 0)`` and zeros.
    """

    media = (
        Medium("videos", lengths="num_frames", axis=0),
        Medium("audio_features", lengths="audio_lengths", axis=-1),
    )

    videos: torch.Tensor
    num_frames: torch.Tensor
    audio_features: torch.Tensor
    audio_lengths: torch.Tensor


def clip_indices(
    total: int,
    native_fps: float,
    cfg: VideoConfig,
    training: bool,
    generator: torch.Generator | None,
) -> list[int]:
    """The source frame indices of the clip, increasing (module doc, step 1).

    ``total``: frames in the video; ``native_fps``: its frame rate. Training draws the start
    uniformly from every start that keeps the whole clip inside the video, from ``generator``.
    """
    if total < 1:
        raise ValueError("the video has no frames")
    step = native_fps / cfg.fps if cfg.fps else float(cfg.stride)
    offsets = [round(i * step) for i in range(cfg.num_frames)]
    last_start = total - 1 - offsets[-1]
    if last_start <= 0:
        start = 0
    elif training:
        start = int(torch.randint(0, last_start + 1, (1,), generator=generator))
    else:
        start = last_start // 2
    return sorted({start + o for o in offsets if start + o < total})


def video_facts(sample: Any) -> tuple[int, float, bool | None]:
    """(frame count, fps, has audio or None if unknown): from the converter's provenance in
    ``sample.meta`` when there (no file access), else from Energon's decoder (a demux pass; video
    bytes of a light sample are wrapped in one)."""
    source = (getattr(sample, "meta", None) or {}).get("source") or {}
    frames, fps = source.get("frames"), source.get("fps")
    if isinstance(frames, int) and isinstance(fps, (int, float)) and frames > 0 and fps > 0:
        audio = source.get("audio")
        return frames, float(fps), audio if isinstance(audio, bool) else None
    video = sample.video
    if isinstance(video, (bytes, bytearray, memoryview)):
        import io

        from megatron.energon.av import AVDecoder

        video = AVDecoder(io.BytesIO(bytes(video)))
    _, count = video.get_video_duration(get_frame_count=True)
    return int(count or 0), float(video.get_video_fps()), None


def decode_frames(decoder: Any, indices: list[int], fps: float) -> torch.Tensor:
    """uint8 ``(T, 3, H, W)``: the frames at ``indices`` (module doc, step 2); ``ValueError`` when
    none decodes.

    MP4/MOV and Matroska/WebM (what ``convert video`` stores) go through `read_frames`:
    Energon's own readers (``AVReaderByFrames`` on the MP4 frame index, ``AVReaderByPts`` on the
    Matroska index) in one container, the loop of ``AVDecoder.get_video_clips``, with two changes:
    the Matroska index is loaded before the reader is built, and frames are converted to RGB by one
    reused ``VideoReformatter``. Any other container: ``decoder.get_video_clips`` itself."""
    decoder.stream.seek(0)
    head = decoder.stream.read(12)
    kind = "pts" if head[:4] == _EBML_MAGIC else "frames" if head[4:8] == b"ftyp" else None
    if kind is None:
        ranges = [((i + 0.5) / fps, (i + 0.5) / fps) for i in indices]
        # Energon converts the seconds to its index's unit and says so
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="Video container unit", category=RuntimeWarning
            )
            clips, _ = decoder.get_video_clips(ranges, video_unit="seconds")
        frames = [c[0] for c in clips]
    else:
        frames = read_frames(decoder, indices, fps, kind)
    if not frames:
        raise ValueError(f"no frame decoded at frames {indices[0]}..{indices[-1]}")
    return torch.stack(frames)


_EBML_MAGIC = b"\x1a\x45\xdf\xa3"
_REFORMATTER: tuple[int, Any] = (-1, None)  # (pid, VideoReformatter) of this process


def _rgb(frame: Any) -> torch.Tensor:
    """uint8 ``(3, H, W)``. One single-threaded ``VideoReformatter`` per process for every frame:
    ``frame.reformat`` builds a new swscale context per frame, which costs more than decoding a
    small frame. Per process, and without scaler threads: a context inherited through ``fork``
    (DataLoader workers) would wait for threads the child does not have."""
    global _REFORMATTER
    if _REFORMATTER[0] != os.getpid():
        from av.video.reformatter import VideoReformatter

        _REFORMATTER = (os.getpid(), VideoReformatter())
    rgb = _REFORMATTER[1].reformat(frame, format="rgb24", threads=1)
    return torch.from_numpy(rgb.to_ndarray().copy()).permute(2, 0, 1)


def read_frames(decoder: Any, indices: list[int], fps: float, kind: str) -> list[torch.Tensor]:
    """The frames at ``indices`` with Energon's ``AVReaderByFrames`` (``kind="frames"``: MP4/MOV,
    exact frame numbers) or ``AVReaderByPts`` (``"pts"``: Matroska/WebM, each frame asked for at
    the middle of its display interval).

    Matroska: FFmpeg reads a file's index (its Cues, written at the end) only on the first seek, so
    the index ``AVDecoder.get_video_clips`` (Energon 7.4.1) gives its reader holds just the first
    keyframe and every clip is decoded from the start of the file (measured: 306 frames decoded to
    reach frame 300). One seek to the end and back loads it; the reader then seeks to the keyframe
    before the clip.
    """
    from megatron.energon.av.av_init import av_open
    from megatron.energon.av.av_reader import AVReaderByFrames, AVReaderByPts

    decoder.stream.seek(0)
    frames = []
    with av_open(decoder.stream) as container:
        stream = container.streams.video[0]
        if kind == "pts":
            if container.duration:
                container.seek(container.duration)  # loads the Cues into the stream's index
                container.seek(0)
            reader = AVReaderByPts(container, 0, stream.index_entries)
            if stream.time_base is None:
                raise ValueError("the video stream has no time base: its frames cannot be timed")
            ranges = [int((i + 0.5) / fps / stream.time_base) for i in indices]
        else:
            reader = AVReaderByFrames(container, 0, stream.index_entries)
            ranges = indices
        for at in ranges:
            for frame in reader.seek_read(at, at):
                frames.append(_rgb(frame))
                break
    return frames


#: Steps that only move or resample pixels: run on the uint8 clip, before it becomes float.
_GEOMETRIC = ("RandomResizedCrop", "Resize", "CenterCrop", "RandomCrop", "RandomHorizontalFlip")


def clip_pipeline(specs: tuple[TransformSpec, ...]) -> Any:
    """The v2 pipeline of a clip: the leading geometric steps on uint8 frames (a crop first makes
    the float conversion and colour steps work on fewer pixels: about 2 ms less per 8-frame
    320x240 clip), then ``ToDtype(float32, scale=True)`` (values in [0, 1], as images get from
    Energon), then the remaining steps."""
    from torchvision.transforms import v2

    n = next((i for i, spec in enumerate(specs) if spec.name not in _GEOMETRIC), len(specs))
    return v2.Compose(
        [
            *(s.build() for s in specs[:n]),
            v2.ToDtype(torch.float32, scale=True),
            *(s.build() for s in specs[n:]),
        ]
    )


@register("video_text")
class VideoTextTaskEncoder(DocumentTaskEncoder):
    """``VideoTextTaskEncoder(config=None, *, seed=None, training=True)``; batches are
    `VideoTextBatch`. ``training=False``: centred clips, ``video.eval_transforms`` (default
    Resize + CenterCrop + the training Normalize) and no SpecAugment."""

    config_class = VideoTextConfig
    config: VideoTextConfig
    #: images, which this encoder never reads, stay undecoded bytes
    decoder = ImageBytesDecoder()
    batch_type = VideoTextBatch

    def __init__(self, config: Any = None, *, seed: int | None = None, training: bool = True):
        super().__init__(config, seed=seed, training=training)
        cfg = self.config.video
        self.pipeline = clip_pipeline(cfg.frames.pipeline_specs(training))
        self.log_mel = LogMel(cfg.audio) if cfg.audio is not None else None

    def clip_of(self, sample: Any) -> list[int]:
        """The sample's clip (source frame indices) in this epoch."""
        total, fps, _ = video_facts(sample)
        return clip_indices(
            total, fps, self.config.video, self.training, self.sample_generator(sample, "clip")
        )

    # --- lengths without decoding (DocumentTaskEncoder's contract): work adds the clip's frames ---

    facts_width = 2

    def sample_facts(self, sample: Any) -> tuple[int, ...]:
        """``(caption tokens, clip frames)``. A clip's frame count does not depend on its (seeded)
        start: every start keeps the whole clip inside the video, or the video is shorter and the clip
        starts at 0 (`clip_indices`)."""
        total, fps, _ = video_facts(sample)
        return (
            *super().sample_facts(sample),
            len(clip_indices(total, fps, self.config.video, False, None)),
        )

    def sample_length(self, facts: tuple[int, ...], key: str, epoch: int) -> tuple[int, int]:
        if self.log_mel is not None:
            raise NotImplementedError(
                "video.audio: the clip's audio frames depend on how Energon's AV decoder "
                "cuts the track; not derived from headers"
            )
        row, _ = super().sample_length(facts[:1], key, epoch)
        return row, row + facts[1]

    def encoded_length(self, doc: EncodedDoc) -> tuple[int, int]:
        row, _ = super().encoded_length(doc)
        audio = doc.media.get("audio")
        return row, row + int(doc.media["video"].shape[0]) + (
            int(audio.shape[-1]) if audio is not None else 0
        )

    # --- cost features: every clip frame is one vision tile; the clip's audio frames --------------

    work_feature = "vision_tiles"  # the facts' view: sample_length refuses video.audio

    def doc_media_features(self, doc: EncodedDoc) -> dict[str, float]:
        audio = doc.media.get("audio")
        return features(
            vision_tiles=doc.media["video"].shape[0],
            audio_frames=audio.shape[-1] if audio is not None else 0,
        )

    def batch_media_features(self, batch: VideoFields) -> dict[str, float]:
        """Real frames (``num_frames``, not the padding) and, with ``video.audio``, audio frames
        (a multimodal batch carries no clip audio: the config refuses ``video.audio`` there)."""
        audio = int(batch.audio_lengths.sum()) if self.log_mel is not None else 0
        return features(vision_tiles=int(batch.num_frames.sum()), audio_frames=audio)

    def encode_media(self, sample: Any) -> dict[str, torch.Tensor]:
        total, fps, has_audio = video_facts(sample)
        indices = clip_indices(
            total, fps, self.config.video, self.training, self.sample_generator(sample, "clip")
        )
        frames = decode_frames(sample.video, indices, fps)
        with seeded_global_torch(self.sample_seed(sample, "video")):
            clip = self.pipeline(tv_tensors.Video(frames))
        media = {"video": clip.as_subclass(torch.Tensor).to(torch.float32).contiguous()}
        if self.log_mel is not None:
            media["audio"] = self._audio_features(sample, indices, fps, has_audio)
        return media

    def _audio_features(
        self, sample: Any, indices: list[int], fps: float, has_audio: bool | None
    ) -> torch.Tensor:
        cfg, log_mel = self.config.video.audio, self.log_mel
        if cfg is None or log_mel is None:
            raise RuntimeError("clip audio asked for without video.audio configured")
        if has_audio is None:
            has_audio = sample.video.has_audio_stream()
        if not has_audio:
            return torch.zeros((cfg.n_mels, 0), dtype=torch.float32)
        clips, _ = sample.video.get_audio_clips([(indices[0] / fps, (indices[-1] + 1) / fps)])
        if not clips or clips[0].numel() == 0:
            return torch.zeros((cfg.n_mels, 0), dtype=torch.float32)
        features = log_mel(to_float_mono(clips[0]), sample.video.get_audio_samples_per_second())
        if self.training and cfg.spec_augment.enabled:
            features = spec_augment(
                features, cfg.spec_augment, self.sample_generator(sample, "spec_augment")
            )
        return features

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        length = self.config.video.num_frames
        clips = [d.media["video"] for d in docs]
        videos = clips[0].new_zeros((len(clips), length, *clips[0].shape[1:]))
        for i, clip in enumerate(clips):
            videos[i, : clip.shape[0]] = clip
        out = {
            "videos": videos,
            "num_frames": torch.tensor([c.shape[0] for c in clips], dtype=torch.int32),
        }
        if self.log_mel is not None:
            out["audio_features"], out["audio_lengths"] = pad_stack(
                [d.media["audio"] for d in docs]
            )
        else:
            out["audio_features"] = torch.zeros((len(docs), 0, 0), dtype=torch.float32)
            out["audio_lengths"] = torch.zeros(len(docs), dtype=torch.int64)
        return out
