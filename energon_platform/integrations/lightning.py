"""PyTorch Lightning: return a :class:`~energon_platform.loader.train_loader.TrainLoader` from
``train_dataloader()`` and mix :class:`EnergonHooks` into the ``LightningModule``::

    class Model(EnergonHooks, L.LightningModule):
        def train_dataloader(self):
            return TrainLoader(cfg, rank=self.global_rank, world_size=self.trainer.world_size)

What Lightning needs from us, and what the mixin does:

* **Device moves.** Our batches are Energon ``@edataclass`` types, which Lightning's
  ``apply_to_collection`` refuses ("A frozen dataclass was passed ..."); ``transfer_batch_to_device``
  moves them with :func:`~energon_platform.integrations.device.to_device`.
* **The loader state in Lightning's checkpoint.** Lightning stores ``state_dict()`` of a stateful
  train loader in its checkpoint and restores it in ``trainer.fit(ckpt_path=...)`` (no replay), but
  it takes that state after fetching one batch ahead (its prefetch): resumed so, a run would skip a
  batch. ``on_save_checkpoint`` replaces that record with the state at the micro-batches actually
  trained: :meth:`TrainLoader.state_at` of the loader's position less the batches Lightning's
  fetcher holds (Lightning 2.6).
* **Step boundaries.** ``on_train_start`` refuses ``accumulate_grad_batches`` other than the loader's
  ``accumulation``, so that an optimizer step is one global batch and checkpoints fall between them.

Another number of devices at resume works where it divides the global batch (the state is the
global position; Lightning writes rank 0's). A user's own ``on_save_checkpoint``/``on_train_start``/
``transfer_batch_to_device`` must call ``super()``.
"""

from __future__ import annotations

from typing import Any

from energon_platform.integrations.device import to_device
from energon_platform.loader.train_loader import TrainLoader

__all__ = ["EnergonHooks"]


class EnergonHooks:
    """LightningModule mixin (put it before ``L.LightningModule``) for a ``train_dataloader()`` that
    returns a ``TrainLoader``."""

    def _energon_loader(self) -> TrainLoader | None:
        loader = self.trainer.train_dataloader
        return loader if isinstance(loader, TrainLoader) else None

    def on_train_start(self) -> None:
        super().on_train_start()
        loader = self._energon_loader()
        if loader is not None and self.trainer.accumulate_grad_batches != loader.accumulation:
            raise ValueError(f"Trainer(accumulate_grad_batches={self.trainer.accumulate_grad_batches}) but the loader "
                             f"makes {loader.accumulation} micro-batch(es) per global batch on each rank: set "
                             f"accumulate_grad_batches={loader.accumulation}")

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        return to_device(batch, device)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        loader = self._energon_loader()
        fit = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        if loader is None or "combined_loader" not in fit:
            return
        if len(fit["combined_loader"]) != 1:
            raise ValueError("train_dataloader() must return the TrainLoader itself (one stateful loader), "
                             f"not {len(fit['combined_loader'])} stateful loaders")
        # the batches Lightning's fetcher holds are fetched from the loader but not trained yet
        ahead = len(getattr(self.trainer.fit_loop._data_fetcher, "batches", ()))
        fit["combined_loader"] = [loader.state_at(loader.next_microbatch - ahead)]

