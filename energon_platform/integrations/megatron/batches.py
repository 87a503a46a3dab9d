"""One ``task_encoders`` micro-batch → the dict Megatron-LM's ``get_batch`` reads
([`to_megatron_batch`][energon_platform.integrations.megatron.batches.to_megatron_batch]), in the
``multimodal`` or the ``gpt`` format.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

#: Megatron's ``IGNORE_INDEX`` (``megatron/core/models/multimodal/llava_model.py``): a label that is no target.
IGNORE_INDEX = -100
BATCH_FORMATS = ("multimodal", "gpt")
BatchFormat = Literal["multimodal", "gpt"]

#: The fields every ``task_encoders`` batch has (`task_encoders.documents.TextBatch`).
_TEXT_FIELDS = (
    "keys",
    "tokens",
    "labels",
    "loss_mask",
    "position_ids",
    "cu_seqlens",
    "max_seqlen",
    "num_docs",
    "doc_lengths",
)
#: Tensor fields of a vision-language batch that travel as ``imgs``/``num_tiles`` (or only describe them).
_VISION_FIELDS = {"images", "num_tiles", "num_images", "spliced_lengths"}


def _absent(dtype: torch.dtype) -> torch.Tensor:
    """Megatron's "absent" marker: a ``[[0]]`` tensor (shape ``(1, 1)``)."""
    return torch.zeros((1, 1), dtype=dtype)


