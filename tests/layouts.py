"""Global batches of a run config on a ranks x workers layout, for elastic-resume tests."""

from __future__ import annotations

import json
from typing import Callable


def layout_batches(config, ranks: int, workers: int, steps: int, digests: Callable, states=None):
    """``steps`` global batches as ``[(key, digest), ...]`` (ranks in order; ``digests(batch)`` gives a
    key → digest mapping), then every rank's state as JSON data. ``states``: restore each rank from
    ``states[rank]`` (or ``states[0]`` for ranks the saved run did not have) first."""
    from energon_platform.loader.train_loader import TrainLoader

    loaders = [TrainLoader(config, rank=r, world_size=ranks, num_workers=workers) for r in range(ranks)]
    if states is not None:
        for r, loader in enumerate(loaders):
            loader.load_state_dict(states[r] if r < len(states) else states[0])
    out = []
    for _ in range(steps):
        parts = [next(loader) for loader in loaders for _ in range(loader.accumulation)]
        out.append([(k, d) for p in parts for k, d in digests(p).items()])
    saved = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]
    for loader in loaders:
        loader.close()
    return out, saved
