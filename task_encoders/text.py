"""Plain text → packed LM rows (``encoder: text``).

Input: any sample with a ``caption`` (Energon ``CaptioningSample``: the caption datasets) or a
``text`` field (``TextSample``, ``AudioTextSample``). Packing is on by default: give Energon's
``get_train_dataset`` the encoder's ``packing_buffer_size``. Batches are
:class:`task_encoders.documents.TextBatch`. No randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from task_encoders.config import EncoderConfig, PackingConfig
from task_encoders.documents import DocumentTaskEncoder
from task_encoders.registry import register


@dataclass(frozen=True)
class TextEncoderConfig(EncoderConfig):
    encoder: str = "text"
    packing: PackingConfig = field(default_factory=lambda: PackingConfig(enabled=True))


@register("text")
class TextTaskEncoder(DocumentTaskEncoder):
    """``TextTaskEncoder(config=None, *, seed=None, training=True)``: tokenization + packing."""

    config_class = TextEncoderConfig
