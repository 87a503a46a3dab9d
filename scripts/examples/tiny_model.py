"""The tiny captioning model the example loops train: token embedding plus a pooled image feature,
then next-token logits. Small enough to train a step in milliseconds on a CPU. With it, the loss
helpers the loops share: :func:`token_losses` and :func:`batch_losses` (the summed loss, the
target count and each sample's own loss, for ``StepLog``'s ``sample_losses``)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyModel(nn.Module):
    def __init__(self, vocab_size: int, dim: int = 32):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dim)
        self.img = nn.Linear(3 * 4 * 4, dim)  # the image average-pooled to 4x4
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """tokens (N, S), images (N, 3, H, W): one image per row (no packing) → logits (N, S, V)."""
        pooled = F.adaptive_avg_pool2d(images, 4).flatten(1)
        return self.head(self.tok(tokens) + self.img(pooled)[:, None, :])


def token_losses(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(N, S)``: each position's cross-entropy where ``mask``, 0 elsewhere."""
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten().clamp(min=0), reduction="none")
    return (losses * mask.flatten().float()).reshape(targets.shape)


def batch_losses(logits: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Of an unpacked ``task_encoders`` batch (one sample per row, as :class:`TinyModel` takes
    them): (the summed token loss over ``loss_mask``, the number of target tokens, each sample's
    mean loss over its own targets in ``batch.keys`` order: NaN for a sample without targets)."""
    losses = token_losses(logits, batch.labels, batch.loss_mask)
    targets = batch.loss_mask.double().sum(dim=1)
    per_sample = losses.detach().double().sum(dim=1) / targets  # 0/0 is NaN: no targets
    return losses.sum(), targets.sum().float(), per_sample.tolist()
