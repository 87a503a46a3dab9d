"""Several modalities in one batch (``encoder: multimodal``): each sample goes to the encoder of
its modality, and every batch is one `MultimodalBatch`.

Config (``configs/encoders/multimodal.yaml``):

    encoder: multimodal
    seed: 1234                  # shared: every modality encodes with this run seed
    text: {seq_len: 128}        # shared: one tokenizer and seq_len for every modality
    packing: {enabled: false}   # the multimodal encoder's; documents of all modalities share rows
    dispatch: sample_type       # or: subflavor
    subflavor_key: modality     # dispatch: subflavor reads sample.__subflavors__[subflavor_key]
    sample_types: {}            # optional, sample class name -> modality, checked before the rules below
    modalities:                 # modality name -> the config of its encoder: a mapping or a YAML path
      image_text: {image: {transforms: [...]}}     # `encoder:` defaults to the modality name
      audio_text: {audio: {n_mels: 80}}
      video_text: {video: {num_frames: 8}}
      pointcloud_text: {pointcloud: {num_points: 1024}}
      text: {}

Contracts:

* **Shared sections.** A modality's config may leave out ``seed`` and ``text`` (they are the top
  level's) or give them equal to the top level's; a different value is a ``ConfigError``, since the
  sample would no longer encode as in that encoder. Its ``packing`` and ``errors`` sections are
  replaced by the top level's: packing and the skip policy belong to the multimodal encoder.
* **Dispatch** (`MultimodalTaskEncoder.modality_of`). ``sample_type``: the class (or a base
  class) named in ``sample_types``; else ``CaptioningSample`` → ``image_text``, a sample with an
  ``video`` field → ``video_text``, a sample with a ``geometry`` field → ``pointcloud_text``, a
  sample with an ``audio`` field → ``audio_text``, ``TextSample`` → ``text``. ``subflavor``: the
  modality named by ``__subflavors__[subflavor_key]`` (set per blend entry in an Energon
  metadataset, ``subflavors: {modality: image_text}``). A sample whose modality is not configured
  raises `UnknownModality` (fatal, not skipped: it is a configuration error, not bad data).
* **Same tensors as the modality's own encoder.** Encoding is the modality encoder's own
  ``encode`` (same seed, key, epoch and config), so a document's tokens and media are bit-identical
  to what that encoder gives the same sample.
* **Supported modality encoders**: those whose batch is exactly ``TextBatch`` (text),
  ``ImageTextBatch`` (one image per document), ``AudioTextBatch`` (log-mel features) or
  ``VideoTextBatch`` (one clip per document, without ``video.audio``) or ``PointCloudTextBatch`` (one
  cloud per document). Modalities of one kind must agree on the image size / ``n_mels`` / clip shape
  / ``[num_points, channels]``, since their media are stacked in one tensor.
  Media are collated by the modality encoders' own ``collate_media``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from megatron.energon import CaptioningSample, TextSample, edataclass
from megatron.energon.errors import FatalSampleError

from task_encoders.audio_text import AudioTextBatch
from task_encoders.batch_tensors import Medium
from task_encoders.config import EncoderConfig, TextConfig
from task_encoders.config_parser import At, parse, read_yaml, to_plain
from task_encoders.documents import DocumentTaskEncoder, EncodedDoc, TextBatch
from task_encoders.features import summed, with_lengths
from task_encoders.image_path import ImageBytesDecoder, images_as_bytes
from task_encoders.image_text import ImageTextBatch
from task_encoders.pointcloud_text import PointCloudTextBatch
from task_encoders.registry import _import_module, encoder_class, register
from task_encoders.seeding import sample_key
from task_encoders.tokenization import DEFAULT_TOKENIZER_DIR
from task_encoders.video_text import VideoTextBatch

#: Media kind of a modality encoder, by its batch type.
_KINDS = {
    TextBatch: "text",
    ImageTextBatch: "image",
    AudioTextBatch: "audio",
    VideoTextBatch: "video",
    PointCloudTextBatch: "pointcloud",
}


class UnknownModality(FatalSampleError):
    """A sample whose modality (by type or subflavor) has no encoder in ``modalities``."""


def media_kind(cls: type, at: At) -> str:
    """``"text"``, ``"image"``, ``"audio"``, ``"video"`` or ``"pointcloud"`` for a modality
    encoder class; ``ConfigError`` otherwise."""
    if (
        not isinstance(cls, type)
        or not issubclass(cls, DocumentTaskEncoder)
        or issubclass(cls, MultimodalTaskEncoder)
    ):
        raise at.error(
            f"{getattr(cls, '__name__', cls)} cannot be a modality",
            "a document encoder (not multimodal)",
        )
    kind = _KINDS.get(cls.batch_type)
    if kind is None:
        raise at.error(
            f"{cls.name!r} makes {cls.batch_type.__name__}",
            "an encoder whose batch is TextBatch, ImageTextBatch, AudioTextBatch, VideoTextBatch or "
            "PointCloudTextBatch (e.g. text, image_text, audio_text, video_text, pointcloud_text)",
        )
    return kind


def _same_text(a: TextConfig, b: TextConfig) -> bool:
    def norm(t: TextConfig) -> TextConfig:
        return dataclasses.replace(
            t, tokenizer=Path(t.tokenizer or DEFAULT_TOKENIZER_DIR).resolve()
        )

    return norm(a) == norm(b)


@dataclass(frozen=True)
class _MultimodalSections(EncoderConfig):
    """The top level without its modalities (read first: they inherit its shared sections)."""

    encoder: str = "multimodal"
    """The registered name of the encoder: ``multimodal``."""
    modalities: dict[str, Any] = field(default_factory=dict)
    """Modality name → the config of its encoder, a mapping or a YAML path (``encoder:``
    defaults to the modality name); at least one is needed."""
    dispatch: Literal["sample_type", "subflavor"] = "sample_type"
    """How a sample's modality is found: by its sample class, or by its subflavor."""
    subflavor_key: str = "modality"
    """With ``dispatch: subflavor``: the ``__subflavors__`` key naming the modality."""
    sample_types: dict[str, str] = field(default_factory=dict)
    """Sample class name → modality, checked before the built-in rules of ``sample_type``."""


