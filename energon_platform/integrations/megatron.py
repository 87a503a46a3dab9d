"""Megatron-LM adapter: what ``--dataloader-type external`` calls, on top of :class:`TrainLoader`.

Megatron-LM never imports this module's dependencies and this module never imports megatron-core
(which needs CUDA): Megatron's values come in as plain arguments, or from its ``args`` namespace
through :func:`make_provider_from_args`. The names below follow Megatron-LM's own code:

* ``examples/multimodal/dataloader_provider.py``: ``train_valid_test_dataloaders_provider`` built
  only where ``is_dataloader_rank()`` (tensor-parallel rank 0, first or last pipeline stage), an
  ``EnergonDataloader`` wrapper with ``__next__``/``__iter__``/``save_state()``, and the restore of
  ``{dataloader_save}/iter_{iteration:07d}/mp_rank_00/train_dataloader_dprank{dp:03d}.pt`` when
  ``args.load`` is set. Megatron's provider *prints* a failed or missing restore and restarts the
  data from scratch; :func:`make_provider` raises instead (:class:`StateMismatchError`,
  :class:`LayoutError`, or ``FileNotFoundError`` naming the path).
* ``megatron/training/training.py`` (``build_train_valid_test_data_iterators``): with
  ``dataloader_type == "external"`` the provider's objects are passed through, wrapped in a
  ``RerunDataIterator`` that calls ``next(iterable)`` once per micro-batch
  (``global_batch // (micro_batch × dp)`` calls per iteration on each data-parallel rank). The
  provider carries ``is_distributed = True`` as in Megatron's multimodal ``train.py``, so every
  rank calls it and the rank gating happens here.
* ``megatron/training/checkpointing.py`` (``maybe_save_dataloader_state``): at a checkpoint
  iteration, the first pipeline stage's tensor-parallel rank 0 of every data-parallel rank calls
  ``train_iterator.iterable.save_state()`` and ``torch.save``\\ s ``{"dataloader_state_dict":
  state}`` to the path above (``mp_rank_00_000`` with pipeline parallelism).
  :func:`save_dataloader_state` writes the same file the same way, atomically.
* ``examples/multimodal/train.py`` (``get_batch``) and ``pretrain_gpt.py`` /
  ``megatron/core/utils.py`` (``get_batch_on_this_tp_rank``, ``flatten_batch_for_packed_sequences``):
  the batch dicts of :func:`to_megatron_batch`.
* Vision-language training (``examples/multimodal/train.py``, ``model.py``, megatron-core's
  ``LLaVAModel``): the encoders' vision-language batches
  (:class:`task_encoders.image_text.VisionLanguageBatch`) carry ``<image>`` placeholders, tiles and
  ``num_tiles``; :func:`megatron_requirements` says which Megatron arguments they need
  (``image_token_index`` among them) and :func:`check_megatron_args` refuses a run whose arguments
  disagree, before any data is read (:func:`make_provider_from_args` calls it on every data rank).

The state file format
---------------------
``save_state()`` returns :meth:`TrainLoader.state_dict`, plain JSON data (dicts, lists, str,
int, bool, None). The file holds ``{"dataloader_state_dict": state}`` written with ``torch.save``,
i.e. exactly what Megatron's own ``maybe_save_dataloader_state`` writes when it saves our
iterator. We chose this over JSON bytes because Megatron writes these files itself in a real run:
the reader has to read torch's format anyway, and one format in the directory is simpler than two.
Since the content is plain data, :func:`load_dataloader_state` reads it with
``torch.load(weights_only=True)`` (PyTorch's restricted unpickler: it builds dicts, lists and
primitives and executes no code from the file); a pickle that needs anything else (for example
Energon's own savable-loader state) is refused, never loaded with ``weights_only=False``. The
reader also accepts a JSON file with the same content.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from energon_platform.config import RunConfig, load_config
from energon_platform.loader.schedule import LayoutError
from energon_platform.loader.state import StateMismatchError
from energon_platform.loader.train_loader import TrainLoader, build_encoder

__all__ = [
    "IGNORE_INDEX",
    "BATCH_FORMATS",
    "to_megatron_batch",
    "is_dataloader_rank",
    "state_file",
    "latest_iteration",
    "save_dataloader_state",
    "load_dataloader_state",
    "make_provider",
    "provider_kwargs_from_args",
    "make_provider_from_args",
    "MegatronTrainIterator",
    "MegatronValidIterator",
    "StateMismatchError",
    "LayoutError",
    "MegatronArgsError",
    "megatron_requirements",
    "check_megatron_args",
]

#: Megatron's ``IGNORE_INDEX`` (``megatron/core/models/multimodal/llava_model.py``): a label that is no target.
IGNORE_INDEX = -100
BATCH_FORMATS = ("multimodal", "gpt")
BatchFormat = Literal["multimodal", "gpt"]

#: The fields every ``task_encoders`` batch has (:class:`task_encoders.documents.TextBatch`).
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


class MegatronArgsError(ValueError):
    """Megatron-LM's arguments disagree with what the provider's batches need (names both values)."""


def _absent(dtype: torch.dtype) -> torch.Tensor:
    """Megatron's "absent" marker: a ``[[0]]`` tensor (shape ``(1, 1)``)."""
    return torch.zeros((1, 1), dtype=dtype)


