"""DeepSpeed: the loader's state in ``engine.save_checkpoint(..., client_state=...)`` and back from
``engine.load_checkpoint``, and DeepSpeed's batch arithmetic taken from the loader:

    init_distributed()                                     # CPU: DeepSpeed's gloo backend
    loader = TrainLoader(cfg, rank=dist.get_rank(), world_size=dist.get_world_size())
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                      config={**batch_config(loader), "zero_optimization": {"stage": 2}})
    _, client = engine.load_checkpoint(save_dir)           # at resume (None, None: no checkpoint)
    restore_loader(loader, client)
    ...
    engine.save_checkpoint(save_dir, tag=f"step-{step}", client_state=client_state(loader))

* **Client state.** DeepSpeed writes ``client_state`` into the model-states file of data-parallel
  rank 0 and gives it back to every rank in ``load_checkpoint``. The loader state saved at a step
  boundary is the global position, the same on every rank, so rank 0's copy serves them all.
* **Batch arithmetic.** DeepSpeed checks that ``train_batch_size`` is the micro batch times the
  gradient accumulation times the world size, and steps the optimizer every
  ``gradient_accumulation_steps`` micro-batches;
  [`batch_config`][energon_platform.integrations.deepspeed.batch_config] takes those numbers from
  the loader, so a DeepSpeed step is one global batch.
* **One process without a launcher.** ``deepspeed.init_distributed`` outside ``torchrun`` or the
  ``deepspeed`` launcher looks for MPI (``mpi4py``);
  [`init_distributed`][energon_platform.integrations.deepspeed.init_distributed] gives a lone
  process the environment of a world of one instead.
* **Restore** is ``load_state_dict``: as fast as a fresh start at any position (no replay).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from energon_platform.loader.train_loader import TrainLoader

__all__ = ["init_distributed", "batch_config", "client_state", "restore_loader", "KEY"]


def init_distributed(dist_backend: str = "gloo") -> None:
    """``deepspeed.init_distributed(dist_backend)``; a process started without a launcher (no
    ``RANK`` in the environment) becomes rank 0 of a world of one on a free local port."""
    import deepspeed  # only here: DeepSpeed is an install of its own (a test dependency)

    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
    deepspeed.init_distributed(dist_backend=dist_backend)


#: The key of the loader state in DeepSpeed's ``client_state``.
KEY = "energon_loader"


def batch_config(loader: TrainLoader) -> dict:
    """The batch keys of a DeepSpeed config that match ``loader`` (this rank's micro-batch size,
    micro-batches per global batch, and the global batch in micro-batch items)."""
    micro, accumulation = loader.maker.micro_items, loader.accumulation
    return {
        "train_batch_size": micro * accumulation * loader.world_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
    }


def client_state(loader: TrainLoader, **extra: Any) -> dict:
    """``client_state`` for ``engine.save_checkpoint``: the loader state (plain JSON data) under
    `KEY`, plus ``extra`` (e.g. the step)."""
    return {KEY: loader.state_dict(), **extra}


def restore_loader(loader: TrainLoader, client: dict | None) -> bool:
    """Restore ``loader`` from the ``client_state`` that ``engine.load_checkpoint`` returned; False
    when there was no checkpoint (``None``). A checkpoint without the loader's state is an error."""
    if client is None:
        return False
    if KEY not in client:
        raise KeyError(
            f"the DeepSpeed checkpoint's client_state has no {KEY!r}: it was not saved with client_state(loader)"
        )
    loader.load_state_dict(client[KEY])
    return True
