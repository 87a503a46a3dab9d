"""Train and validation loaders built from a run config.

:class:`TrainLoader` is an iterator of micro-batches with the ``Stateful`` protocol of
``torch.distributed.checkpoint`` (``state_dict``/``load_state_dict``). Its state is a
:class:`~energon_platform.state.LoaderState` as a plain dict. Restoring costs the same as starting
(no replay), works with another number of workers, and with another data-parallel world size when
that world size divides the global batch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from energon_platform.batches import MicroBatchMaker, MicroBatchStream
from energon_platform.config import RunConfig
from energon_platform.schedule import LayoutError, Schedule
from energon_platform.source import SampleSource
from energon_platform.state import STATE_VERSION, LoaderState, StateMismatchError, check_fingerprint


def build_encoder(cfg: RunConfig, training: bool = True) -> Any:
    """The task encoder named by the config, seeded with the loader's seed."""
    from task_encoders.registry import get_encoder

    return get_encoder(cfg.encoder, seed=cfg.loader.seed, training=training)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class TrainLoader:
    """Micro-batches of one data-parallel rank; infinite (epochs follow each other).

    Args:
        cfg: run config (``data``, ``encoder``, ``loader``).
        rank, world_size: this rank's data-parallel coordinates.
        num_workers: overrides ``cfg.loader.num_workers`` (may differ from the saved run).
    """

    def __init__(self, cfg: RunConfig, rank: int = 0, world_size: int = 1, num_workers: int | None = None):
        lc = cfg.loader
        self.rank, self.world_size = rank, world_size
        self.num_workers = lc.num_workers if num_workers is None else num_workers
        self.prefetch_factor = lc.prefetch_factor
        self.source = SampleSource(str(cfg.data.path), cfg.data.train_split)
        self.encoder = build_encoder(cfg)
        pack_group = _pack_group(lc.pack_group, self.encoder, cfg.source)
        self.schedule = Schedule(self.source.shard_counts, lc.seed, lc.global_batch_size, pack_group,
                                 lc.shuffle_buffer)
        per_rank = self.schedule.check_world_size(world_size, lc.micro_batch_size)
        micro = lc.micro_batch_size or per_rank
        self.maker = MicroBatchMaker(self.source, self.encoder, self.schedule, rank, world_size, micro)
        self.fingerprint = {
            "dataset": self.source.identity(),
            "encoder": {"name": type(self.encoder).__name__, "config_sha": _digest(_encoder_config(self.encoder))},
            "seed": lc.seed,
            "global_batch_size": lc.global_batch_size,
            "pack_group": pack_group,
            "shuffle_buffer": lc.shuffle_buffer,
        }
        self.next_microbatch = 0
        self._iter = None

    # --- iteration --------------------------------------------------------------------------

    @property
    def accumulation(self) -> int:
        """Micro-batches per global batch on this rank (gradient-accumulation steps)."""
        return self.maker.accumulation

    @property
    def global_batch(self) -> int:
        """Index of the global batch the next micro-batch belongs to."""
        return self.next_microbatch // self.accumulation

    def _start(self):
        stream = MicroBatchStream(self.maker, self.next_microbatch)
        kwargs = {}
        if self.num_workers > 0:
            kwargs = {"prefetch_factor": self.prefetch_factor, "multiprocessing_context": "fork"}
        # a private generator: creating the iterator would otherwise draw from the global torch RNG
        # (its base seed), which the trainer's dropout uses and a resume restores
        loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=self.num_workers,
                                             pin_memory=torch.cuda.is_available(), generator=torch.Generator(),
                                             **kwargs)
        return iter(loader)

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        if self._iter is None:
            self._iter = self._start()
        c, batch = next(self._iter)
        assert c == self.next_microbatch, f"micro-batch {c} arrived where {self.next_microbatch} was due"
        self.next_microbatch += 1
        return batch

    def close(self) -> None:
        """Stop the worker processes now (a new ``next()`` restarts them at the current position)."""
        shutdown = getattr(self._iter, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._iter = None

    # --- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return LoaderState(
            version=STATE_VERSION, fingerprint=self.fingerprint, next_microbatch=self.next_microbatch,
            accumulation=self.accumulation,
            layout={"rank": self.rank, "world_size": self.world_size, "num_workers": self.num_workers,
                    "micro_items": self.maker.micro_items},
        ).to_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue from a saved position. Raises :class:`StateMismatchError` for other data or
        config, :class:`LayoutError` for a layout that cannot continue the same global batches."""
        state = LoaderState.from_dict(state_dict)
        check_fingerprint(state.fingerprint, self.fingerprint)
        if state.mid_step and (state.accumulation != self.accumulation or state.layout.get("world_size") != self.world_size):
            raise LayoutError("the state was saved in the middle of a global batch (gradient accumulation); "
                              "resume it with the same world size and micro-batch size, or save at a step boundary")
        self.close()  # workers already started would produce the old position
        self.next_microbatch = state.next_global_batch * self.accumulation + (
            state.next_microbatch % state.accumulation if state.mid_step else 0)


def check_layout(cfg: RunConfig, world_size: int) -> None:
    """Refuse, before anything runs, a world size that cannot reproduce the run's global batches."""
    Schedule((1,), cfg.loader.seed, cfg.loader.global_batch_size).check_world_size(world_size,
                                                                                  cfg.loader.micro_batch_size)


def _pack_group(configured: int | None, encoder: Any, source: str) -> int:
    """Samples per pack group; checks that loader and encoder agree on whether to pack."""
    from task_encoders.config import ConfigError

    packs = getattr(encoder, "packing_buffer_size", None)
    if configured is None:
        return packs or 1
    if configured > 1 and not packs:
        raise ConfigError(source, "loader.pack_group", f"{configured} asks for packing, but the encoder's "
                          "packing.enabled is false (set it, or pack_group: 1)")
    if configured == 1 and packs:
        raise ConfigError(source, "loader.pack_group", "1 disables packing, but the encoder's packing.enabled is "
                          "true (use pack_group >= 2 or null)")
    return configured


def _encoder_config(encoder: Any) -> Any:
    from task_encoders.config import to_plain

    config = to_plain(getattr(encoder, "config", {}))
    if isinstance(config, dict):
        config.pop("seed", None)  # the loader's seed is fingerprinted on its own
        config.pop("errors", None)  # skip limits do not change the data
    return config


def build_val_loader(cfg: RunConfig, batch_size: int, rank: int = 0, world_size: int = 1):
    """Energon's own validation loader over ``data.val_split`` (no shuffling, no state), or None."""
    from megatron.energon import get_loader, get_val_dataset

    import yaml

    split = Path(cfg.data.path) / ".nv-meta" / "split.yaml"
    if not cfg.data.val_split or not yaml.safe_load(split.read_text())["split_parts"].get(cfg.data.val_split):
        return None
    encoder = build_encoder(cfg, training=False)
    wc = encoder.worker_config(rank=rank, world_size=world_size, num_workers=0)
    ds = get_val_dataset(str(cfg.data.path), split_part=cfg.data.val_split, batch_size=batch_size,
                         worker_config=wc, task_encoder=encoder, packing_buffer_size=encoder.packing_buffer_size)
    return get_loader(ds)


__all__ = ["TrainLoader", "build_val_loader", "build_encoder", "LayoutError", "StateMismatchError"]
