"""The run config a Megatron provider works from, with Megatron's batch sizes applied."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from energon_platform.config import RunConfig, load_config


def resolve_run_config(
    config: str | os.PathLike | dict | RunConfig,
    micro_batch_size: int | None,
    global_batch_size: int | None,
) -> RunConfig:
    """``config`` (a YAML path, a mapping or a `RunConfig`) as a `RunConfig`, with
    Megatron's ``micro_batch_size``/``global_batch_size`` (when given, each >= 1) replacing the
    config's ``loader`` values."""
    cfg = (
        config
        if isinstance(config, RunConfig)
        else load_config(config if isinstance(config, dict) else Path(config))
    )
    changes = {}
    for name, value in (
        ("micro_batch_size", micro_batch_size),
        ("global_batch_size", global_batch_size),
    ):
        if value is not None:
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
            changes[name] = int(value)
    return (
        dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, **changes))
        if changes
        else cfg
    )
