"""The two-tower reference model (``model.kind: two_tower``): media encoders feeding a language model.

* **Vision tower**: a small ViT, run once per image tile: a patch embedding (``Conv2d`` with stride =
  patch), fixed sinusoidal patch positions and ``vision_layers`` transformer blocks.
  Vision-language batches (``num_tiles``, ``image_token_index``): each tile's patch embeddings are
  pooled to the batch's ``tokens_per_tile`` embeddings and spliced into the language model's
  sequence where the image's placeholder token is (``tiles * tokens_per_tile`` positions replace one
  placeholder, as megatron-core's ``LLaVAModel`` does); the spliced positions carry no loss, and a
  row is cut back to its ``S`` columns (only padding is dropped: the encoder bounds every spliced
  length by ``seq_len``). Plain image-text batches: the ViT's mean patch embedding conditions its
  document's tokens, as in `model`.
* **Audio tower**: log-mel frames through a strided ``Conv1d`` and ``audio_layers`` transformer
  blocks (padded frames masked), mean-pooled over valid frames into one conditioning vector per
  document.
* **Language model**: token + position embeddings, ``layers`` pre-norm blocks with causal attention
  within each document and the summed next-token loss
  (`lm_loss`).

Mixed (``multimodal``) batches place each medium at its document (``image_docs``/``audio_docs``);
every tower runs even on empty inputs, so every parameter gets a gradient each step.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from energon_platform.training.model import (
    CaptionModel,
    document_index,
    document_losses,
    lm_token_loss,
    media_of,
    n_mels_of,
)
from energon_platform.training.settings import ModelConfig


def build_model(cfg: ModelConfig, encoder: Any) -> nn.Module:
    """The reference model ``cfg.kind`` names, sized for ``encoder``'s tokenizer and media."""
    tok = encoder.tokenizer
    model = TwoTowerModel if cfg.kind == "two_tower" else CaptionModel
    return model(cfg, tok.vocab_size, tok.seq_len, media_of(encoder), n_mels_of(encoder))


