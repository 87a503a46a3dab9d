"""Layouts known before any loader exists: whether a world size can split the global batch, and
the gradient-accumulation steps a `TrainLoader` will have."""

from __future__ import annotations

from energon_platform.config import RunConfig
from energon_platform.loader.schedule import Schedule


def check_layout(cfg: RunConfig, world_size: int) -> None:
    """Refuse, before anything runs, a world size that cannot reproduce the run's global batches."""
    Schedule.check_split(cfg.loader.global_batch_size, 1, world_size, cfg.loader.micro_batch_size)


def gradient_accumulation_steps(cfg: RunConfig, world_size: int = 1) -> int:
    """Micro-batches per global batch on each of ``world_size`` data-parallel ranks: the
    ``TrainLoader.accumulation`` that ``TrainLoader(cfg, world_size=world_size)`` will have, known
    before any loader (or trainer) exists, e.g. for ``Accelerator(gradient_accumulation_steps=...)``
    or ``Trainer(accumulate_grad_batches=...)``.
    [`LayoutError`][energon_platform.loader.train_loader.LayoutError] for a world size that cannot
    split the global batch."""
    per_rank = Schedule.check_split(
        cfg.loader.global_batch_size, 1, world_size, cfg.loader.micro_batch_size
    )
    return per_rank // (cfg.loader.micro_batch_size or per_rank)


__all__ = ["check_layout", "gradient_accumulation_steps"]