@dataclass(frozen=True)
class MultimodalConfig(_MultimodalSections):
    """Top level of a multimodal config (module doc). ``modalities`` holds each modality's parsed
    config (an `EncoderConfig` subclass), with the shared sections filled in."""

    @classmethod
    def from_config_value(cls, value: Any, at: At) -> MultimodalConfig:
        if not isinstance(value, Mapping):
            raise at.error(f"got {type(value).__name__}", "a mapping of sections")
        data = dict(value)
        specs = data.pop("modalities", None)
        top = parse(_MultimodalSections, data, at)
        mods_at = at.child("modalities")
        if not isinstance(specs, Mapping) or not specs:
            raise mods_at.error(
                "missing" if specs is None else f"got {specs!r}",
                "a mapping of modality name -> encoder config (a mapping or a YAML path)",
            )
        modalities = {
            str(name): _modality_config(str(name), spec, top, mods_at.child(str(name)))
            for name, spec in specs.items()
        }
        shared = {
            f.name: getattr(top, f.name) for f in dataclasses.fields(top) if f.name != "modalities"
        }
        return cls(**shared, modalities=modalities)

    def check(self, at: At) -> None:
        super().check(at)
        for class_name, name in self.sample_types.items():
            if name not in self.modalities:
                raise (
                    at.child("sample_types")
                    .child(class_name)
                    .error(f"unknown modality {name!r}", "one of " + ", ".join(self.modalities))
                )
        # kind -> (modality, media shape) of its first modality
        first: dict[str, tuple[str, Any]] = {}
        for name, sub in self.modalities.items():
            kind = media_kind(
                encoder_class(sub.encoder), at.child("modalities").child(name).child("encoder")
            )
            if kind == "text":
                continue
            if kind == "video" and sub.video.audio is not None:
                raise (
                    at.child("modalities")
                    .child(name)
                    .child("video")
                    .child("audio")
                    .error(
                        "audio features of videos",
                        "null: a multimodal batch carries video clips, not their audio",
                    )
                )
            if kind == "image":
                key, shape, what = "image", list(sub.image.size), "image size"
            elif kind == "audio":
                key, shape, what = "audio.n_mels", sub.audio.n_mels, "n_mels"
            elif kind == "pointcloud":
                key, shape, what = (
                    "pointcloud",
                    [sub.pointcloud.num_points, sub.pointcloud.channels],
                    "[num_points, channels]",
                )
            else:
                key, shape, what = (
                    "video",
                    [sub.video.num_frames, *sub.video.size],
                    "[num_frames, h, w]",
                )
            other, other_shape = first.setdefault(kind, (name, shape))
            if shape != other_shape:
                raise (
                    at.child("modalities")
                    .child(name)
                    .child(key)
                    .error(
                        f"{shape} differs from modality {other!r}'s {other_shape}",
                        f"the same {what} in every {kind} modality (their media share one tensor)",
                    )
                )