def sinusoid(length: int, dim: int, device: torch.device) -> torch.Tensor:
    """float ``(length, dim)``: fixed sine/cosine positions (any number of patches or frames)."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    freq = torch.exp(
        torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(1e4) / dim)
    )
    out = torch.zeros(length, dim, device=device)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return out


def blocks(dim: int, heads: int, layers: int, dropout: float) -> nn.ModuleList:
    """``layers`` pre-norm transformer blocks of width ``dim``."""
    return nn.ModuleList(
        nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout, batch_first=True, norm_first=True)
        for _ in range(layers)
    )


class VisionTower(nn.Module):
    """A small ViT: ``forward(images (T, 3, h, w))`` → patch embeddings ``(T, P, out_dim)``."""

    def __init__(self, cfg: ModelConfig, out_dim: int):
        super().__init__()
        self.patches = nn.Conv2d(3, cfg.vision_dim, kernel_size=cfg.patch, stride=cfg.patch)
        self.blocks = blocks(cfg.vision_dim, cfg.vision_heads, cfg.vision_layers, cfg.dropout)
        self.norm = nn.LayerNorm(cfg.vision_dim)
        self.out = nn.Linear(cfg.vision_dim, out_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patches(images).flatten(2).transpose(1, 2)  # (T, P, vision_dim)
        x = x + sinusoid(x.shape[1], x.shape[2], x.device)
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


class AudioTower(nn.Module):
    """Conv + transformer over log-mel frames: ``forward(features (U, n_mels, T), lengths (U,))``
    → one vector per utterance ``(U, out_dim)``, the mean over its valid (downsampled) frames.
    A batch without utterances (``U = 0``: a mixed micro-batch of other media) runs the tower on
    one zero frame and returns ``(0, out_dim)``, so its parameters still take part (zero gradient)."""

    def __init__(self, cfg: ModelConfig, n_mels: int, out_dim: int):
        super().__init__()
        self.conv = nn.Conv1d(n_mels, cfg.audio_dim, kernel_size=3, stride=2, padding=1)
        self.blocks = blocks(cfg.audio_dim, cfg.audio_heads, cfg.audio_layers, cfg.dropout)
        self.norm = nn.LayerNorm(cfg.audio_dim)
        self.out = nn.Linear(cfg.audio_dim, out_dim)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if features.shape[0] == 0:
            empty = features.new_zeros(1, features.shape[1], 1)
            return self(empty, lengths.new_ones(1))[:0]
        x = F.gelu(self.conv(features)).transpose(1, 2)  # (U, T', audio_dim)
        x = x + sinusoid(x.shape[1], x.shape[2], x.device)
        valid_len = ((lengths.clamp(min=1) + 1) // 2).clamp(max=x.shape[1])  # the stride-2 frames
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < valid_len[:, None]
        for block in self.blocks:
            x = block(x, src_key_padding_mask=~valid)
        x = self.out(self.norm(x)) * valid[..., None]
        return x.sum(1) / valid_len[:, None].float()


class TwoTowerModel(nn.Module):
    """``media``: the kinds of media the batches carry (``image``, ``audio``; point clouds are
    refused: this model has no tower for them). ``forward(batch)``: the summed LM loss over
    ``batch.loss_mask``, as `CaptionModel`'s."""

    def __init__(
        self,
        cfg: ModelConfig,
        vocab_size: int,
        seq_len: int,
        media: tuple[str, ...] | str | None = (),
        n_mels: int = 80,
    ):
        super().__init__()
        media = (media,) if isinstance(media, str) else tuple(media or ())
        if "points" in media:
            raise ValueError("model.kind two_tower has no point-cloud tower; use model.kind tiny")
        d = cfg.dim
        self.tokens = nn.Embedding(vocab_size, d)
        self.positions = nn.Embedding(seq_len, d)
        self.vision = VisionTower(cfg, d) if "image" in media else None
        self.audio = AudioTower(cfg, n_mels, d) if "audio" in media else None
        self.blocks = blocks(d, cfg.heads, cfg.layers, cfg.dropout)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab_size, bias=False)

    def conditioning(self, batch: Any) -> torch.Tensor | None:
        """float ``(D, dim)``: one vector per document from plain images and audio (documents
        without either get zero), or None when the batch has neither."""
        parts = []
        if self.vision is not None and not spliced(batch):
            parts.append(
                (self.vision(batch.images).mean(dim=1), getattr(batch, "image_docs", None))
            )
        if self.audio is not None:
            vectors = self.audio(batch.features, batch.feature_lengths)
            parts.append((vectors, getattr(batch, "audio_docs", None)))
        if not parts:
            return None
        out = torch.zeros(
            int(batch.num_docs.sum()), self.head.in_features, device=batch.tokens.device
        )
        for vectors, where in parts:
            docs = torch.arange(len(vectors)) if where is None else where
            out = out.index_add(0, docs.to(out.device), vectors)
        return out

    def forward(self, batch: Any, per_document: bool = False) -> Any:
        """The summed LM loss, or with ``per_document`` ``(summed loss, per-document mean losses)``,
        as `CaptionModel.forward`."""
        if self.vision is not None and spliced(batch):
            x, position_ids, labels, loss_mask = self.splice(batch)
        else:
            x = self.tokens(batch.tokens)
            position_ids, labels, loss_mask = batch.position_ids, batch.labels, batch.loss_mask
        media = self.conditioning(batch)
        if media is not None:
            x = x + media[document_index(position_ids, batch.num_docs)]
        pos = position_ids.clamp(max=self.positions.num_embeddings - 1)
        token_loss = lm_token_loss(self, x + self.positions(pos), position_ids, labels, loss_mask)
        if not per_document:
            return token_loss.sum()
        return token_loss.sum(), document_losses(
            token_loss, loss_mask, position_ids, batch.num_docs
        )

    def splice(self, batch: Any) -> tuple[torch.Tensor, ...]:
        """Token embeddings with every image placeholder replaced by its tiles' ViT embeddings:
        ``(x, position_ids, labels, loss_mask)``, each ``(N, S, ...)`` (module doc)."""
        per_tile = int(batch.tokens_per_tile)
        tiles = self.vision(batch.images)  # (T, P, dim)
        tiles = F.adaptive_avg_pool1d(tiles.transpose(1, 2), per_tile).transpose(1, 2)
        is_image = batch.tokens == batch.image_token_index
        counts = torch.ones_like(batch.tokens)
        counts[is_image] = batch.num_tiles.to(counts.device).long() * per_tile
        rows = [
            _spliced_row(self.tokens(t), pid, lab, lm, img, c)
            for t, pid, lab, lm, img, c in zip(
                batch.tokens, batch.position_ids, batch.labels, batch.loss_mask, is_image, counts
            )
        ]
        vision = tiles.reshape(-1, tiles.shape[-1])
        xs, used = [], 0
        for x, from_image in (r[0] for r in rows):
            n = int(from_image.sum())
            xs.append(x.masked_scatter(from_image[:, None], vision[used : used + n]))
            used += n
        return (torch.stack(xs),) + tuple(torch.stack([r[i] for r in rows]) for i in (1, 2, 3))


def spliced(batch: Any) -> bool:
    """Whether a batch's images replace placeholders (a vision-language batch) rather than
    condition their documents."""
    return getattr(batch, "num_tiles", None) is not None


def _spliced_row(emb, position_ids, labels, loss_mask, is_image, counts) -> tuple:
    """One row expanded by ``counts`` (1 per token, tiles x tokens_per_tile per placeholder), cut to
    its ``S`` columns: ``((x, from_image), position_ids, labels, loss_mask)``; image positions of
    ``x`` are zero (filled by the caller), carry no loss and continue their document's positions."""
    s = emb.shape[0]
    src = torch.repeat_interleave(torch.arange(s, device=emb.device), counts)[:s]
    first = torch.ones_like(src, dtype=torch.bool)
    first[1:] = src[1:] != src[:-1]
    from_image = is_image[src]
    starts = torch.where((position_ids[src] == 0) & first, torch.arange(s, device=emb.device), 0)
    positions = torch.arange(s, device=emb.device) - torch.cummax(starts, 0).values
    x = emb[src] * (~from_image)[:, None]
    return (x, from_image), positions, labels[src], loss_mask[src] * (~from_image)
