"""The reference captioning model: small, real, deterministic on CPU.

Each document's media becomes one conditioning vector added to its token embeddings: images
through a patch embedding (``Conv2d`` with stride = patch) mean-pooled over patches, audio log-mel
frames through a linear layer mean-pooled over valid frames, point clouds through a linear layer on
each point (xyz + rgb; xyz-only clouds get zero colour channels) mean-pooled over points. Then a few
pre-norm transformer layers with causal attention *within* each document (packed rows hold several
documents: ``position_ids`` restart at 0 where a document starts) and a next-token LM loss averaged
over ``loss_mask``. Works on every batch type of ``task_encoders`` (text, image-text, audio-text,
packed or not), and on the ``multimodal`` encoder's mixed batches, whose ``image_docs`` /
``audio_docs`` say which document each image or utterance belongs to (text-only documents get no
media vector).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from energon_platform.training.settings import ModelConfig
from task_encoders.multimodal import MultimodalConfig


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


def modality_configs(encoder: Any) -> list:
    """The configs of the encoder's modalities: a ``multimodal`` encoder's, each, else its own."""
    config = encoder.config
    modalities = config.modalities if isinstance(config, MultimodalConfig) else {}
    return list(modalities.values()) or [config]


def media_of(encoder: Any) -> tuple[str, ...]:
    """The media kinds an encoder's batches carry: ``("image",)``, ``("audio",)``, both (a
    ``multimodal`` encoder with image and audio modalities) or ``()`` (text only)."""
    configs = modality_configs(encoder)
    kinds = {"image" for c in configs if getattr(c, "image", None) is not None}
    kinds |= {"audio" for c in configs if getattr(c, "audio", None) is not None}
    kinds |= {"points" for c in configs if getattr(c, "pointcloud", None) is not None}
    return tuple(k for k in ("image", "audio", "points") if k in kinds)


def n_mels_of(encoder: Any) -> int:
    """Mel bins of the encoder's audio features (its audio modality's; 80 without audio)."""
    configs = modality_configs(encoder)
    return next((c.audio.n_mels for c in configs if getattr(c, "audio", None) is not None), 80)


#: Channels of the point-cloud embedding's input: xyz + rgb (``pointcloud_text`` batches, ``points``).
POINT_CHANNELS = 6


class CaptionModel(nn.Module):
    """``media``: the kinds of media the batches carry (`media_of`); only their embeddings
    exist. Mixed batches run each embedding on possibly empty tensors, so every parameter gets a
    gradient every step (DistributedDataParallel requires it)."""

    def __init__(
        self,
        cfg: ModelConfig,
        vocab_size: int,
        seq_len: int,
        media: tuple[str, ...] | str | None = (),
        n_mels: int = 80,
    ):
        super().__init__()
        d = cfg.dim
        media = (media,) if isinstance(media, str) else tuple(media or ())
        self.tokens = nn.Embedding(vocab_size, d)
        self.positions = nn.Embedding(seq_len, d)
        self.patches = (
            nn.Conv2d(3, d, kernel_size=cfg.patch, stride=cfg.patch) if "image" in media else None
        )
        self.audio = nn.Linear(n_mels, d) if "audio" in media else None
        self.points = nn.Linear(POINT_CHANNELS, d) if "points" in media else None
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d, cfg.heads, 4 * d, cfg.dropout, batch_first=True, norm_first=True
            )
            for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def media_vectors(self, batch: Any) -> torch.Tensor | None:
        """float ``(D, dim)``: one conditioning vector per document, or None for text-only batches.
        Single-modality batches have one medium per document; mixed ones place each medium at its
        document (``image_docs``/``audio_docs``) and leave the others zero."""
        parts = []
        if self.patches is not None:
            parts.append(
                (
                    self.patches(batch.images).flatten(2).mean(dim=2),
                    getattr(batch, "image_docs", None),
                )
            )
        if self.audio is not None:
            frames = self.audio(batch.features.transpose(1, 2))  # (N, T, dim)
            lengths = batch.feature_lengths.clamp(min=1)
            valid = (
                torch.arange(frames.shape[1], device=frames.device)[None, :] < lengths[:, None]
            ).float()
            parts.append(
                (
                    (frames * valid[..., None]).sum(1) / lengths[:, None].float(),
                    getattr(batch, "audio_docs", None),
                )
            )
        if self.points is not None:
            clouds = F.pad(batch.points, (0, POINT_CHANNELS - batch.points.shape[-1]))  # (N, P, 6)
            parts.append((self.points(clouds).mean(dim=1), getattr(batch, "cloud_docs", None)))
        if not parts:
            return None
        if len(parts) == 1 and parts[0][1] is None:
            return parts[0][0]
        docs = int(batch.num_docs.sum())
        out = torch.zeros(docs, self.tokens.embedding_dim, device=batch.tokens.device)
        for vectors, where in parts:
            out = out.index_add(0, where.to(out.device), vectors)
        return out

    def forward(self, batch: Any, per_document: bool = False) -> Any:
        """The *summed* LM loss over ``batch.loss_mask`` (float32 scalar). The trainer divides by
        the number of target tokens of the whole global batch, so the objective does not depend on
        how the global batch is split over ranks and micro-batches. ``per_document``: return
        ``(summed loss, per-document mean losses)`` instead (`document_losses`)."""
        pos = batch.position_ids.clamp(max=self.positions.num_embeddings - 1)
        x = self.tokens(batch.tokens) + self.positions(pos)
        media = self.media_vectors(batch)
        if media is not None:
            x = x + media[document_index(batch.position_ids, batch.num_docs)]
        token_loss = lm_token_loss(self, x, batch.position_ids, batch.labels, batch.loss_mask)
        if not per_document:
            return token_loss.sum()
        return token_loss.sum(), document_losses(
            token_loss, batch.loss_mask, batch.position_ids, batch.num_docs
        )


def lm_loss(
    lm: nn.Module,
    x: torch.Tensor,
    position_ids: torch.Tensor,
    labels: torch.Tensor,
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """The summed next-token loss of ``lm``'s ``blocks``, ``norm`` and ``head`` over input
    embeddings ``x`` ``(N, S, dim)`` (the sum of `lm_token_loss`)."""
    return lm_token_loss(lm, x, position_ids, labels, loss_mask).sum()


def document_losses(
    token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    position_ids: torch.Tensor,
    num_docs: torch.Tensor,
) -> torch.Tensor:
    """float64 ``(D,)``, detached: each document's mean loss over its own target positions
    (``token_loss``: `lm_token_loss`'s flat, ``loss_mask``-weighted losses; documents found
    by ``position_ids`` restarting at 0, packed or not); NaN for a document without targets."""
    docs = document_index(position_ids, num_docs).flatten()
    return losses_by_index(token_loss, loss_mask, docs, int(num_docs.sum()))


def losses_by_index(
    token_loss: torch.Tensor, loss_mask: torch.Tensor, index: torch.Tensor, n: int
) -> torch.Tensor:
    """float64 ``(n,)``, detached: for each ``i < n``, the sum of ``token_loss`` (already
    ``loss_mask``-weighted) over the positions whose ``index`` is ``i``, divided by those
    positions' ``loss_mask`` sum; NaN where that sum is 0 (no targets). ``token_loss``,
    ``loss_mask`` and ``index`` (int64) have the same number of elements, in the same order."""
    zeros = torch.zeros(n, dtype=torch.float64, device=token_loss.device)
    index = index.flatten().to(token_loss.device)
    sums = zeros.index_add(0, index, token_loss.detach().flatten().double())
    counts = zeros.index_add(0, index, loss_mask.detach().flatten().double().to(zeros.device))
    return sums / counts  # 0/0 is NaN: no targets


def lm_token_loss(
    lm: nn.Module,
    x: torch.Tensor,
    position_ids: torch.Tensor,
    labels: torch.Tensor,
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """float32 ``(N * S,)``: the next-token loss of ``lm``'s ``blocks``, ``norm`` and ``head`` at
    each position of input embeddings ``x`` ``(N, S, dim)``, weighted by ``loss_mask``: causal
    attention within each document (``position_ids`` restart at 0 where a document starts),
    cross-entropy on ``labels``."""
    blocked = attention_mask(position_ids)
    mask = torch.zeros(blocked.shape, dtype=x.dtype, device=x.device).masked_fill(
        blocked, float("-inf")
    )
    mask = mask.repeat_interleave(lm.blocks[0].self_attn.num_heads, dim=0) if lm.blocks else mask
    for block in lm.blocks:
        x = block(x, src_mask=mask)
    logits = lm.head(lm.norm(x))
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    return loss * loss_mask.flatten()