def to_megatron_batch(
    batch: Any, format: BatchFormat = "multimodal", *, packed: bool | None = None
) -> dict:
    """One ``task_encoders`` micro-batch (``TextBatch``/``ImageTextBatch``) → the dict Megatron's
    ``get_batch`` reads. ``N`` rows of ``S`` tokens holding ``D`` documents; ``IGNORE_INDEX = -100``.

    ``format="multimodal"`` (``examples/multimodal/train.py`` ``get_batch``, which
    broadcasts each key with ``broadcast_data`` with the dtype given here and checks it):

    * ``tokens``: int64 ``(N, S)``, our ``tokens``.
    * ``labels``: int64 ``(N, S + 1)``. Megatron's multimodal batches carry targets *aligned with
      the tokens* plus one extra column, and ``get_batch`` shifts them itself
      (``labels[:, 1:S + 1]``). Ours are already next-token targets (``labels[t] = tokens[t + 1]``),
      so column 0 is ``IGNORE_INDEX`` and columns ``1..S`` are our ``labels`` where ``loss_mask``
      is 1 and ``IGNORE_INDEX`` elsewhere. After Megatron's shift the targets are exactly ours, and
      the loss mask its ``get_ltor_masks_and_position_ids`` derives (0 where the label is pad or
      ``IGNORE_INDEX``) is exactly our ``loss_mask`` (real targets are never the pad id, as long as
      Megatron runs with the same tokenizer). Megatron builds its own ``position_ids``
      (``arange(S)``) and ignores ours; for unpacked rows they are the same.
    * ``imgs``: float32 ``(tiles, C, H, W)``: our ``images``, one tile per image, in document
      order; ``[[0]]`` when the batch has no images (text-only). Vision-language batches
      (``num_tiles`` present): every tile of every image, images in document order.
    * ``num_tiles``: int32 ``(D,)``, all ones (vision-language: the batch's ``num_tiles``, one per
      image, matching the ``<image>`` placeholders in ``tokens``); ``[[0]]`` when there are no images.
    * ``cu_lengths``: int32 ``(1, D + 1)`` and ``max_lengths``: int32 ``(1,)`` for packed batches;
      ``[[0]]`` each without packing. Megatron's packed multimodal path requires one (packed)
      sequence per micro-batch (``"micro-batch-size must be 1 for packing"``), so a packed
      micro-batch of ``N`` rows is flattened into one row: ``tokens`` ``(1, N*S)``, ``labels``
      ``(1, N*S + 1)``, ``cu_lengths`` our ``cu_seqlens`` (one segment per document; a row's
      padding belongs to its last document), ``max_lengths`` our ``max_seqlen`` (as Megatron's
      ``flatten_batch_for_packed_sequences`` does for GPT batches). The lengths count text
      tokens for text batches. Vision-language batches count what the language model sees after
      ``LLaVAModel`` splices the image embeddings in, as Megatron's task encoder's ``total_len``
      does: each document's segment is its ``spliced_lengths`` entry, and each row is cut to
      ``S - (tiles * tokens_per_tile - images)`` tokens (dropping only padding), so every row is
      exactly ``S`` positions after splicing and ``cu_lengths`` ends at ``N * S``.
    * Vision-language, unpacked: the token width is cut to ``S`` minus the smallest row's image
      surplus (padding only), so with one row per micro-batch the spliced row is exactly ``S``
      positions; with several rows ``LLaVAModel`` pads them to the longest, and its cut to
      ``--decoder-seq-length`` (= ``S``) can only drop padding, since every document's spliced
      length is at most ``S``.
    * ``__key__``: list of the ``D`` sample keys in document order (Megatron's own batch dicts
      carry ``__key__`` as well; ``get_batch`` never broadcasts it).

    ``format="gpt"`` (``pretrain_gpt.py`` ``get_batch`` → ``get_batch_on_this_tp_rank`` →
    ``flatten_batch_for_packed_sequences``; the layout of ``megatron/training/datasets/sft_dataset.py``):

    * ``tokens``, ``labels`` (next-token targets, pad where masked): int64 ``(N, S)``;
      ``loss_mask``: float32 ``(N, S)``; ``position_ids``: int64 ``(N, S)``, restarting at every
      document (the row's padding continues its last document).
    * ``cu_seqlens``: int32 ``(N, S + 1)``, each row's document boundaries ``0 … S`` padded with
      copies of ``S`` (Megatron strips the padding and merges the rows); ``max_seqlen``: int32
      ``(N,)``, each row's longest segment. Megatron reads these with ``--sft`` or
      ``--dataloader-inter-document-masking``; without packing each row is one segment ``[0, S]``.
    * ``attention_mask`` is absent (Megatron then uses ``None``: causal masking in the kernel).
    * Text only: media fields are not part of GPT's contract and are not in the dict; nor are
      sample keys (Megatron's context-parallel split reshapes every non-metadata entry), see
      `MegatronTrainIterator.last_keys`.

    ``packed``: None decides per batch (any row with more than one document); the provider passes
    the loader's setting so every micro-batch of a run has the same layout. ``packed=False`` with
    several documents in a row raises ``ValueError`` (Megatron would attend across documents).
    Batches with media other than images (audio ``features``…) raise ``ValueError`` for
    ``"multimodal"``: Megatron's multimodal ``get_batch`` has no input for them.
    """
    if format not in BATCH_FORMATS:
        raise ValueError(f"batch format {format!r}: expected one of {BATCH_FORMATS}")
    missing = [f for f in _TEXT_FIELDS if not hasattr(batch, f)]
    if missing:
        raise TypeError(f"{type(batch).__name__} is not a task_encoders batch (missing {missing})")
    tokens, labels, loss_mask = batch.tokens, batch.labels, batch.loss_mask
    if tokens.ndim != 2 or labels.shape != tokens.shape or loss_mask.shape != tokens.shape:
        raise ValueError(
            f"tokens/labels/loss_mask must be (N, S) alike, got {tuple(tokens.shape)}, "
            f"{tuple(labels.shape)}, {tuple(loss_mask.shape)}"
        )
    multi_doc = bool((batch.num_docs > 1).any())
    if packed is None:
        packed = multi_doc
    elif not packed and multi_doc:
        raise ValueError(
            "packed=False, but rows of this batch hold several documents; without cu_lengths/"
            "cu_seqlens Megatron would attend across them"
        )
    if format == "gpt":
        return _gpt_batch(batch)
    return _multimodal_batch(batch, packed)


