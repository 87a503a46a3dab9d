"""What an encoder's batch-reading methods need of a batch: the fields, not the class.

``DocumentTaskEncoder.batch_media_features`` and ``batch_row_lengths`` read a batch of the encoder's
own ``batch_type`` or a ``MultimodalBatch`` holding the same fields (a multimodal encoder hands its
batch to the modality encoder of each kind). These protocols name the fields each override reads,
so a type checker holds both callers to them.
"""

from __future__ import annotations

from typing import Protocol

import torch


class ImageFields(Protocol):
    """``images``: ``(tiles, C, H, W)``, every document's tiles."""

    images: torch.Tensor


class SplicedFields(Protocol):
    """``spliced_lengths``: ``(D,)`` row lengths with the image tokens spliced in."""

    spliced_lengths: torch.Tensor


class AudioFields(Protocol):
    """``feature_lengths``: ``(D,)`` log-mel frames per document."""

    feature_lengths: torch.Tensor


class PointFields(Protocol):
    """``points``: ``(clouds, points, channels)``."""

    points: torch.Tensor


class VideoFields(Protocol):
    """``num_frames`` and ``audio_lengths``: ``(D,)`` real frames and audio frames per document."""

    num_frames: torch.Tensor
    audio_lengths: torch.Tensor
