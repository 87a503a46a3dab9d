"""The validation loader: Energon's own loader over ``data.val_split``, no shuffling, no state."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import yaml
from megatron.energon import get_val_dataset
from megatron.energon.savable_loader import BasicDataLoader

from energon_platform.config import RunConfig
from energon_platform.loader.datasets import is_metadataset
from energon_platform.loader.run_plan import build_encoder
from energon_platform.loader.source import split_parts


def _val_splits(path: str) -> list[str]:
    """The splits ``data.val_split`` may name for ``path``: a metadataset's ``splits`` keys, or
    the split parts of a dataset's ``.nv-meta/split.yaml`` that list at least one shard."""
    if is_metadataset(path):
        return list((yaml.safe_load(Path(path).read_text()) or {}).get("splits", {}))
    return split_parts(path)  # a folder or msc:// URL


def _warn_no_val_split(cfg: RunConfig, splits: list[str]) -> None:
    """One line on stderr: the run names a validation split its dataset lacks, so it validates
    nothing (logs no ``val_loss``)."""
    print(
        f"warning: data.val_split {cfg.data.val_split!r} is not a split of {cfg.data.path} "
        f"(it has: {', '.join(splits) or 'none'}); the run skips validation (set data.val_split "
        f"to one of them, or to null to skip it without this warning)",
        file=sys.stderr,
        flush=True,
    )


def build_val_loader(cfg: RunConfig, batch_size: int, rank: int = 0, world_size: int = 1):
    """Energon's own validation loader over ``data.val_split`` (no shuffling, no state), or None
    when ``data.val_split`` is null or the dataset has no such split (then rank 0 warns on stderr,
    naming the split, the dataset and the splits it has). A metadataset validates over its own
    ``val_split`` split (Energon concatenates its datasets, weights ignored), when it defines one.

    The loader reads in the caller's process (no workers) and leaves garbage collection to it:
    ``get_loader`` would wrap the dataset in Energon's ``GcDataset``, whose full ``gc.collect()``
    at the start of every pass scans the whole trainer's heap (about 0.2 s per evaluation on
    CPU, most of a small run's evaluation time)."""
    if not cfg.data.val_split:
        return None
    splits = _val_splits(str(cfg.data.path))
    if cfg.data.val_split not in splits:
        if rank == 0:
            _warn_no_val_split(cfg, splits)
        return None
    encoder = build_encoder(cfg, training=False)
    wc = encoder.worker_config(rank=rank, world_size=world_size, num_workers=0)
    ds = get_val_dataset(
        str(cfg.data.path),
        split_part=cfg.data.val_split,
        batch_size=batch_size,
        worker_config=wc,
        task_encoder=encoder,
        packing_buffer_size=encoder.packing_buffer_size,
    )
    loader = BasicDataLoader(ds, gc_collect_every_n_steps=0)
    # Energon always asks for it; without CUDA torch warns at each pass
    loader.pin_memory = torch.cuda.is_available()
    return loader


__all__ = ["build_val_loader"]
