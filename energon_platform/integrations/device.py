"""Moving a batch to a device, whatever the trainer.

Our batches are Energon ``@edataclass`` types: frozen dataclasses, which generic movers refuse
(Lightning's ``apply_to_collection``: "A frozen dataclass was passed ..."). :func:`to_device`
builds a moved copy instead, with ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor moved to ``device``: tensors, dataclasses (frozen ones
    included: a new instance of the same type), dicts, lists and tuples, nested; anything else is
    returned as it is (sample keys, ints). A tensor already on ``device`` is not copied."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: to_device(getattr(batch, f.name), device, non_blocking)
                   for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **changes)
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device, non_blocking)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    if isinstance(batch, tuple):  # a namedtuple
        return type(batch)(*(to_device(v, device, non_blocking) for v in batch))
    return batch
