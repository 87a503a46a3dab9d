"""PyTorch Lightning: return a [`TrainLoader`][energon_platform.loader.train_loader.TrainLoader]
from ``train_dataloader()`` and mix
[`EnergonHooks`][energon_platform.integrations.lightning.EnergonHooks] into the ``LightningModule``:

    class Model(EnergonHooks, L.LightningModule):
        def train_dataloader(self):
            return TrainLoader(cfg, rank=self.global_rank, world_size=self.trainer.world_size)

What Lightning needs from us, and what the mixin does:

* **Device moves.** Our batches are Energon ``@edataclass`` types (frozen dataclasses), which
  Lightning's ``apply_to_collection`` cannot rebuild field by field; each batch type has
  ``.to(device)``, which Lightning's default ``transfer_batch_to_device`` calls (a module without
  the mixin moves them so too), and the mixin's ``transfer_batch_to_device`` moves them with
  [`to_device`][energon_platform.integrations.device.to_device].
* **The loader state in Lightning's checkpoint.** Lightning stores ``state_dict()`` of a stateful
  train loader in its checkpoint (``checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]``,
  a list of one state) and restores it in ``trainer.fit(ckpt_path=...)`` (no replay), but it takes
  that state after fetching one batch ahead (its prefetch): resumed so, a run would skip a batch.
  ``on_save_checkpoint`` replaces that record with the state at the micro-batches actually
  trained: `TrainLoader.state_at` of the loader's position less the batches Lightning's
  fetcher holds (Lightning 2.6). Without the mixin, Lightning's request for the loader's state
  is refused (``RuntimeError`` naming ``EnergonHooks``) at the first checkpoint: importing this
  module (which a `TrainLoader` does when it starts while Lightning is imported) wraps the
  method of Lightning's ``CombinedLoader`` that collects its loaders' states (``lightning``'s;
  ``pytorch_lightning``'s when imported first or alone), which then checks that a `TrainLoader`
  among them has the mixin's mark (``lightning_hooks``).
* **The random state.** Lightning's checkpoint holds no RNG state, so dropout (or any draw from
  the global generators) after a resume would differ from the uninterrupted run. The mixin saves
  the torch (CPU and CUDA), NumPy and Python generators of every rank under
  ``checkpoint[RNG_KEY]`` and restores this rank's at ``on_train_start``, after Lightning's
  restore and its first prefetch, before the first resumed step. On another number of processes
  a rank without a saved state keeps its own (the draws then differ).
* **Step boundaries.** ``on_train_start`` refuses ``accumulate_grad_batches`` other than the loader's
  ``accumulation``, so that an optimizer step is one global batch and checkpoints fall between them.
* **Online mixing** (``loader.blend_adapt``): the loader wants every global step's per-sample
  losses of every rank, numbered by global batch, before that step's checkpoint. Call
  ``self.report_losses(batch.keys, sample_losses)`` in ``training_step``, once per micro-batch, on
  every rank: the mixin numbers the micro-batch by the loader's position less the batch Lightning
  fetched ahead (as for the checkpoint) and, at the global batch's last micro-batch, passes this
  rank's keys and losses of the whole global batch to `TrainLoader.report_losses` (``group``: the
  data-parallel process group; None, the default group, is DDP's). Not in ``on_train_batch_end``:
  Lightning runs the callbacks' ``on_train_batch_end`` (``ModelCheckpoint`` saves there) before the
  module's, so a report there would come after the step's checkpoint. Lightning's one batch ahead
  needs ``blend_adapt.lag`` of at least 1 (with 0 it fetches a batch whose weights wait for the
  losses of the step in training: `AdaptError`). Without ``blend_adapt`` the call does nothing.

Another number of devices at resume works where it divides the global batch (the state is the
global position; Lightning writes rank 0's). A user's own ``on_save_checkpoint``/
``on_load_checkpoint``/``on_train_start``/``transfer_batch_to_device`` must call ``super()``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import random
import sys
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from energon_platform.integrations.device import to_device
from energon_platform.loader.train_loader import TrainLoader

__all__ = ["EnergonHooks", "RNG_KEY"]

#: The key of every rank's random state in Lightning's checkpoint.
RNG_KEY = "energon_platform_rng"

#: the modules of Lightning's ``CombinedLoader`` (the package and its older name)
COMBINED_LOADERS = (
    "lightning.pytorch.utilities.combined_loader",
    "pytorch_lightning.utilities.combined_loader",
)


def _refusing_without_hooks(state_dicts: Any) -> Any:
    """``CombinedLoader._state_dicts`` that refuses a `TrainLoader` without `EnergonHooks`: Lightning
    saves its state after fetching one batch ahead, so resumed from it a run skips a batch."""

    @functools.wraps(state_dicts)
    def checked(self: Any) -> list:
        for loader in self.flattened:
            if isinstance(loader, TrainLoader) and not loader.lightning_hooks:
                raise RuntimeError(
                    "Lightning is checkpointing a TrainLoader one prefetched batch ahead (a resume "
                    "would skip a batch): mix energon_platform.integrations.lightning.EnergonHooks "
                    "into the LightningModule, before it (class Model(EnergonHooks, L.LightningModule))"
                )
        return state_dicts(self)

    checked.energon_checked = True
    return checked


def _guard_combined_loaders() -> None:
    """Wrap ``_state_dicts`` of Lightning's ``CombinedLoader`` (once): ``lightning``'s, and
    ``pytorch_lightning``'s when it is imported already or the only one installed."""
    installed = [n for n in COMBINED_LOADERS if importlib.util.find_spec(n.split(".")[0])]
    for name in installed:
        if name != installed[0] and name.split(".")[0] not in sys.modules:
            continue
        combined = getattr(importlib.import_module(name), "CombinedLoader", None)
        method = getattr(combined, "_state_dicts", None)
        if method is not None and not getattr(method, "energon_checked", False):
            combined._state_dicts = _refusing_without_hooks(method)


