"""Human-readable summary of a batch: field shapes and dtypes, and a few documents decoded back
to text (for ``make demo`` and debugging)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def preview_batch(encoder: Any, batch: Any, max_docs: int = 2, max_chars: int = 80) -> str:
    """One line per field (``name: dtype (shape)`` for tensors), then up to ``max_docs`` documents
    as ``key: text`` decoded from the batch's tokens with the encoder's tokenizer."""
    lines = [type(batch).__name__]
    for field in dataclasses.fields(batch):
        if field.name.startswith("__"):
            continue
        value = getattr(batch, field.name)
        if isinstance(value, torch.Tensor):
            lines.append(f"  {field.name}: {str(value.dtype).replace('torch.', '')} {tuple(value.shape)}")
        elif field.name != "keys":
            lines.append(f"  {field.name}: {value!r}")
    flat = batch.tokens.flatten()
    for j, key in enumerate(batch.keys[:max_docs]):
        start = int(batch.cu_seqlens[j])
        text = encoder.tokenizer.decode(flat[start:start + int(batch.doc_lengths[j])])
        lines.append(f"  {key}: {text[:max_chars]!r}")
    return "\n".join(lines)