def _multimodal_batch(batch: Any, packed: bool) -> dict:
    if getattr(batch, "num_tiles", None) is not None:
        return _vision_language_batch(batch, packed)
    tokens = batch.tokens.to(torch.int64)
    ignore = torch.tensor(IGNORE_INDEX, dtype=torch.int64)
    targets = torch.where(batch.loss_mask > 0, batch.labels.to(torch.int64), ignore)
    rows, seq_len = tokens.shape
    if packed:
        tokens, targets = tokens.reshape(1, rows * seq_len), targets.reshape(1, rows * seq_len)
        cu_lengths = batch.cu_seqlens.to(torch.int32).reshape(1, -1).clone()
        if int(cu_lengths[0, -1]) != rows * seq_len:
            raise ValueError(
                f"cu_seqlens ends at {int(cu_lengths[0, -1])}, not at N*S = {rows * seq_len}"
            )
        max_lengths = torch.tensor([int(batch.max_seqlen)], dtype=torch.int32)
    else:
        cu_lengths, max_lengths = _absent(torch.int32), _absent(torch.int32)
    labels = torch.cat(
        [torch.full((tokens.shape[0], 1), IGNORE_INDEX, dtype=torch.int64), targets], dim=1
    )
    others = _media_fields(batch) - {"images"}
    if others:
        raise ValueError(
            f"Megatron's multimodal get_batch has no input for {sorted(others)}; "
            f"only images (imgs/num_tiles) travel in this format"
        )
    images = getattr(batch, "images", None)
    if isinstance(images, torch.Tensor) and images.numel() > 0:
        if images.ndim != 4 or images.shape[0] != len(batch.keys):
            raise ValueError(
                f"images must be (D, C, H, W) with one image per document, got {tuple(images.shape)}"
            )
        imgs = images.to(torch.float32).contiguous()
        num_tiles = torch.ones(images.shape[0], dtype=torch.int32)
    else:
        imgs, num_tiles = _absent(torch.float32), _absent(torch.int32)
    return {
        "tokens": tokens.contiguous(),
        "labels": labels,
        "imgs": imgs,
        "num_tiles": num_tiles,
        "cu_lengths": cu_lengths,
        "max_lengths": max_lengths,
        "__key__": list(batch.keys),
    }


