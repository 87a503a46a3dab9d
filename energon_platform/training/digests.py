"""Digests of batches, in one place: the reference trainer's per-row digests, `StepLog`'s digest
of any tensors, the fields a trainer moves to its device, and a batch's tensors by name.

* `row_digests`: one sha256 per row of a ``task_encoders`` batch, independent of how a global batch
  is split into micro-batches. It reads what the batch's class declares
  (`task_encoders.batch_tensors`: ``row_tensors`` and ``media``), so a new modality's tensors are
  digested once its batch class says it holds them. ``train.py`` logs them as ``batch_sha256``,
  which ``check-resume`` compares.
* `batch_digest`: one sha256 of a tensor, or a dict, list or tuple of them, nested (`StepLog`).
* `device_fields`: the batch's own ``device_fields()``.
* `tensors_of`: every tensor field of a batch by name (the restore benchmark digests them).

Only the standard library is imported; ``torch`` is used when the caller's tensors exist.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from typing import Any

__all__ = ["batch_digest", "device_fields", "row_digests", "tensors_of"]


def _update(h: hashlib._Hash, obj: Any) -> None:
    torch = sys.modules.get("torch")  # no tensor exists unless torch was imported
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{tuple(t.shape)}:{t.dtype};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, str):
        h.update(f"S{len(obj)};".encode() + obj.encode())
    elif isinstance(obj, (bytes, bytearray)):
        h.update(f"B{len(obj)};".encode() + bytes(obj))
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)};".encode())
        for key in sorted(obj, key=str):
            _update(h, str(key))
            _update(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)};".encode())
        for item in obj:
            _update(h, item)
    elif obj is None or isinstance(obj, (bool, int, float)):
        h.update(f"V{obj!r};".encode())
    else:
        raise TypeError(
            f"batch_digest: cannot digest a {type(obj).__name__}; pass tensors, or a dict, list or "
            f"tuple of them"
        )


def batch_digest(batch: Any) -> str:
    """sha256 (hex) of ``batch``: a tensor (shape, dtype and bytes, on any device), or a dict
    (by sorted key), list or tuple of tensors, nested; strings count as their text, so the
    digests every rank computed of its own part, gathered in rank order, digest to one value
    for the global batch."""
    h = hashlib.sha256()
    _update(h, batch)
    return h.hexdigest()


def _declared(batch: Any) -> tuple[tuple[str, ...], tuple]:
    rows, media = getattr(batch, "row_tensors", None), getattr(batch, "media", None)
    if rows is None or not isinstance(media, tuple):
        raise TypeError(
            f"row_digests: a {type(batch).__name__} does not say which tensors it holds (the "
            f"row_tensors and media of task_encoders.documents.TextBatch)"
        )
    return rows, media


def _media_by_doc(batch: Any, media: tuple) -> dict[int, list]:
    """Document index → its media tensors, each cut to its valid length, in ``media`` order. A
    medium without ``per_doc`` holds one item per document; ``per_item`` counts the tensors of
    each item (a vision-language image's tiles go with their image's document)."""
    import torch

    out: dict[int, list] = {}
    for medium in media:
        tensors = getattr(batch, medium.field, None)
        if not isinstance(tensors, torch.Tensor):
            continue
        docs = None
        if medium.per_doc:
            per_doc = getattr(batch, medium.per_doc).long()
            docs = torch.repeat_interleave(torch.arange(len(per_doc)), per_doc.cpu())
        if docs is not None and medium.per_item:
            docs = torch.repeat_interleave(docs, getattr(batch, medium.per_item).long().cpu())
        lengths = getattr(batch, medium.lengths).tolist() if medium.lengths else None
        for i, j in enumerate(docs.tolist() if docs is not None else range(len(tensors))):
            item = tensors[i]
            if lengths is not None:
                item = item.narrow(medium.axis, 0, int(lengths[i]))
            out.setdefault(j, []).append(item)
    return out


def row_digests(batch: Any) -> list[str]:
    """One sha256 (hex) per row: its ``row_tensors`` (tokens, labels, loss_mask, position_ids)
    then the media of the row's documents (the batch's ``media``, each cut to its valid length),
    each tensor as its shape, dtype and bytes. Independent of how a global batch is split into
    micro-batches: the lists of the parts concatenate to the list of the whole. ``TypeError``
    for a batch whose class declares no tensors."""
    rows, media = _declared(batch)
    by_doc = _media_by_doc(batch, media)
    doc = 0
    out = []
    for i, n_docs in enumerate(batch.num_docs.tolist()):
        d = hashlib.sha256()
        tensors = [getattr(batch, name)[i] for name in rows]
        for j in range(doc, doc + n_docs):
            tensors += by_doc.get(j, [])
        doc += n_docs
        for t in tensors:
            t = t.detach().cpu().contiguous()
            d.update(f"{tuple(t.shape)}:{t.dtype}".encode())
            d.update(t.numpy().tobytes())
        out.append(d.hexdigest())
    return out


def device_fields(batch: Any) -> tuple[str, ...]:
    """The fields of ``batch`` a trainer moves to its device (its class's ``device_fields()``:
    the text rows, ``cu_seqlens``, each medium and its valid lengths); none for a batch that does
    not say."""
    fields = getattr(type(batch), "device_fields", None)
    return tuple(fields()) if callable(fields) else ()


def tensors_of(batch: Any) -> dict[str, Any]:
    """Every tensor field of ``batch`` by name: a dataclass's fields in order, another object's
    attributes sorted by name."""
    torch = sys.modules.get("torch")
    names = (
        [f.name for f in dataclasses.fields(batch)]
        if dataclasses.is_dataclass(batch)
        else sorted(vars(batch))
    )
    values = {name: getattr(batch, name) for name in names}
    return {k: v for k, v in values.items() if torch is not None and isinstance(v, torch.Tensor)}
