"""The reference captioning model: small, real, deterministic on CPU.

Each document's media becomes one conditioning vector added to its token embeddings: images
through a patch embedding (``Conv2d`` with stride = patch) mean-pooled over patches, audio log-mel
frames through a linear layer mean-pooled over valid frames. Then a few pre-norm transformer
layers with causal attention *within* each document (packed rows hold several documents:
``position_ids`` restart at 0 where a document starts) and a next-token LM loss averaged over
``loss_mask``. Works on every batch type of ``task_encoders`` (text, image-text, audio-text,
packed or not).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from energon_platform.config import ModelConfig


def document_index(position_ids: torch.Tensor, num_docs: torch.Tensor) -> torch.Tensor:
    """int64 ``(N, S)``: global index (over the batch) of the document each token belongs to."""
    segment = (position_ids == 0).long().cumsum(dim=1) - 1
    row_offset = torch.cumsum(num_docs.long(), 0) - num_docs.long()
    return segment.clamp(min=0) + row_offset[:, None]


def attention_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """bool ``(N, S, S)``, True where attention is *blocked*: other documents and the future."""
    segment = (position_ids == 0).long().cumsum(dim=1)
    same_doc = segment[:, :, None] == segment[:, None, :]
    s = position_ids.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=position_ids.device).tril()
    return ~(same_doc & causal)


class CaptionModel(nn.Module):
    """``media``: "image", "audio" or None (text only); only that modality's embedding exists, so
    every parameter gets a gradient (DistributedDataParallel requires it)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, seq_len: int, media: str | None = None, n_mels: int = 80):
        super().__init__()
        d = cfg.dim
        self.tokens = nn.Embedding(vocab_size, d)
        self.positions = nn.Embedding(seq_len, d)
        self.patches = nn.Conv2d(3, d, kernel_size=cfg.patch, stride=cfg.patch) if media == "image" else None
        self.audio = nn.Linear(n_mels, d) if media == "audio" else None
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, cfg.heads, 4 * d, cfg.dropout, batch_first=True, norm_first=True)
            for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def media_vectors(self, batch: Any) -> torch.Tensor | None:
        """float ``(D, dim)``: one conditioning vector per document, or None for text-only batches."""
        if self.patches is not None:
            return self.patches(batch.images).flatten(2).mean(dim=2)
        if self.audio is not None:
            frames = self.audio(batch.features.transpose(1, 2))  # (D, T, dim)
            lengths = batch.feature_lengths.clamp(min=1)
            valid = (torch.arange(frames.shape[1], device=frames.device)[None, :] < lengths[:, None]).float()
            return (frames * valid[..., None]).sum(1) / lengths[:, None].float()
        return None

    def forward(self, batch: Any) -> torch.Tensor:
        """The *summed* LM loss over ``batch.loss_mask`` (float32 scalar). The trainer divides by
        the number of target tokens of the whole global batch, so the objective does not depend on
        how the global batch is split over ranks and micro-batches."""
        pos = batch.position_ids.clamp(max=self.positions.num_embeddings - 1)
        x = self.tokens(batch.tokens) + self.positions(pos)
        media = self.media_vectors(batch)
        if media is not None:
            x = x + media[document_index(batch.position_ids, batch.num_docs)]
        blocked = attention_mask(batch.position_ids)
        mask = torch.zeros(blocked.shape, dtype=x.dtype, device=x.device).masked_fill(blocked, float("-inf"))
        mask = mask.repeat_interleave(self.blocks[0].self_attn.num_heads, dim=0) if self.blocks else mask
        for block in self.blocks:
            x = block(x, src_mask=mask)
        logits = self.head(self.norm(x))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten(), reduction="none")
        return (loss * batch.loss_mask.flatten()).sum()