def _vision_language_batch(batch: Any, packed: bool) -> dict:
    """[`to_megatron_batch`][energon_platform.integrations.megatron.batches.to_megatron_batch] of a
    `task_encoders.vision_language.VisionLanguageBatch`."""
    tokens = batch.tokens.to(torch.int64)
    rows, seq_len = tokens.shape
    targets = torch.where(
        batch.loss_mask > 0, batch.labels.to(torch.int64), torch.tensor(IGNORE_INDEX)
    )
    num_tiles, num_images = batch.num_tiles.to(torch.int32), batch.num_images.to(torch.int64)
    images = batch.images
    placeholders = int((tokens == int(batch.image_token_index)).sum())
    if placeholders != num_tiles.numel() or int(num_images.sum()) != num_tiles.numel():
        raise ValueError(
            f"{placeholders} image placeholder(s) (id {batch.image_token_index}) in tokens, "
            f"{int(num_images.sum())} image(s) by num_images, {num_tiles.numel()} by num_tiles"
        )
    if images.ndim != 4 or images.shape[0] != int(num_tiles.sum()):
        raise ValueError(
            f"images must be (tiles, C, H, W) with sum(num_tiles) = {int(num_tiles.sum())} tiles, "
            f"got {tuple(images.shape)}"
        )
    # Each row's image surplus: what splicing adds to its length.
    surplus_doc = batch.spliced_lengths.to(torch.int64) - batch.doc_lengths.to(torch.int64)
    row_of_doc = torch.repeat_interleave(torch.arange(rows), batch.num_docs.long())
    surplus = torch.zeros(rows, dtype=torch.int64).index_add_(0, row_of_doc, surplus_doc)
    used = torch.zeros(rows, dtype=torch.int64).index_add_(
        0, row_of_doc, batch.doc_lengths.to(torch.int64)
    )
    if bool((used + surplus > seq_len).any()):
        raise ValueError(
            f"a row's spliced length {(used + surplus).tolist()} exceeds its {seq_len} positions"
        )
    if packed:
        keep = (seq_len - surplus).tolist()
        tokens = torch.cat([tokens[r, : keep[r]] for r in range(rows)]).reshape(1, -1)
        targets = torch.cat([targets[r, : keep[r]] for r in range(rows)]).reshape(1, -1)
        segments, doc = [], 0
        for n in batch.num_docs.tolist():
            lengths = batch.spliced_lengths[doc : doc + n].tolist()
            # the row's padding: its last document's
            segments += lengths[:-1] + [seq_len - sum(lengths[:-1])]
            doc += n
        cu_lengths = torch.zeros((1, len(segments) + 1), dtype=torch.int32)
        cu_lengths[0, 1:] = torch.cumsum(torch.tensor(segments, dtype=torch.int64), 0).to(
            torch.int32
        )
        max_lengths = torch.tensor([max(segments)], dtype=torch.int32)
    else:
        width = seq_len - int(surplus.min())
        tokens, targets = tokens[:, :width], targets[:, :width]
        cu_lengths, max_lengths = _absent(torch.int32), _absent(torch.int32)
    labels = torch.cat(
        [torch.full((tokens.shape[0], 1), IGNORE_INDEX, dtype=torch.int64), targets], dim=1
    )
    if num_tiles.numel():
        imgs = images.to(torch.float32).contiguous()
    else:
        imgs, num_tiles = _absent(torch.float32), _absent(torch.int32)
    return {
        "tokens": tokens.contiguous(),
        "labels": labels.contiguous(),
        "imgs": imgs,
        "num_tiles": num_tiles,
        "cu_lengths": cu_lengths,
        "max_lengths": max_lengths,
        "__key__": list(batch.keys),
    }


def _gpt_batch(batch: Any) -> dict:
    rows, seq_len = batch.tokens.shape
    flat = batch.cu_seqlens.to(torch.int64)
    cu_seqlens = torch.full((rows, seq_len + 1), seq_len, dtype=torch.int32)
    max_seqlen = torch.empty(rows, dtype=torch.int32)
    doc = 0
    for i, n in enumerate(batch.num_docs.tolist()):
        row = flat[doc : doc + n + 1] - i * seq_len
        if row.numel() != n + 1 or int(row[0]) != 0 or int(row[-1]) != seq_len:
            raise ValueError(
                f"cu_seqlens does not split row {i} into its {n} document(s): {row.tolist()}"
            )
        cu_seqlens[i, : n + 1] = row.to(torch.int32)
        max_seqlen[i] = int((row[1:] - row[:-1]).max())
        doc += n
    return {
        "tokens": batch.tokens.to(torch.int64).contiguous(),
        "labels": batch.labels.to(torch.int64).contiguous(),
        "loss_mask": batch.loss_mask.to(torch.float32).contiguous(),
        "position_ids": batch.position_ids.to(torch.int64).contiguous(),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max_seqlen,
    }


def _media_fields(batch: Any) -> set[str]:
    """Tensor fields beyond the text fields (``images``, ``features``, ...); the vision fields
    (``num_tiles``, ``num_images``, ``spliced_lengths``) count as images."""
    names = (
        [f.name for f in dataclasses.fields(batch)]
        if dataclasses.is_dataclass(batch)
        else list(vars(batch))
    )
    found = {
        n
        for n in names
        if n not in _TEXT_FIELDS
        and not n.startswith("_")
        and isinstance(getattr(batch, n, None), torch.Tensor)
    }
    return {"images"} | (found - _VISION_FIELDS) if found & _VISION_FIELDS else found
