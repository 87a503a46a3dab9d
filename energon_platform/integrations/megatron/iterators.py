"""The iterators Megatron-LM's training loop pulls micro-batches from: the train iterator over one
rank's `TrainLoader`, and the cycling validation iterator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from megatron.energon import LimitDataset, RepeatDataset, get_loader, get_val_dataset

from energon_platform.config import RunConfig
from energon_platform.integrations.megatron.batches import (
    BATCH_FORMATS,
    BatchFormat,
    to_megatron_batch,
)
from energon_platform.loader.schedule import LayoutError
from energon_platform.loader.train_loader import TrainLoader, build_encoder


class MegatronTrainIterator:
    """Megatron's view of one rank's `TrainLoader` (the part of ``EnergonDataloader`` it uses).

    ``next()`` → the next micro-batch as `to_megatron_batch` dict; ``save_state()`` → the
    loader's plain state dict. Infinite: epochs follow each other. ``loader`` is the
    `TrainLoader`; ``last_keys`` the sample keys of the last micro-batch (for logs),
    ``last_batch`` the encoder's batch it was made from.

    Online mixing (``loader.blend_adapt``): `report_losses` takes each training micro-batch's
    per-sample losses (from `sample_losses`, e.g. in Megatron's ``loss_func``) and reports the
    iteration's to the loader once its last micro-batch is in.
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
        self.packed = loader.plan.batching.packed if packed is None else packed
        self.max_sequence_length = max_sequence_length
        self.last_keys: list[str] = []
        self.last_batch: Any = None
        self._reset_reports()

    def _reset_reports(self) -> None:
        """The next micro-batch to report is the loader's next one (at build or restore)."""
        self._reported = self.loader.next_microbatch
        self._pending: tuple[list, list] = ([], [])

    def report_losses(self, keys: Sequence[str], losses: Any, group: Any = None) -> None:
        """One training micro-batch's per-sample losses: ``keys`` its ``batch["__key__"]`` (or
        ``last_keys`` for the ``gpt`` format), ``losses`` aligned with them (`sample_losses`).
        Call it for every training micro-batch, in the order they were drawn, on every
        data-parallel rank that has the iterator, before the iteration's checkpoint (in
        ``loss_func``, not for validation batches). When the iteration's last micro-batch
        (`accumulation`) is in, this rank's keys and losses of the whole global batch go to
        `TrainLoader.report_losses` with ``group``, the data-parallel process group:

            def loss_func(batch, output_tensor):
                train_iter.report_losses(
                    batch["__key__"], sample_losses(batch, output_tensor),
                    group=parallel_state.get_data_parallel_group(),
                )
                ...

        Without ``loader.blend_adapt`` it does nothing. With pipeline parallelism the losses
        exist on the last stage only, but the first stage's loaders draw with the mixed weights
        too: they must get the same reports (not provided here)."""
        if self.loader.adapter is None:
            return
        self._pending[0].extend(keys)
        self._pending[1].extend(float(v) for v in losses)
        self._reported += 1
        if self._reported % self.accumulation == 0:
            (keys, losses), self._pending = self._pending, ([], [])
            self.loader.report_losses(self._reported // self.accumulation - 1, keys, losses, group)

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
        self._reset_reports()

    def close(self) -> None:
        """Stop the loader's worker processes (``next()`` restarts them at the same position)."""
        self.loader.close()


class MegatronValidIterator:
    """Validation micro-batches for Megatron's ``evaluate()``: Energon's validation loader over
    ``data.val_split`` (evaluation transforms, no shuffling, this rank's share), converted by
    `to_megatron_batch`, cycling. With ``restart_every`` (``eval_iters`` × micro-batches per
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
        self._pass = None
        self.last_keys: list[str] = []

    def __iter__(self) -> MegatronValidIterator:
        return self

    def __next__(self) -> dict:
        for _attempt in range(2):
            if self._pass is None:
                self._pass = iter(self._loader)
            try:
                batch = next(self._pass)
                break
            except StopIteration:  # the end of a pass: start the next one (Megatron's cyclic_iter)
                self._pass = None
        else:
            raise RuntimeError("the validation split gives this rank no batch")
        self.last_keys = list(batch.keys)
        return to_megatron_batch(batch, self.batch_format, packed=self.packed)

    def save_state(self) -> None:
        return None

    def close(self) -> None:
        self._pass = None
