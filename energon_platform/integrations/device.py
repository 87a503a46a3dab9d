"""Moving a batch to a device, whatever the trainer.

Our batches are Energon ``@edataclass`` types: frozen dataclasses, which generic movers that assign
fields refuse (Lightning's ``apply_to_collection``: "A frozen dataclass was passed ..."). Each batch
type has ``.to(device)``, which such movers call instead (Lightning's default
``transfer_batch_to_device`` does); [`to_device`][energon_platform.integrations.device.to_device]
moves a batch, or anything holding batches and tensors, by building moved copies with
``dataclasses.replace``.
"""

from __future__ import annotations

from typing import Any

import torch

from task_encoders.documents import moved

__all__ = ["to_device"]


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor moved to ``device``: tensors, dataclasses (frozen ones
    included: a new instance of the same type), dicts, lists and tuples, nested; anything else is
    returned as it is (sample keys, ints). A tensor already on ``device`` is not copied."""
    return moved(batch, device, non_blocking)
