"""Token sequences for next-token training: choosing packs, laying out rows, collating rows.

Conventions (shared by every batch type here, Megatron-LM GPT style):

* A *document* is ``[BOS, t1, ..., tk, EOS]`` (int64). A *row* holds one or more documents back to
  back and is padded with ``pad_id`` to ``seq_len``.
* ``labels[t] = tokens[t + 1]`` inside a document; ``loss_mask[t] = 1.0`` exactly there. A
  document's last token (whose next token would be the next document's BOS) and padding have
  ``labels = pad_id`` and ``loss_mask = 0.0``: a document of ``L`` tokens has ``L - 1`` targets.
* Attention segments: one per document, in order; a row's padding is appended to its last document's
  segment (causal attention keeps the real tokens of that document unaffected, and the padding is
  loss-masked). So ``cu_seqlens`` (int32, ``(D + 1,)`` over the flattened ``N * S`` tokens) has
  exactly one segment per document and ``cu_seqlens[-1] == N * S``; ``position_ids`` restart at 0
  at every segment start; ``doc_lengths`` (int32, ``(D,)``) are the real, unpadded lengths.
* With a segment ``multiple`` (context parallelism over ``N`` ranks needs ``2N``): every document's
  segment is its length rounded up to a multiple of it (`padded_length`), the padding
  loss-masked after the document; the row's last segment takes the rest of the row, so with
  ``seq_len`` a multiple too, every segment is one (what TransformerEngine's ``cu_seqlens_padded``
  asks for).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def first_fit_decreasing(
    lengths: Sequence[int], keys: Sequence[str], capacity: int, max_docs: int | None = None
) -> list[list[int]]:
    """Group item indices into packs of total length ``<= capacity`` (first-fit decreasing).

    Deterministic: items are placed longest first, ties broken by key, so the result depends only on
    the multiset of (length, key). Each pack lists indices in placement order; every index appears
    exactly once. An item longer than ``capacity`` raises ``ValueError``.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], keys[i]))
    packs: list[list[int]] = []
    free: list[int] = []
    for i in order:
        if lengths[i] > capacity:
            raise ValueError(f"item {keys[i]!r} has {lengths[i]} tokens, more than {capacity}")
        for p, room in enumerate(free):
            if lengths[i] <= room and (max_docs is None or len(packs[p]) < max_docs):
                packs[p].append(i)
                free[p] -= lengths[i]
                break
        else:
            packs.append([i])
            free.append(capacity - lengths[i])
    return packs


def padded_length(length: int, multiple: int = 1) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (the positions a document's segment
    takes in a row laid out with that segment multiple)."""
    return -(-length // multiple) * multiple


def layout_row(
    docs: Sequence[torch.Tensor], seq_len: int, pad_id: int, multiple: int = 1
) -> dict[str, torch.Tensor]:
    """One row from documents (int64 ``(L_i,)``, their `padded_length` summing to at most
    ``seq_len``), each segment a multiple of ``multiple`` but the last (module conventions).

    Returns ``tokens``, ``labels`` (int64 ``(S,)``), ``loss_mask`` (float32 ``(S,)``),
    ``position_ids`` (int64 ``(S,)``) and ``doc_lengths`` (int32 ``(D,)``), per the module conventions.
    """
    lengths = [int(d.numel()) for d in docs]
    slots = [padded_length(n, multiple) for n in lengths]
    if not docs or sum(slots) > seq_len or min(lengths) < 1:
        raise ValueError(f"cannot lay out documents of lengths {lengths} in a row of {seq_len}")
    tokens = torch.full((seq_len,), pad_id, dtype=torch.int64)
    labels = torch.full((seq_len,), pad_id, dtype=torch.int64)
    loss_mask = torch.zeros(seq_len, dtype=torch.float32)
    start = 0
    for doc, length, slot in zip(docs, lengths, slots):
        tokens[start : start + length] = doc
        labels[start : start + length - 1] = doc[1:]
        loss_mask[start : start + length - 1] = 1.0
        start += slot
    segments = slots[:-1] + [seq_len - sum(slots[:-1])]
    position_ids = torch.cat([torch.arange(n, dtype=torch.int64) for n in segments])
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "doc_lengths": torch.tensor(lengths, dtype=torch.int32),
    }


def collate_rows(rows: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor | int]:
    """Stack rows from `layout_row` into a batch.

    Returns ``tokens``, ``labels``, ``position_ids`` (int64 ``(N, S)``), ``loss_mask`` (float32
    ``(N, S)``), ``cu_seqlens`` (int32 ``(D + 1,)``), ``max_seqlen`` (int, longest segment),
    ``num_docs`` (int32 ``(N,)``) and ``doc_lengths`` (int32 ``(D,)``).
    """
    segments = [n for row in rows for n in row_segments(row["position_ids"])]
    cu_seqlens = torch.zeros(len(segments) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(torch.tensor(segments, dtype=torch.int64), 0).to(torch.int32)
    out: dict[str, torch.Tensor | int] = {
        name: torch.stack([row[name] for row in rows])
        for name in ("tokens", "labels", "loss_mask", "position_ids")
    }
    out.update(
        cu_seqlens=cu_seqlens,
        max_seqlen=max(segments),
        num_docs=torch.tensor([row["doc_lengths"].numel() for row in rows], dtype=torch.int32),
        doc_lengths=torch.cat([row["doc_lengths"] for row in rows]),
    )
    return out


def row_segments(position_ids: torch.Tensor) -> list[int]:
    """The attention segments' lengths of a row, from its ``position_ids`` (0 at each start)."""
    starts = (position_ids == 0).nonzero().flatten().tolist() + [int(position_ids.numel())]
    return [b - a for a, b in zip(starts, starts[1:])]


def pad_stack(
    tensors: Sequence[torch.Tensor], pad_value: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack tensors that differ only in their last dimension, padding it at the end.

    Returns the stacked ``(N, *shape[:-1], T_max)`` tensor and int64 ``(N,)`` lengths.
    """
    lengths = torch.tensor([t.shape[-1] for t in tensors], dtype=torch.int64)
    out = tensors[0].new_full((len(tensors), *tensors[0].shape[:-1], int(lengths.max())), pad_value)
    for i, t in enumerate(tensors):
        out[i, ..., : t.shape[-1]] = t
    return out, lengths
