"""The tiny captioning model the example loops train: token embedding plus a pooled image feature,
then next-token logits. Small enough to train a step in milliseconds on a CPU. With it, the loss
helpers the loops share: :func:`token_losses` and :func:`batch_losses` (the summed loss, the
target count and each sample's own loss, for ``StepLog``'s ``sample_losses``), and
:func:`row_images`, :func:`batch_tensors` and :func:`row_tensors` for mixed-modality batches (the ``multimodal``
encoder's ``MultimodalBatch``: images only for its image documents, audio features apart)."""

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


def row_images(batch) -> torch.Tensor:
    """``(N, 3, H, W)``, one image per row as :class:`TinyModel` takes them: ``batch.images``
    itself for an image-text batch; for a ``MultimodalBatch`` (unpacked: one document per row)
    each image document's image in its row and zeros in the rows of the other modalities (the
    tiny model reads their text alone)."""
    images = batch.images
    if not hasattr(batch, "num_images"):
        return images
    rows = batch.tokens.shape[0]
    if images.shape[-1] == 0 or images.shape[-2] == 0:  # no image modality configured
        return images.new_zeros((rows, 3, 4, 4))
    out = images.new_zeros((rows, *images.shape[1:]))
    out[batch.image_docs] = images
    return out


def batch_tensors(batch) -> list[torch.Tensor]:
    """The tensors of a batch that its digest covers (``batch_digest``): text fields and images,
    and a ``MultimodalBatch``'s audio features with their lengths."""
    tensors = [batch.tokens, batch.labels, batch.loss_mask, batch.images]
    if hasattr(batch, "features"):
        tensors += [batch.features, batch.feature_lengths]
    return tensors


def row_tensors(batch, row: int) -> list[torch.Tensor]:
    """The tensors of one row (document) of an unpacked batch, for a row digest that does not
    depend on how the global batch was split over ranks: its text fields and image (zeros for a
    ``MultimodalBatch`` row without one) and, for a ``MultimodalBatch``, its audio features cut to
    their valid frames (the batch pads them to its longest)."""
    tensors = [t[row] for t in (batch.tokens, batch.labels, batch.loss_mask, row_images(batch))]
    if hasattr(batch, "features"):
        for j in (batch.audio_docs == row).nonzero().flatten().tolist():
            tensors.append(batch.features[j, :, : int(batch.feature_lengths[j])])
    return tensors
