"""Plain text → packed LM rows (``encoder: text``).

Input: any sample with a ``caption`` (Energon ``CaptioningSample``: the caption datasets) or a
``text`` field (``TextSample``, ``AudioTextSample``). Packing is on by default: give Energon's
``get_train_dataset`` the encoder's ``packing_buffer_size``. Batches are
`task_encoders.documents.TextBatch`. No randomness.

The encoder's Energon ``decoder`` decodes text parts only: images and audio of the samples stay
undecoded bytes, since a text model never looks at them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import webdataset
from megatron.energon import SampleDecoder

from task_encoders.config import EncoderConfig, PackingConfig
from task_encoders.documents import DocumentTaskEncoder
from task_encoders.registry import register


@dataclass(frozen=True)
class TextEncoderConfig(EncoderConfig):
    """Top level of a ``text`` config: the shared sections, with packing on by default."""

    encoder: str = "text"
    """The registered name of the encoder: ``text``."""
    packing: PackingConfig = field(default_factory=lambda: PackingConfig(enabled=True))
    """Several documents per sequence; on by default for text (the ``packing`` keys below)."""


class TextOnlyDecoder(SampleDecoder):
    """Energon's ``SampleDecoder`` without media handlers: JSON and text parts are decoded,
    images, audio and video are left as bytes."""

    #: images reach the encoder as bytes (`task_encoders.image_path.images_as_bytes`)
    images_as_bytes = True

    def __init__(self):
        super().__init__()
        self._decoder = webdataset.autodecode.Decoder([])
        self._config = {**self._config, "media": "not decoded"}


@register("text")
class TextTaskEncoder(DocumentTaskEncoder):
    """``TextTaskEncoder(config=None, *, seed=None, training=True)``: tokenization + packing."""

    config_class = TextEncoderConfig
    config: TextEncoderConfig
    decoder = TextOnlyDecoder()
