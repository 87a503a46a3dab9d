"""Making one micro-batch: schedule positions → Energon samples → task encoder → batch.

Runs the task encoder's hooks in Energon's order: ``encode_sample`` (or ``preencode_sample``),
with packing ``select_samples_to_pack`` → ``postencode_sample`` → ``pack_selected_samples``, then
``batch`` → ``encode_batch``. A sample that fails to load or encode is skipped and reported to the
encoder's error handler (``task_encoders.skipping.SkipPolicy``), which stops a flood; since
failures are a function of the sample, the skip is the same on every layout and every resume.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Iterable

import torch

from energon_platform.schedule import Schedule
from energon_platform.source import SampleSource

log = logging.getLogger(__name__)


def _overridden(encoder: Any, name: str) -> bool:
    from megatron.energon import DefaultTaskEncoder

    return getattr(type(encoder), name) is not getattr(DefaultTaskEncoder, name)


def _as_list(result: Any) -> list:
    return list(result) if inspect.isgenerator(result) else [result]


class MicroBatchMaker:
    """``maker(c)`` builds micro-batch ``c`` of one data-parallel rank (a pure function of ``c``).

    Micro-batch ``c`` is part ``c % accumulation`` of the rank's share of global batch
    ``c // accumulation``. With packing (``schedule.group_size > 1``) each item is a group of
    samples that the encoder packs into one or more sequences.
    """

    def __init__(self, source: SampleSource, encoder: Any, schedule: Schedule, rank: int, world_size: int,
                 micro_items: int):
        self.source, self.encoder, self.schedule = source, encoder, schedule
        self.items = schedule.rank_items(rank, world_size)
        if len(self.items) % micro_items:
            raise ValueError(f"{len(self.items)} items per rank cannot be cut into micro-batches of {micro_items}")
        self.micro_items = micro_items
        self.accumulation = len(self.items) // micro_items
        self.packing = schedule.group_size > 1
        encode_name = "preencode_sample" if _overridden(encoder, "preencode_sample") else "encode_sample"
        self._encode = getattr(encoder, encode_name)
        self._postencode = encoder.postencode_sample if _overridden(encoder, "postencode_sample") else None
        self._handler = getattr(encoder, "skip_policy", None)

    def _skip(self, exc: Exception, what: Any) -> None:
        if self._handler is not None:
            self._handler(exc, what)
        else:
            log.warning("skipped %s: %s: %s", getattr(what, "__key__", what), type(exc).__name__, exc)

    def _load_encoded(self, epoch: int, index: int) -> list:
        try:
            sample = self.source[index]
        except Exception as e:  # undecodable media, missing member: skip and count
            self._skip(e, {"__key__": f"#{index}"})
            return []
        sample.__subflavors__ = {**(sample.__subflavors__ or {}), "epoch": epoch}
        try:
            return _as_list(self._encode(sample))
        except Exception as e:
            from megatron.energon.errors import FatalSampleError

            if isinstance(e, FatalSampleError):
                raise
            self._skip(e, sample)
            return []

    def _pack(self, encoded: list) -> list:
        packs = []
        for selected in self.encoder.select_samples_to_pack(encoded):
            if self._postencode is not None:
                selected = [s for x in selected for s in _as_list(self._postencode(x))]
            packs.append(self.encoder.pack_selected_samples(selected))
        return packs

    def item_ids(self, c: int) -> tuple[int, Iterable[int]]:
        """``(global batch, item ids)`` of micro-batch ``c``."""
        batch, part = divmod(c, self.accumulation)
        first = self.items.start + part * self.micro_items
        return batch, range(first, first + self.micro_items)

    def __call__(self, c: int) -> Any:
        """Encoding runs with one intra-op thread, as in DataLoader workers (PyTorch sets 1 there):
        float kernels split work by thread count, so this keeps tensors bit-identical with 0 or N
        workers."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._make(c)
        finally:
            torch.set_num_threads(threads)

    def _make(self, c: int) -> Any:
        batch, item_ids = self.item_ids(c)
        samples = []
        for item in item_ids:
            encoded = [e for epoch, idx in self.schedule.item_samples(batch, item) for e in self._load_encoded(epoch, idx)]
            samples += self._pack(encoded) if self.packing and encoded else encoded
        if not samples:
            raise RuntimeError(f"micro-batch {c} (global batch {batch}): every sample failed; see the log")
        out = self.encoder.batch(samples)
        out = self.encoder.encode_batch(out)
        return next(out) if inspect.isgenerator(out) else out


class MicroBatchStream(torch.utils.data.IterableDataset):
    """Micro-batches ``start, start+1, ...`` of one rank, split over DataLoader workers.

    Worker ``w`` of ``W`` yields ``start + w``, ``start + w + W``, ...; the DataLoader reads its
    workers round-robin, so the main process sees them in order. Infinite: training streams
    cross epochs (see :mod:`energon_platform.schedule`).
    """

    def __init__(self, maker: MicroBatchMaker, start: int):
        super().__init__()
        self.maker, self.start = maker, start

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (info.id, info.num_workers) if info is not None else (0, 1)
        c = self.start + w
        while True:
            yield c, self.maker(c)
            c += n