# --- batches -------------------------------------------------------------------------------------


def to_megatron_batch(
    batch: Any, format: BatchFormat = "multimodal", *, packed: bool | None = None
) -> dict:
    """One ``task_encoders`` micro-batch (``TextBatch``/``ImageTextBatch``) → the dict Megatron's
    ``get_batch`` reads. ``N`` rows of ``S`` tokens holding ``D`` documents; ``IGNORE_INDEX = -100``.

    ``format="multimodal"`` (``examples/multimodal/train.py`` ``get_batch``, which
    ``broadcast_data``\\ s each key with the dtype given here and checks it):

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
      :attr:`MegatronTrainIterator.last_keys`.

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
    """:func:`to_megatron_batch` of a :class:`task_encoders.image_text.VisionLanguageBatch`."""
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
            segments += lengths[:-1] + [
                seq_len - sum(lengths[:-1])
            ]  # the row's padding: its last document's
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


# --- ranks and state files -----------------------------------------------------------------------


def is_dataloader_rank(tp_rank: int = 0, pp_rank: int = 0, pp_size: int = 1) -> bool:
    """Whether Megatron builds data on this rank: tensor-parallel rank 0 on the first or last
    pipeline stage (the other tensor-parallel ranks receive the batch by broadcast)."""
    return tp_rank == 0 and (pp_size == 1 or pp_rank in (0, pp_size - 1))


def state_file(
    dataloader_save: str | os.PathLike,
    iteration: int,
    dp_rank: int,
    *,
    pipeline_parallel: bool = False,
) -> Path:
    """``{dataloader_save}/iter_{iteration:07d}/mp_rank_00/train_dataloader_dprank{dp_rank:03d}.pt``
    (``mp_rank_00_000`` when ``pipeline_parallel``), the path Megatron's ``get_checkpoint_name``
    gives the dataloader state (tensor rank 0, pipeline rank 0)."""
    mp = "mp_rank_00_000" if pipeline_parallel else "mp_rank_00"
    return (
        Path(dataloader_save)
        / f"iter_{int(iteration):07d}"
        / mp
        / f"train_dataloader_dprank{int(dp_rank):03d}.pt"
    )


def latest_iteration(dataloader_save: str | os.PathLike) -> int:
    """The highest ``iter_NNNNNNN`` folder in ``dataloader_save``; ``FileNotFoundError`` naming the
    folder when there is none. Prefer the iteration of the model checkpoint actually loaded
    (Megatron's ``args.iteration``): a later dataloader state would not match the model."""
    root = Path(dataloader_save)
    found = [
        int(m.group(1))
        for p in (root.iterdir() if root.is_dir() else ())
        if p.is_dir() and (m := re.fullmatch(r"iter_(\d{7,})", p.name))
    ]
    if not found:
        raise FileNotFoundError(
            f"{root}: no iter_NNNNNNN folder with a data loader state to restore"
        )
    return max(found)


def save_dataloader_state(
    train_iter: Any,
    dataloader_save: str | os.PathLike,
    iteration: int,
    dp_rank: int,
    *,
    pipeline_parallel: bool = False,
) -> Path:
    """Write ``train_iter.save_state()`` where Megatron's ``maybe_save_dataloader_state`` does, in
    its format (``torch.save({"dataloader_state_dict": state})``, plain data only), atomically
    (temporary file, fsync, rename). ``train_iter`` is a :class:`MegatronTrainIterator` or
    Megatron's ``RerunDataIterator`` around one (its ``.iterable``). Call it at an iteration
    boundary on the first pipeline stage's tensor-parallel rank 0 of every data-parallel rank.
    Returns the path."""
    source = getattr(train_iter, "iterable", train_iter)
    state = json.loads(
        json.dumps(source.save_state())
    )  # plain data, or TypeError here rather than in torch.load
    path = state_file(dataloader_save, iteration, dp_rank, pipeline_parallel=pipeline_parallel)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"dataloader_state_dict": state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_dataloader_state(path: str | os.PathLike) -> dict:
    """The loader state in a state file (:func:`save_dataloader_state`'s, Megatron's torch.save of
    our ``save_state()``, or the same content as JSON). Reads torch files with
    ``weights_only=True`` only. ``FileNotFoundError`` naming the path when it does not exist;
    :class:`StateMismatchError` naming it when it holds no state of ours."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"data loader state {path} does not exist; the data is not restarted from scratch "
            f"(resume from an iteration whose state was saved, or start a fresh run)"
        )
    raw = path.read_bytes()
    try:
        if raw.lstrip()[:1] == b"{":
            content = json.loads(raw)
        else:
            content = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:
        raise StateMismatchError(
            f"{path}: not a data loader state this build can read without executing code "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"Energon's own savable-loader states are not compatible"
        ) from None
    if isinstance(content, dict) and "dataloader_state_dict" in content:
        content = content["dataloader_state_dict"]
    if not isinstance(content, dict) or "fingerprint" not in content:
        raise StateMismatchError(
            f"{path}: holds no energon_platform loader state "
            f"(expected {{'dataloader_state_dict': {{'version', 'fingerprint', ...}}}})"
        )
    return content


def _resolve_state_file(
    dataloader_save: str | os.PathLike,
    iteration: int,
    dp_rank: int,
    dp_size: int,
    pipeline_parallel: bool,
) -> Path:
    """This rank's state file; after a change of data-parallel size, a new rank without a file of its
    own continues from rank 0's (saved at an iteration boundary, the position is the global batch)."""
    own = state_file(dataloader_save, iteration, dp_rank, pipeline_parallel=pipeline_parallel)
    if own.is_file():
        return own
    first = state_file(dataloader_save, iteration, 0, pipeline_parallel=pipeline_parallel)
    if first.is_file():
        saved_world = load_dataloader_state(first).get("layout", {}).get("world_size")
        if saved_world is not None and saved_world != dp_size and dp_rank >= saved_world:
            return first
    present = (
        sorted(p.name for p in own.parent.glob("train_dataloader_dprank*.pt"))
        if own.parent.is_dir()
        else []
    )
    raise FileNotFoundError(
        f"data loader state {own} does not exist (found there: {present or 'nothing'}); "
        f"the data is not restarted from scratch"
    )


# --- iterators -----------------------------------------------------------------------------------


class MegatronTrainIterator:
    """Megatron's view of one rank's :class:`TrainLoader` (the part of ``EnergonDataloader`` it uses).

    ``next()`` → the next micro-batch as :func:`to_megatron_batch` dict; ``save_state()`` → the
    loader's plain state dict. Infinite: epochs follow each other. ``loader`` is the
    :class:`TrainLoader`; ``last_keys`` the sample keys of the last micro-batch (for logs),
    ``last_batch`` the encoder's batch it was made from.
    """

    def __init__(
        self,
        loader: TrainLoader,
        batch_format: BatchFormat = "multimodal",
        packed: bool | None = None,
        max_sequence_length: int | None = None,
    ):
        if batch_format not in BATCH_FORMATS:
            raise ValueError(f"batch_format {batch_format!r}: expected one of {BATCH_FORMATS}")
        self.loader, self.batch_format = loader, batch_format
        self.packed = loader.batching.packed if packed is None else packed
        self.max_sequence_length = max_sequence_length
        self.last_keys: list[str] = []
        self.last_batch: Any = None

    @property
    def image_token_index(self) -> int | None:
        """The ``<image>`` placeholder's id in ``tokens`` (None for encoders without placeholders):
        what megatron-core's ``LLaVAModel(image_token_index=...)`` must get."""
        return getattr(self.loader.encoder, "image_token_index", None)

    @property
    def accumulation(self) -> int:
        """``next()`` calls per iteration on this rank (Megatron's ``get_num_microbatches()``)."""
        return self.loader.accumulation

    def __iter__(self) -> MegatronTrainIterator:
        return self

    def __next__(self) -> dict:
        batch = next(self.loader)
        self.last_keys, self.last_batch = list(batch.keys), batch
        data = to_megatron_batch(batch, self.batch_format, packed=self.packed)
        if self.max_sequence_length and self.packed and self.batch_format == "multimodal":
            length = int(data["cu_lengths"][0, -1])
            if length > self.max_sequence_length:
                raise LayoutError(
                    f"a packed micro-batch of {batch.tokens.shape[0]} rows is {length} positions after "
                    f"splicing, more than --decoder-seq-length {self.max_sequence_length}: LLaVAModel "
                    f"would cut it; raise --decoder-seq-length or use a smaller pack group "
                    f"(keys {self.last_keys[:3]}...)"
                )
        return data

    def save_state(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Stop the loader's worker processes (``next()`` restarts them at the same position)."""
        self.loader.close()


class MegatronValidIterator:
    """Validation micro-batches for Megatron's ``evaluate()``: Energon's validation loader over
    ``data.val_split`` (evaluation transforms, no shuffling, this rank's share), converted by
    :func:`to_megatron_batch`, cycling. With ``restart_every`` (``eval_iters`` × micro-batches per
    iteration) the split is cut to that many micro-batches and starts over after them, so every
    evaluation sees the same batches: ``LimitDataset(RepeatDataset(...), reset_after_epoch=True)``,
    as in Megatron's ``examples/multimodal/dataloader_provider.py``. ``save_state()`` is None:
    nothing to restore."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        dp_rank: int,
        dp_size: int,
        batch_size: int,
        num_workers: int,
        batch_format: BatchFormat = "multimodal",
        packed: bool = False,
        restart_every: int | None = None,
    ):
        from megatron.energon import LimitDataset, RepeatDataset, get_loader, get_val_dataset

        encoder = build_encoder(cfg, training=False)
        worker_config = encoder.worker_config(
            rank=dp_rank, world_size=dp_size, num_workers=num_workers
        )
        dataset = get_val_dataset(
            str(cfg.data.path),
            split_part=cfg.data.val_split,
            batch_size=batch_size,
            worker_config=worker_config,
            task_encoder=encoder,
            packing_buffer_size=encoder.packing_buffer_size,
        )
        if restart_every:
            dataset = LimitDataset(
                RepeatDataset(dataset, worker_config=worker_config),
                length=restart_every,
                reset_after_epoch=True,
                worker_config=worker_config,
            )
        self._loader = get_loader(dataset)
        self.batch_format, self.packed, self.restart_every = batch_format, packed, restart_every
        self._iter = None
        self.last_keys: list[str] = []

    def __iter__(self) -> MegatronValidIterator:
        return self

    def __next__(self) -> dict:
        for _attempt in range(2):
            if self._iter is None:
                self._iter = iter(self._loader)
            try:
                batch = next(self._iter)
                break
            except StopIteration:  # the end of a pass: start the next one (Megatron's cyclic_iter)
                self._iter = None
        else:
            raise RuntimeError("the validation split gives this rank no batch")
        self.last_keys = list(batch.keys)
        return to_megatron_batch(batch, self.batch_format, packed=self.packed)

    def save_state(self) -> None:
        return None

    def close(self) -> None:
        self._iter = None


# --- the provider --------------------------------------------------------------------------------


def _run_config(
    config: str | os.PathLike | dict | RunConfig,
    micro_batch_size: int | None,
    global_batch_size: int | None,
) -> RunConfig:
    cfg = (
        config
        if isinstance(config, RunConfig)
        else load_config(config if isinstance(config, dict) else Path(config))
    )
    changes = {}
    for name, value in (
        ("micro_batch_size", micro_batch_size),
        ("global_batch_size", global_batch_size),
    ):
        if value is not None:
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
            changes[name] = int(value)
    return (
        dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, **changes))
        if changes
        else cfg
    )


def make_provider(
    config: str | os.PathLike | dict | RunConfig,
    *,
    dp_rank: int,
    dp_size: int,
    is_data_rank: bool = True,
    micro_batch_size: int | None = None,
    global_batch_size: int | None = None,
    num_workers: int | None = None,
    dataloader_save: str | os.PathLike | None = None,
    restore_iteration: int | str | None = None,
    batch_format: BatchFormat = "multimodal",
    eval_iters: int | None = None,
    build_valid: bool = True,
    pipeline_parallel: bool = False,
) -> Callable[[Any], tuple[Any, Any, Any]]:
    """Megatron's ``train_valid_test_dataloaders_provider`` for one rank, from plain values.

    Args:
        config: run config (YAML path, mapping for :func:`load_config`, or :class:`RunConfig`).
        dp_rank, dp_size: this rank's data-parallel coordinates (``parallel_state``'s).
        is_data_rank: False where Megatron builds no data (:func:`is_dataloader_rank`); the
            provider then returns ``(None, None, None)`` and reads nothing.
        micro_batch_size, global_batch_size: Megatron's ``--micro-batch-size`` /
            ``--global-batch-size`` in loader items (samples; pack groups with packing, which the
            multimodal format turns into one packed sequence per micro-batch); None keeps the
            config's ``loader`` values. The global batch is part of the state's fingerprint.
        num_workers: DataLoader workers (None: the config's); may differ from the saved run.
        dataloader_save: Megatron's ``--dataloader-save`` folder (needed to restore).
        restore_iteration: None starts the data at the beginning; an iteration (Megatron's
            ``args.iteration`` after loading the model checkpoint) restores that iteration's state
            file; ``"latest"`` the highest ``iter_*`` in ``dataloader_save``. A missing file raises
            ``FileNotFoundError`` naming the path, other data/config :class:`StateMismatchError`,
            an impossible layout :class:`LayoutError`: the data never restarts silently.
        batch_format: ``"multimodal"`` or ``"gpt"`` (:func:`to_megatron_batch`).
        eval_iters: Megatron's ``--eval-iters``: the validation iterator restarts every
            ``eval_iters`` × micro-batches-per-iteration ``next()`` calls (same data each evaluation).
        build_valid: False: no validation iterator.
        pipeline_parallel: state files under ``mp_rank_00_000`` (pipeline parallel size > 1).

    Returns ``provider(train_val_test_num_samples) -> (train, valid, test)``; ``train`` is a
    :class:`MegatronTrainIterator`, ``valid`` a :class:`MegatronValidIterator` (None without
    ``data.val_split``), ``test`` None. The train stream is infinite, so the requested numbers of
    samples are not needed. ``provider.is_distributed`` is True (Megatron then calls it on every
    rank).
    """
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"batch_format {batch_format!r}: expected one of {BATCH_FORMATS}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} is not in [0, dp_size={dp_size})")
    if restore_iteration is not None and not dataloader_save:
        raise ValueError(
            f"restore_iteration={restore_iteration!r} needs dataloader_save (Megatron's "
            f"--dataloader-save): without it the data would restart from the beginning"
        )
    if (
        restore_iteration is not None
        and restore_iteration != "latest"
        and not isinstance(restore_iteration, int)
    ):
        raise ValueError(
            f"restore_iteration must be None, an int or 'latest', got {restore_iteration!r}"
        )

    def train_valid_test_dataloaders_provider(train_val_test_num_samples: Any = None):
        if not is_data_rank:
            return None, None, None
        cfg = _run_config(config, micro_batch_size, global_batch_size)
        loader = TrainLoader(cfg, rank=dp_rank, world_size=dp_size, num_workers=num_workers)
        if micro_batch_size is not None and global_batch_size is not None:
            expected = global_batch_size // (micro_batch_size * dp_size)
            if loader.accumulation != expected or global_batch_size % (micro_batch_size * dp_size):
                raise LayoutError(
                    f"global batch {global_batch_size} / (micro batch {micro_batch_size} x dp "
                    f"{dp_size}) is not the loader's {loader.accumulation} micro-batches per step"
                )
        if restore_iteration is not None:
            iteration = (
                latest_iteration(dataloader_save)
                if restore_iteration == "latest"
                else restore_iteration
            )
            path = _resolve_state_file(
                dataloader_save, iteration, dp_rank, dp_size, pipeline_parallel
            )
            loader.load_state_dict(load_dataloader_state(path))
        train = MegatronTrainIterator(loader, batch_format)
        valid = None
        if build_valid and cfg.data.val_split:
            valid = MegatronValidIterator(
                cfg,
                dp_rank=dp_rank,
                dp_size=dp_size,
                batch_size=loader.maker.micro_items,
                num_workers=loader.num_workers,
                batch_format=batch_format,
                packed=train.packed,
                restart_every=eval_iters * loader.accumulation if eval_iters else None,
            )
        return train, valid, None

    train_valid_test_dataloaders_provider.is_distributed = True
    return train_valid_test_dataloaders_provider


def megatron_requirements(config: str | os.PathLike | dict | RunConfig | Any) -> dict:
    """What Megatron-LM's arguments must be for the batches of ``config``'s encoder (a run config,
    or an encoder built by ``task_encoders``), by Megatron's argument names (``args.<name>``):

    * always: ``dataloader_type`` (``"external"``) and ``decoder_seq_length`` (at least the
      encoder's ``text.seq_len``, the positions of one row after splicing);
    * with packing: ``micro_batch_size`` 1 (Megatron's packed multimodal path) and the pack group;
    * vision-language encoders: ``image_token_index`` (the placeholder's id, for ``LLaVAModel``)
      and ``image_token`` (its text),
      ``special_tokens`` (Megatron's ``--special-tokens`` list, same order), ``img_h``/``img_w``,
      ``patch_dim``, ``vision_model_type``, ``disable_vision_class_token``, ``pixel_shuffle``,
      ``use_tiling``, ``max_num_tiles``, ``use_thumbnail``, ``use_area_weighted_aspect_ratio``,
      ``use_tile_tags`` (False), and ``tokens_per_tile``/``vocab_size`` for reference.
    """
    encoder = (
        config
        if hasattr(config, "seq_len") and hasattr(config, "tokenizer")
        else build_encoder(_run_config(config, None, None))
    )
    packing = getattr(encoder, "packing_buffer_size", None) is not None
    req: dict[str, Any] = {
        "dataloader_type": "external",
        "decoder_seq_length": int(encoder.seq_len),
        "vocab_size": int(encoder.tokenizer.vocab_size),
    }
    if packing:
        req["micro_batch_size"] = 1
    if getattr(encoder, "image_token_index", None) is None:
        return req
    cfg = encoder.config
    tiling, vision = cfg.image.tiling, cfg.vision
    req.update(
        image_token_index=int(encoder.image_token_index),
        image_token=cfg.prompt.image_token,
        special_tokens=list(cfg.prompt.special_tokens),
        img_h=int(encoder.tile_size),
        img_w=int(encoder.tile_size),
        patch_dim=vision.patch_dim,
        vision_model_type=vision.model_type,
        disable_vision_class_token=vision.drop_class_token,
        pixel_shuffle=vision.pixel_shuffle,
        use_tiling=tiling.enabled,
        use_tile_tags=False,
        tokens_per_tile=int(encoder.tokens_per_tile),
    )
    if tiling.enabled:
        req.update(
            max_num_tiles=tiling.max_num_tiles,
            use_thumbnail=tiling.use_thumbnail,
            use_area_weighted_aspect_ratio=tiling.aspect_ratio == "area_weighted",
        )
    return req


def _megatron_image_token_id(args: Any, tokenizer: Any, token: str) -> tuple[int | None, str]:
    """The id Megatron's tokenizer gives ``token``: from its tokenizer object when given, else by
    loading ``args.tokenizer_model`` (a local folder) and adding ``args.special_tokens`` as
    Megatron's multimodal tokenizer does; (None, why) when neither is possible."""
    if tokenizer is not None:
        hf = getattr(tokenizer, "tokenizer", tokenizer)
        convert = getattr(hf, "convert_tokens_to_ids", None) or tokenizer.convert_tokens_to_ids
        return int(convert(token)), "Megatron's tokenizer"
    folder = getattr(args, "tokenizer_model", None)
    if folder and Path(str(folder)).is_dir():
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        hf.add_tokens(list(getattr(args, "special_tokens", None) or []), special_tokens=True)
        token_id = hf.convert_tokens_to_ids(token)
        return (
            int(token_id) if token_id is not None and token_id != hf.unk_token_id else None
        ), f"--tokenizer-model {folder} with --special-tokens"
    return None, "no tokenizer to compare"


def check_megatron_args(
    config: str | os.PathLike | dict | RunConfig | Any,
    args: Any,
    *,
    tokenizer: Any = None,
    batch_format: BatchFormat = "multimodal",
) -> dict:
    """Refuse (:class:`MegatronArgsError`, one line per disagreement, naming Megatron's argument, its
    value and the value the batches need) a Megatron run whose ``args`` do not fit the encoder's
    batches (:func:`megatron_requirements`); returns the requirements. Arguments ``args`` lacks are
    not checked. ``tokenizer``: Megatron's ``get_tokenizer()``, to compare the placeholder's id
    exactly; without it ``args.tokenizer_model`` is loaded when it is a local folder."""
    req = megatron_requirements(config)
    problems = []

    def arg(name: str) -> Any:
        return getattr(args, name, None)

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    if arg("dataloader_type") not in (None, "external"):
        problems.append(
            f"{flag('dataloader_type')} is {arg('dataloader_type')!r}; this provider needs 'external'"
        )
    vision_language = "image_token_index" in req
    length = (
        (arg("decoder_seq_length") or arg("seq_length")) if vision_language else arg("seq_length")
    )
    if length is not None and int(length) < req["decoder_seq_length"]:
        which = "--decoder-seq-length" if vision_language else "--seq-length"
        problems.append(
            f"{which} {length} < the encoder's text.seq_len {req['decoder_seq_length']} "
            f"(positions per row after splicing); the model would cut the rows"
        )
    if (
        batch_format == "multimodal"
        and "micro_batch_size" in req
        and arg("micro_batch_size") not in (None, 1)
    ):
        problems.append(
            f"--micro-batch-size {arg('micro_batch_size')}: packed multimodal batches need 1 "
            f"(one packed sequence per micro-batch)"
        )
    vocab = arg("padded_vocab_size")
    if vocab is not None and int(vocab) < req["vocab_size"]:
        problems.append(f"padded vocab size {vocab} < the tokenizer's {req['vocab_size']} tokens")
    if vision_language:
        if batch_format != "multimodal":
            problems.append(
                f"batch format {batch_format!r}: vision-language batches travel in the 'multimodal' format"
            )
        given = arg("special_tokens")
        if given is not None and list(given)[: len(req["special_tokens"])] != req["special_tokens"]:
            problems.append(
                f"--special-tokens {list(given)} must start with the encoder's prompt.special_tokens "
                f"{req['special_tokens']} (same order, so the ids agree)"
            )
        token = req["image_token"]
        megatron_id, source = _megatron_image_token_id(args, tokenizer, token)
        if megatron_id is not None and megatron_id != req["image_token_index"]:
            problems.append(
                f"{source} gives {token} the id {megatron_id}, the batches use {req['image_token_index']}"
            )
        for name in (
            "img_h",
            "img_w",
            "patch_dim",
            "vision_model_type",
            "disable_vision_class_token",
            "pixel_shuffle",
            "use_tiling",
            "max_num_tiles",
            "use_thumbnail",
            "use_area_weighted_aspect_ratio",
        ):
            if name in req and arg(name) is not None and arg(name) != req[name]:
                problems.append(
                    f"{flag(name)} is {arg(name)!r}; the encoder's batches need {req[name]!r}"
                )
        if arg("use_tile_tags"):
            problems.append("--use-tile-tags: tile tags are not supported by these batches")
        if arg("class_token_len") not in (None, 1):
            problems.append(
                f"--class-token-len {arg('class_token_len')}: the encoder counts 1 class token"
            )
    if problems:
        raise MegatronArgsError(
            "Megatron-LM arguments do not fit the data:\n  " + "\n  ".join(problems)
        )
    return req


def provider_kwargs_from_args(args: Any) -> dict:
    """:func:`make_provider` keyword arguments from Megatron's ``args`` (``get_args()``):
    ``micro_batch_size``, ``global_batch_size``, ``num_workers``, ``dataloader_save``,
    ``eval_iters``, ``dp_size`` (``data_parallel_size``) and ``restore_iteration``
    (``args.iteration`` when ``args.load`` is set and a checkpoint was loaded, else None)."""
    kwargs: dict[str, Any] = {
        "micro_batch_size": args.micro_batch_size,
        "global_batch_size": args.global_batch_size,
    }
    for ours, theirs in (
        ("num_workers", "num_workers"),
        ("dataloader_save", "dataloader_save"),
        ("dp_size", "data_parallel_size"),
    ):
        value = getattr(args, theirs, None)
        if value is not None and value != "":
            kwargs[ours] = value
    eval_iters = getattr(args, "eval_iters", None)
    if isinstance(eval_iters, int) and eval_iters > 0:
        kwargs["eval_iters"] = eval_iters
    iteration = int(getattr(args, "iteration", 0) or 0)
    kwargs["restore_iteration"] = (
        iteration if getattr(args, "load", None) is not None and iteration > 0 else None
    )
    return kwargs


def make_provider_from_args(
    config: str | os.PathLike | dict | RunConfig,
    args: Any,
    *,
    dp_rank: int,
    tp_rank: int = 0,
    pp_rank: int = 0,
    tokenizer: Any = None,
    **overrides: Any,
):
    """:func:`make_provider` with Megatron's ``args`` (:func:`provider_kwargs_from_args`) and this
    rank's ``parallel_state`` ranks (tensor, pipeline, data parallel); ``overrides`` win. On a data
    rank the provider first runs :func:`check_megatron_args` (``tokenizer``: Megatron's
    ``get_tokenizer()``, optional) and refuses disagreeing arguments before reading any data; its
    train iterator's ``image_token_index`` is the placeholder id, and packed micro-batches longer
    than ``args.decoder_seq_length`` after splicing raise instead of being cut."""
    pp_size = int(getattr(args, "pipeline_model_parallel_size", 1) or 1)
    kwargs = provider_kwargs_from_args(args)
    kwargs.update(
        is_data_rank=is_dataloader_rank(tp_rank, pp_rank, pp_size), pipeline_parallel=pp_size > 1
    )
    kwargs.update(overrides)
    if "dp_size" not in kwargs:
        raise ValueError("args has no data_parallel_size; pass dp_size=")
    provider = make_provider(config, dp_rank=dp_rank, **kwargs)
    if not kwargs["is_data_rank"]:
        return provider
    batch_format = kwargs.get("batch_format", "multimodal")

    def checked_provider(train_val_test_num_samples: Any = None):
        check_megatron_args(config, args, tokenizer=tokenizer, batch_format=batch_format)
        train, valid, test = provider(train_val_test_num_samples)
        train.max_sequence_length = getattr(args, "decoder_seq_length", None)
        return train, valid, test

    checked_provider.is_distributed = True
    return checked_provider