_guard_combined_loaders()


def _rng_state() -> dict:
    """This process's torch (CPU, and CUDA when present), NumPy and Python random states, as
    tensors and plain values (a checkpoint loaded with ``weights_only=True`` accepts them)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }


def _set_rng_state(state: dict) -> None:
    """Restore what `_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))


def _every_rank(value: Any) -> list:
    """``value`` of every rank, in rank order (this one's alone outside a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


class EnergonHooks:
    """LightningModule mixin (put it before ``L.LightningModule``) for a ``train_dataloader()`` that
    returns a ``TrainLoader``."""

    def _energon_loader(self) -> TrainLoader | None:
        loader = self.trainer.train_dataloader
        return loader if isinstance(loader, TrainLoader) else None

    def on_train_start(self) -> None:
        super().on_train_start()
        loader = self._energon_loader()
        if loader is not None:
            if self.trainer.accumulate_grad_batches != loader.accumulation:
                raise ValueError(
                    f"Trainer(accumulate_grad_batches={self.trainer.accumulate_grad_batches}) but the "
                    f"loader makes {loader.accumulation} micro-batch(es) per global batch on each rank: "
                    f"set accumulate_grad_batches={loader.accumulation}"
                )
            loader.lightning_hooks = True  # on_save_checkpoint corrects the state Lightning takes
        saved = getattr(self, "_energon_rng", None)
        if saved is not None and self.global_rank < len(saved):
            _set_rng_state(saved[self.global_rank])
        self._energon_rng = None

    def report_losses(self, keys: Any, losses: Any, group: Any = None) -> None:
        """The per-sample ``losses`` of the micro-batch in ``training_step`` (``keys``: its
        ``batch.keys``, aligned): reported to the loader with the global batch's last micro-batch
        (see the module doc). Call it once per training micro-batch on every rank."""
        loader = self._energon_loader()
        if loader is None or loader.adapter is None:
            return
        # the micro-batch in training: the loader's position less what Lightning fetched ahead
        ahead = len(getattr(self.trainer.fit_loop._data_fetcher, "batches", ()))
        micro = loader.next_microbatch - ahead - 1
        if micro % loader.accumulation == 0 or not hasattr(self, "_energon_reports"):
            self._energon_reports = ([], [])
        pending_keys, pending_losses = self._energon_reports
        pending_keys.extend(keys)
        pending_losses.extend(float(v) for v in losses)
        if (micro + 1) % loader.accumulation == 0:
            step = micro // loader.accumulation
            loader.report_losses(step, pending_keys, pending_losses, group)

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        return to_device(batch, device)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        # applied at on_train_start, before the first step
        self._energon_rng = checkpoint.get(RNG_KEY)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        # every rank runs this hook; rank 0 writes the file
        checkpoint[RNG_KEY] = _every_rank(_rng_state())
        loader = self._energon_loader()
        fit = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        if loader is None or "combined_loader" not in fit:
            return
        if len(fit["combined_loader"]) != 1:
            raise ValueError(
                "train_dataloader() must return the TrainLoader itself (one stateful loader), "
                f"not {len(fit['combined_loader'])} stateful loaders"
            )
        # the batches Lightning's fetcher holds are fetched from the loader but not trained yet
        ahead = len(getattr(self.trainer.fit_loop._data_fetcher, "batches", ()))
        fit["combined_loader"] = [loader.state_at(loader.next_microbatch - ahead)]
