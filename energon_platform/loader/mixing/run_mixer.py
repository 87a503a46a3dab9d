"""The trainer's side of ``loader.blend_adapt``: a run's mixer, the keys it is told about, the
losses summed over the ranks.

`run_adapter` checks the run can mix (a blend of two or more datasets, a floor they can all have)
and builds its `BlendAdapter` at a global batch; `dataset_of` maps a sample key as batches carry
it to its dataset; `summed_over_ranks` is the all-reduce the adapter sums losses with.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from energon_platform.loader.mixing.adapter import AdaptError, BlendAdapter, floor_problem
from task_encoders.config_parser import ConfigError


def run_adapter(plan: Any, adapt: Any, data_path: Any, start: int) -> BlendAdapter | None:
    """The mixer of a run with ``loader.blend_adapt`` (``adapt``; None: fixed weights, returns
    None), starting at global batch ``start`` with the weights ``plan``'s blend has there; a
    `ConfigError` naming ``data.path`` when it is no blend."""
    if adapt is None:
        return None
    names, source = plan.datasets.names, plan.source
    if not plan.datasets.metadataset or len(names) < 2:
        what = (
            "is a metadataset of one dataset"
            if names and plan.datasets.metadataset
            else "is one dataset"
        )
        raise ConfigError(
            source,
            "loader.blend_adapt",
            f"needs a blend, but data.path {data_path} {what} (set data.path to a "
            f"metadataset of two or more datasets, or loader.blend_adapt to null)",
        )
    problem = floor_problem(adapt.floor, len(names))
    if problem is not None:
        raise ConfigError(source, "loader.blend_adapt.floor", problem)
    unit = start * plan.units_per_batch
    weights = [s for s in plan.blend.segments if s.start <= unit][-1].weights
    return BlendAdapter(adapt, names, weights, start, plan.weights_from)


def dataset_of(datasets: Any, key: str) -> int:
    """The dataset number (in ``datasets``, a `DatasetSet`) of a sample key as batches carry it."""
    for d in range(len(datasets.entries)):
        if key.startswith(datasets.key_prefix(d)):
            return d
    raise AdaptError(
        f"report_losses: key {key!r} is of no dataset of the blend (keys are "
        f"'DATASET:KEY' with DATASET one of {datasets.names})"
    )


def summed_over_ranks(group: Any):
    """A function that sums a list of floats over the ranks of ``group`` (``all_reduce`` in
    float64, on the GPU for NCCL), or None outside ``torch.distributed`` or on one rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return None

    def summed(values: list[float]) -> list[float]:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend(group) == "nccl"
            else torch.device("cpu")
        )
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, group=group)
        return t.tolist()

    return summed