def _modality_config(name: str, spec: Any, top: _MultimodalSections, at: At) -> EncoderConfig:
    """One modality's config: ``spec`` (a mapping, or a YAML path relative to the top file) with the
    top level's shared sections (module doc)."""
    if isinstance(spec, str):
        path = Path(spec).expanduser()
        data, at = read_yaml(path if path.is_absolute() else at.folder / path)
    elif isinstance(spec, Mapping) or spec is None:
        data = dict(spec or {})
    else:
        raise at.error(
            f"got {type(spec).__name__}", "a mapping (the modality's encoder config) or a YAML path"
        )
    _import_module(data.get("module"), at)
    data.setdefault("encoder", name)
    if not isinstance(data["encoder"], str):
        raise at.child("encoder").error(
            f"got {data['encoder']!r}", "the name of a registered encoder"
        )
    cls = encoder_class(data["encoder"], at)
    media_kind(cls, at.child("encoder"))
    if "seed" in data and data["seed"] != top.seed:
        raise at.child("seed").error(
            f"{data['seed']!r} differs from the shared seed {top.seed}",
            "the top-level seed or none here: every modality encodes with the run seed",
        )
    if "text" in data and not _same_text(
        parse(TextConfig, data["text"], at.child("text")), top.text
    ):
        raise at.child("text").error(
            f"{data['text']!r} differs from the shared text section {to_plain(top.text)}",
            "the top-level text section or none here: every modality shares one tokenizer and seq_len",
        )
    shared = {key: to_plain(getattr(top, key)) for key in ("text", "packing", "errors")}
    return parse(cls.config_class, {**data, "seed": top.seed, **shared}, at)


@edataclass
class MultimodalBatch(TextBatch):
    """`task_encoders.documents.TextBatch` (every text field, for every row and document)
    plus the media of its documents, in document (``keys``) order:

    * ``modalities``: list[str] ``(D,)``, each document's modality name.
    * ``images``: float32 ``(N_img, 3, h, w)``, the image documents' images in document order;
      ``num_images``: int32 ``(D,)``, images per document (1 for image-text, 0 otherwise); image
      ``i`` belongs to document ``image_docs[i]`` (``repeat_interleave(arange(D), num_images)``).
    * ``features``: float32 ``(N_aud, n_mels, T_max)`` log-mel, zero-padded along time;
      ``feature_lengths``: int64 ``(N_aud,)`` valid frames (as in ``AudioTextBatch``);
      ``num_audio``: int32 ``(D,)``, utterances per document (1 for audio-text, 0 otherwise);
      utterance ``i`` belongs to document ``audio_docs[i]``.
    * ``videos``: float32 ``(N_vid, T, 3, h, w)`` clips (as in ``VideoTextBatch``); ``num_frames``:
      int32 ``(N_vid,)`` real frames per clip; ``num_videos``: int32 ``(D,)``, clips per document
      (1 for video-text, 0 otherwise); clip ``i`` belongs to document ``video_docs[i]``.

    * ``points``: float32 ``(N_pc, P, C)`` clouds (as in ``PointCloudTextBatch``); ``has_colors``:
      bool ``(N_pc,)``; ``num_clouds``: int32 ``(D,)``, clouds per document (1 for pointcloud-text,
      0 otherwise); cloud ``i`` belongs to document ``cloud_docs[i]``.

    Absent media are empty tensors: ``(0, 3, h, w)``, ``(0, n_mels, 0)``, ``(0, T, 3, h, w)``,
    ``(0, P, C)`` (sizes 0 when no modality of that kind is configured).
    """

    media = (
        Medium("images", per_doc="num_images"),
        Medium("features", per_doc="num_audio", lengths="feature_lengths", axis=-1),
        Medium("videos", per_doc="num_videos", lengths="num_frames", axis=0),
        Medium("points", per_doc="num_clouds"),
    )
    #: a flag beside ``points``, whose rgb channels (zero without colours) are digested
    undigested = TextBatch.undigested + ("has_colors",)

    modalities: list
    images: torch.Tensor
    num_images: torch.Tensor
    features: torch.Tensor
    feature_lengths: torch.Tensor
    num_audio: torch.Tensor
    videos: torch.Tensor
    num_frames: torch.Tensor
    num_videos: torch.Tensor
    points: torch.Tensor
    has_colors: torch.Tensor
    num_clouds: torch.Tensor

    @property
    def image_docs(self) -> torch.Tensor:
        """int64 ``(N_img,)``: the document index of each image."""
        return torch.repeat_interleave(torch.arange(len(self.num_images)), self.num_images.long())

    @property
    def audio_docs(self) -> torch.Tensor:
        """int64 ``(N_aud,)``: the document index of each utterance's features."""
        return torch.repeat_interleave(torch.arange(len(self.num_audio)), self.num_audio.long())

    @property
    def video_docs(self) -> torch.Tensor:
        """int64 ``(N_vid,)``: the document index of each clip."""
        return torch.repeat_interleave(torch.arange(len(self.num_videos)), self.num_videos.long())

    @property
    def cloud_docs(self) -> torch.Tensor:
        """int64 ``(N_pc,)``: the document index of each point cloud."""
        return torch.repeat_interleave(torch.arange(len(self.num_clouds)), self.num_clouds.long())


