"""``torch.distributed.checkpoint`` (DCP) and torchtitan: the loader as one ``Stateful`` entry.

torchtitan checkpoints ``{"model", "optimizer", "lr_scheduler", "dataloader", ...}`` with
``dcp.save``/``dcp.load``; every value is a ``Stateful`` (``state_dict``/``load_state_dict``).
[`DCPLoader`][energon_platform.integrations.dcp.DCPLoader] wraps a
[`TrainLoader`][energon_platform.loader.train_loader.TrainLoader] for that:

* **One rank-independent entry.** At a step boundary the loader state means the same global
  position on every rank, so every rank writes the same key; DCP keeps one copy and every rank of
  a run with another world size reads it back (elastic resume, unlike torchtitan's own
  ``ParallelAwareDataloader``, which stores one pickle per dp rank and refuses a new dp size).
* **No pickle.** DCP stores non-tensor values with ``torch.save`` and loads them with
  ``weights_only=False``, i.e. by unpickling. The state is therefore carried as a ``uint8`` tensor
  of fixed capacity (`CAPACITY` bytes: UTF-8 JSON, zero-padded), which DCP loads in place as
  tensor data; the JSON is parsed and checked by [`LoaderState`][energon_platform.loader.state.LoaderState].
* **Mid-step saves** keep the same-layout rule of `TrainLoader.load_state_dict`.
* **Online mixing** (``loader.blend_adapt``): ``global_batch`` and ``report_losses`` pass through
  to the loader, so a loop reports each step's per-sample losses as with a bare `TrainLoader`
  (``step = loader.global_batch`` read before the step's ``next()`` calls;
  ``loader.report_losses(step, keys, losses)`` after the step, before its ``dcp.save``).
"""

from __future__ import annotations

import json
from typing import Any

import torch

from energon_platform.loader.state import StateMismatchError

__all__ = ["DCPLoader", "encode_state", "decode_state", "CAPACITY", "KEY"]

#: Bytes reserved for the loader state's JSON (a state is about 1-3 KB; blend histories grow it slowly).
CAPACITY = 1 << 16
KEY = "energon_platform_loader_state"


def encode_state(state: dict) -> torch.Tensor:
    """A loader state as a zero-padded ``uint8`` tensor of ``CAPACITY`` bytes."""
    raw = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
    if len(raw) >= CAPACITY:
        raise ValueError(
            f"the loader state is {len(raw)} bytes, more than the {CAPACITY} reserved in DCP checkpoints"
        )
    out = torch.zeros(CAPACITY, dtype=torch.uint8)
    out[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return out


def decode_state(tensor: torch.Tensor) -> dict:
    """The JSON state in ``tensor``
    ([`StateMismatchError`][energon_platform.integrations.dcp.StateMismatchError] if it is not
    one)."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise StateMismatchError(f"the checkpoint's {KEY} is not a uint8 byte tensor")
    raw = bytes(tensor.numpy().tobytes()).split(b"\0", 1)[0]
    try:
        return json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateMismatchError(f"the checkpoint's {KEY} is not a loader state: {e}") from None


class DCPLoader:
    """A `TrainLoader` as a DCP/torchtitan ``Stateful``; iterating it iterates the loader."""

    def __init__(self, loader: Any):
        self.loader = loader

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        return next(self.loader)

    @property
    def global_batch(self) -> int:
        """`TrainLoader.global_batch`: the global batch the next micro-batch belongs to."""
        return self.loader.global_batch

    def report_losses(self, step: int, keys: Any, losses: Any, group: Any = None) -> None:
        """`TrainLoader.report_losses`: global step ``step``'s per-sample losses of this rank."""
        self.loader.report_losses(step, keys, losses, group)

    def state_dict(self) -> dict:
        return {KEY: encode_state(self.loader.state_dict())}

    def load_state_dict(self, state_dict: dict) -> None:
        if KEY not in state_dict:
            raise StateMismatchError(f"the checkpoint has no {KEY} (keys: {sorted(state_dict)})")
        self.loader.load_state_dict(decode_state(state_dict[KEY]))

    def close(self) -> None:
        self.loader.close()
