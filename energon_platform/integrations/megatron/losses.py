"""Per-sample losses of a Megatron micro-batch
([`sample_losses`][energon_platform.integrations.megatron.losses.sample_losses]): what a Megatron
loop logs with ``StepLog.write(..., keys=..., sample_losses=...)`` so that
``energon-platform spikes`` can rank a spike's samples, and what online mixing
(``loader.blend_adapt``) takes: pass them to `MegatronTrainIterator.report_losses` for every
training micro-batch, on every data-parallel rank
(``group=parallel_state.get_data_parallel_group()``).
"""

from __future__ import annotations

import torch

from energon_platform.integrations.megatron.batches import IGNORE_INDEX
from energon_platform.training.model import losses_by_index


def sample_losses(
    batch: dict, token_loss: torch.Tensor, loss_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """float64 ``(D,)``, detached: each document's mean loss over its own target positions, in
    the micro-batch's document order (the order of ``batch["__key__"]``, or of the iterator's
    ``last_keys`` for the ``gpt`` format); NaN for a document without targets.

    ``batch``: a `to_megatron_batch` dict. ``token_loss``: the loss at each target position,
    unreduced, as Megatron's ``loss_func`` gets it (``output_tensor``): the shape of the
    ``labels`` Megatron's ``get_batch`` returns: ``(N, S)`` (multimodal: after its shift,
    ``labels[:, 1:]``; one ``(1, N*S)`` row when packed), or ``(N, S)`` for ``gpt``.
    ``loss_mask``: the same shape; None derives it from the batch (``labels != IGNORE_INDEX``
    for multimodal, ``batch["loss_mask"]`` for gpt); pass ``LLaVAModel``'s own mask for a
    vision-language batch, whose spliced positions differ from the tokens'.

    Documents: a packed multimodal row is split by ``cu_lengths``, a ``gpt`` row by its
    ``cu_seqlens``; an unpacked multimodal row is one document. ``ValueError`` (one line) when
    ``token_loss`` or ``loss_mask`` does not fit the batch."""
    if loss_mask is None:
        loss_mask = _default_loss_mask(batch, token_loss)
    if loss_mask.shape != token_loss.shape or token_loss.ndim != 2:
        raise ValueError(
            f"sample_losses: token_loss {tuple(token_loss.shape)} and loss_mask "
            f"{tuple(loss_mask.shape)} must be the same (rows, positions) shape"
        )
    index, n = _document_index(batch, token_loss.shape)
    weighted = torch.where(loss_mask != 0, token_loss * loss_mask, torch.zeros_like(token_loss))
    return losses_by_index(weighted, loss_mask, index, n)


def _default_loss_mask(batch: dict, token_loss: torch.Tensor) -> torch.Tensor:
    """The loss mask Megatron's ``get_batch`` derives, shaped like ``token_loss``."""
    if "loss_mask" in batch:  # gpt
        return batch["loss_mask"]
    labels = batch["labels"][:, 1:]
    if labels.shape != token_loss.shape:
        raise ValueError(
            f"sample_losses: token_loss {tuple(token_loss.shape)} is not the shape of the "
            f"batch's shifted labels {tuple(labels.shape)}; pass the model's loss_mask"
        )
    return (labels != IGNORE_INDEX).float()


def _document_index(batch: dict, shape: torch.Size) -> tuple[torch.Tensor, int]:
    """int64 ``shape``: the document of each position; and the number of documents."""
    rows, width = shape
    if "cu_seqlens" in batch:  # gpt: each row's boundaries, padded with copies of S
        bounds = batch["cu_seqlens"].to(torch.int64)
        if tuple(bounds.shape) != (rows, width + 1):
            raise ValueError(
                f"sample_losses: cu_seqlens {tuple(bounds.shape)} does not fit token_loss "
                f"{tuple(shape)}; expected ({rows}, {width + 1})"
            )
        per_row = (bounds[:, 1:] > bounds[:, :-1]).sum(dim=1)  # the row's segments
        inside = _segment_of(bounds, width)
        offset = torch.cumsum(per_row, 0) - per_row
        return inside + offset[:, None], int(per_row.sum())
    cu = batch["cu_lengths"].to(torch.int64)
    if cu.shape == (1, 1):  # unpacked: one document per row
        return torch.arange(rows)[:, None].expand(rows, width), rows
    if rows != 1 or int(cu[0, -1]) != width:
        raise ValueError(
            f"sample_losses: cu_lengths ends at {int(cu[0, -1])}, but token_loss is "
            f"{tuple(shape)}; expected one row of {int(cu[0, -1])} positions"
        )
    return _segment_of(cu, width), cu.shape[1] - 1


def _segment_of(bounds: torch.Tensor, width: int) -> torch.Tensor:
    """int64 ``(rows, width)``: for each position, the index of the segment of its row's
    ``bounds`` (ascending, starting at 0 and ending at ``width``) that holds it."""
    positions = torch.arange(width).expand(bounds.shape[0], width).contiguous()
    return torch.searchsorted(bounds[:, 1:].contiguous(), positions, right=True)