@edataclass
class MultimodalDoc(EncodedDoc):
    """An `EncodedDoc` from modality ``modality``'s encoder."""

    modality: str


def _modality_of(doc: EncodedDoc) -> str:
    """The modality a document of a multimodal encoder was encoded by."""
    if not isinstance(doc, MultimodalDoc):
        raise TypeError(f"a multimodal encoder got a {type(doc).__name__}, not a MultimodalDoc")
    return doc.modality


@register("multimodal")
class MultimodalTaskEncoder(DocumentTaskEncoder):
    """``MultimodalTaskEncoder(config=None, *, seed=None, training=True)``: one encoder per modality
    (built with this seed and ``training``), dispatch per sample, `MultimodalBatch` batches.
    Tokenization of rows, packing and batching are `DocumentTaskEncoder`'s. The Energon decoder
    leaves images as file bytes (`task_encoders.image_path.ImageBytesDecoder`) when every
    modality's encoder takes them so (text and audio ones ignore images); else Energon's default,
    which decodes them to float."""

    config_class = MultimodalConfig
    config: MultimodalConfig
    batch_type = MultimodalBatch

    def __init__(self, config: Any = None, *, seed: int | None = None, training: bool = True):
        super().__init__(config, seed=seed, training=training)
        self.encoders = {
            name: encoder_class(sub.encoder)(sub, seed=self.seed, training=training)
            for name, sub in self.config.modalities.items()
        }
        self.kinds = {name: _KINDS[type(enc).batch_type] for name, enc in self.encoders.items()}
        if all(images_as_bytes(enc.decoder) for enc in self.encoders.values()):
            #: images stay bytes for the modalities' `task_encoders.image_path` (else Energon's float)
            self.decoder = ImageBytesDecoder()
        else:
            self._refuse_image_options()
        self._by_type: dict[type, str | None] = {}
        self.facts_width = 1 + max(enc.facts_width for enc in self.encoders.values())

    def _refuse_image_options(self) -> None:
        """``ConfigError`` when a modality sets ``image.draft_decode`` or ``image.uint8_resize``
        while another modality's encoder needs Energon's float decode: the options act on file
        bytes, and its images would arrive decoded."""
        needs_float = [n for n, e in self.encoders.items() if not images_as_bytes(e.decoder)]
        for name, encoder in self.encoders.items():
            image = getattr(encoder.config, "image", None)
            for option in ("draft_decode", "uint8_resize"):
                if getattr(image, option, False):
                    raise (
                        self.config_at.child("modalities")
                        .child(name)
                        .child("image")
                        .child(option)
                        .error(
                            f"true, but modality {needs_float[0]!r} decodes images to float first",
                            "false, or modalities whose encoders all take image bytes",
                        )
                    )

    def modality_of(self, sample: Any) -> str:
        """The configured modality of ``sample`` (module doc); `UnknownModality` if none."""
        cfg = self.config
        if cfg.dispatch == "subflavor":
            name = (getattr(sample, "__subflavors__", None) or {}).get(cfg.subflavor_key)
            why = f"__subflavors__[{cfg.subflavor_key!r}] is {name!r}"
        else:
            kind = type(sample)
            if kind not in self._by_type:
                self._by_type[kind] = self._type_rule(kind)
            name = self._by_type[kind]
            why = (
                f"dispatch by sample type gives {name!r}"
                if name
                else "dispatch by sample type has no rule for it"
            )
        if not isinstance(name, str) or name not in self.encoders:
            raise UnknownModality(
                f"{self.config_at.source}: sample {sample_key(sample)!r} of type {type(sample).__name__}: {why}; "
                f"configured modalities: {', '.join(self.encoders)} (dispatch: {cfg.dispatch})"
            )
        return name

    def _type_rule(self, kind: type) -> str | None:
        for klass in kind.__mro__:
            if klass.__name__ in self.config.sample_types:
                return self.config.sample_types[klass.__name__]
        if issubclass(kind, CaptioningSample):
            return "image_text"
        fields = (
            {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else set()
        )
        if "video" in fields:
            return "video_text"
        if "geometry" in fields:
            return "pointcloud_text"
        if "audio" in fields:
            return "audio_text"
        if issubclass(kind, TextSample):
            return "text"
        return None

    def encode(self, sample: Any) -> MultimodalDoc:
        """The modality encoder's own ``encode`` (same tokens and media), tagged with the modality."""
        name = self.modality_of(sample)
        doc = self.encoders[name].encode(sample)
        return MultimodalDoc.derive_from(doc, tokens=doc.tokens, media=doc.media, modality=name)

    # --- lengths without decoding (DocumentTaskEncoder's contract), dispatched like encode -----

    def sample_facts(self, sample: Any) -> tuple[int, ...]:
        """``(modality index in modalities, *that encoder's facts, zeros up to facts_width)``."""
        name = self.modality_of(sample)
        facts = tuple(self.encoders[name].sample_facts(sample))
        return (list(self.encoders).index(name), *facts) + (0,) * (
            self.facts_width - 1 - len(facts)
        )

    def sample_length(self, facts: tuple[int, ...], key: str, epoch: int) -> tuple[int, int]:
        encoder = list(self.encoders.values())[facts[0]]
        return encoder.sample_length(tuple(facts[1 : 1 + encoder.facts_width]), key, epoch)

    def encoded_length(self, doc: EncodedDoc) -> tuple[int, int]:
        return self.encoders[_modality_of(doc)].encoded_length(doc)

    # --- cost features, dispatched like the lengths -------------------------------------------

    def sample_features(
        self, facts: tuple[int, ...], key: str, epoch: int, lengths: tuple[int, int] | None = None
    ) -> dict[str, float]:
        encoder = list(self.encoders.values())[facts[0]]
        own = tuple(facts[1 : 1 + encoder.facts_width])
        return with_lengths(encoder.sample_features, own, key, epoch, lengths)

    def encoded_features(self, doc: EncodedDoc) -> dict[str, float]:
        return self.encoders[_modality_of(doc)].encoded_features(doc)

    def batch_media_features(self, batch: MultimodalBatch) -> dict[str, float]:
        """Each configured media kind's features, read by its first modality encoder from the
        batch's fields of that kind (the fields its ``collate_media`` made)."""
        return summed(
            self._collator(kind).batch_media_features(batch)
            for kind in sorted(set(self.kinds.values()) - {"text"})
        )

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        """Each kind's documents (in document order) through the ``collate_media`` of the first
        modality encoder of that kind; counts per document; empty tensors for absent kinds."""
        modalities = [_modality_of(d) for d in docs]
        kinds = [self.kinds[m] for m in modalities]
        out: dict[str, Any] = {"modalities": modalities}
        for kind, count in (
            ("image", "num_images"),
            ("audio", "num_audio"),
            ("video", "num_videos"),
            ("pointcloud", "num_clouds"),
        ):
            out[count] = torch.tensor([k == kind for k in kinds], dtype=torch.int32)
            group = [d for d, k in zip(docs, kinds) if k == kind]
            media = self._collator(kind).collate_media(group) if group else self._empty(kind)
            # the clips' (empty) audio fields: video.audio is refused by the config check
            if kind == "video":
                media = {name: media[name] for name in ("videos", "num_frames")}
            out.update(media)
        return out

    def _collator(self, kind: str) -> DocumentTaskEncoder:
        return next(enc for name, enc in self.encoders.items() if self.kinds[name] == kind)

    def _empty(self, kind: str) -> dict[str, torch.Tensor]:
        subs = [self.encoders[n].config for n, k in self.kinds.items() if k == kind]
        if kind == "image":
            h, w = subs[0].image.size if subs else (0, 0)
            return {"images": torch.zeros((0, 3, h, w), dtype=torch.float32)}
        if kind == "video":
            t, (h, w) = (subs[0].video.num_frames, subs[0].video.size) if subs else (0, (0, 0))
            return {
                "videos": torch.zeros((0, t, 3, h, w), dtype=torch.float32),
                "num_frames": torch.zeros(0, dtype=torch.int32),
            }
        if kind == "pointcloud":
            p, c = (subs[0].pointcloud.num_points, subs[0].pointcloud.channels) if subs else (0, 3)
            return {
                "points": torch.zeros((0, p, c), dtype=torch.float32),
                "has_colors": torch.zeros(0, dtype=torch.bool),
            }
        n_mels = subs[0].audio.n_mels if subs else 0
        return {
            "features": torch.zeros((0, n_mels, 0), dtype=torch.float32),
            "feature_lengths": torch.zeros(0, dtype=torch.int64),
        }
