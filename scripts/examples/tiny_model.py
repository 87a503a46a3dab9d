"""The tiny captioning model both example loops train: token embedding plus a pooled image feature,
then next-token logits. Small enough to train a step in milliseconds on a CPU."""

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


def loss_sums(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the token losses where ``mask``, number of those tokens)."""
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten().clamp(min=0), reduction="none")
    mask = mask.flatten().float()
    return (losses * mask).sum(), mask.sum()
