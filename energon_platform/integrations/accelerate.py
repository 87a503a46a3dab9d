"""Hugging Face Accelerate: the loader's state inside ``accelerator.save_state``/``load_state``,
restored in O(1), and the loader kept out of ``accelerator.prepare``:

    cfg = load_config("run.yaml")
    world = int(os.environ.get("WORLD_SIZE", 1))                  # set by accelerate launch / torchrun
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=gradient_accumulation_steps(cfg, world))
    model, optimizer = accelerator.prepare(model, optimizer)      # not the loader
    loader = prepare_loader(accelerator, cfg)                     # this process's TrainLoader
    accelerator.load_state(ckpt)     # at resume: model, optimizer, RNG ... and the loader
    ...
    accelerator.save_state(ckpt)     # at a step boundary

What Accelerate would otherwise do, and what
[`prepare_loader`][energon_platform.integrations.accelerate.prepare_loader] does instead:

* **No double sharding.** ``prepare`` wraps a ``DataLoader`` to shard it across processes (or to
  dispatch from rank 0). Our loader is already per data-parallel rank (``rank=process_index``,
  ``world_size=num_processes``), so it is never passed to ``prepare`` (``prepare`` would return a
  ``TrainLoader`` unchanged anyway: it is not a ``DataLoader``).
* **No replay.** Accelerate resumes a prepared loader with ``skip_first_batches``, which reads and
  drops every batch before the position. Here ``save_state`` writes the loader state (plain JSON,
  `STATE_FILE`, by the main process, atomically) into its folder and ``load_state`` restores
  it with ``load_state_dict``: as fast as a fresh start, at any position.
* **No pickle.** ``register_for_checkpointing`` would pickle the state and load it with
  ``weights_only=False``; the JSON file goes through save/load-state pre-hooks instead.
* **Step boundaries.** ``Accelerator(gradient_accumulation_steps=...)`` must equal the loader's
  ``accumulation`` (checked here), so that an optimizer step is one global batch. The Accelerator
  takes it when it is built, before any loader exists: `energon_platform.gradient_accumulation_steps`
  computes it from the config and the world size.
* **A missing loader file** at ``load_state`` (a folder saved without this loader) is a
  ``FileNotFoundError`` naming the file, never a silent restart of the data at position 0.
* **One process per rank on CPU.** ``Accelerator(cpu=True)`` joins the processes that
  ``accelerate launch``/``torchrun`` started into one gloo group; without ``cpu=True`` (a bare
  ``PartialState()`` or ``Accelerator()`` on a machine without GPUs) every process is a world of
  one (``num_processes == 1``) and each would read the whole global batch.

The state saved at a step boundary is the global position, so ``load_state`` on another number of
processes continues the same global batches where that number divides the global batch (the
loader refuses one that does not, naming the sizes that work).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from energon_platform.loader.train_loader import TrainLoader

__all__ = ["prepare_loader", "STATE_FILE"]

#: The loader state's file in an ``accelerator.save_state`` folder.
STATE_FILE = "energon_loader_state.json"


def prepare_loader(accelerator: Any, cfg: Any, num_workers: int | None = None) -> TrainLoader:
    """This process's [`TrainLoader`][energon_platform.integrations.accelerate.TrainLoader]
    (data-parallel rank ``process_index`` of ``num_processes``), its state saved and restored by
    ``accelerator.save_state``/``load_state``. Call it once per loader, before ``load_state``.
    ``cfg``: a run config. ``ValueError`` when the accelerator's ``gradient_accumulation_steps`` is
    not the loader's accumulation."""
    loader = TrainLoader(
        cfg,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        num_workers=num_workers,
    )
    if accelerator.gradient_accumulation_steps != loader.accumulation:
        raise ValueError(
            f"Accelerator(gradient_accumulation_steps={accelerator.gradient_accumulation_steps}) but "
            f"the loader makes {loader.accumulation} micro-batch(es) per global batch on each process: "
            f"set gradient_accumulation_steps={loader.accumulation} (energon_platform."
            f"gradient_accumulation_steps(cfg, world_size) gives it before the Accelerator exists)"
        )

    def save(models: list, weights: list, output_dir: str) -> None:
        # every process: the state is the same global position at a step boundary
        state = loader.state_dict()
        if accelerator.is_main_process:
            path = Path(output_dir) / STATE_FILE
            tmp = path.with_suffix(".tmp")
            with open(tmp, "w") as f:
                json.dump(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)

    def load(models: list, input_dir: str) -> None:
        path = Path(input_dir) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: this checkpoint was not saved by an accelerator whose loader "
                "came from prepare_loader; resume from one that was, or start the data afresh"
            )
        loader.load_state_dict(json.loads(path.read_text()))

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)
    return loader
