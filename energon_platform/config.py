"""Run configuration: one YAML file → validated, frozen dataclasses.

Sections: ``data`` (an Energon dataset), ``encoder`` (a task-encoder config file or inline
mapping, see ``configs/encoders/``), ``loader``, ``model``, ``train``. Errors name the file, the
key and what was expected (the parsing rules are ``task_encoders.config_parser``'s). Relative paths
resolve against the YAML file's folder.

Each section's dataclass lives beside the component it configures, which checks it by itself:
``loader`` in `energon_platform.loader.settings` (with ``loader.balance`` in
`energon_platform.loader.balance.settings`, ``loader.blend_adapt`` in
`energon_platform.loader.mixing.settings`, the executor's keys in
`energon_platform.loader.executors.settings`), ``model`` and ``train`` in
`energon_platform.training.settings`; the names a key takes from a registry (balance modes, mixing
methods, executors) are read from it. This module composes them (`RunConfig`), reads the YAML
(`load_config`) and re-exports the sections' names. What needs the encoder the config builds
(packing, context parallelism, the balance mode, the model's patch) is checked in
`energon_platform.config_checks`.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from energon_platform.loader.balance.settings import (
    BALANCE_MODES,
    FLAT_BALANCE_KEYS,
    LOADER_BALANCE_KEYS,
    MAX_BALANCE_LOOKAHEAD,
    MAX_BALANCE_WINDOW,
    BalanceConfig,
    balance_override,
    group_balance,
)
from energon_platform.loader.executors.settings import RAY_ACTOR_OPTIONS, ExecutorConfig
from energon_platform.loader.mixing.settings import BlendAdaptConfig
from energon_platform.loader.settings import MIN_SAMPLE_TIMEOUT, LoaderConfig, LoaderOptions
from energon_platform.loader.step_settings import (
    HIGHEST_WEIGHT,
    LOWEST_WEIGHT,
    MAX_BATCH,
    MAX_CONTEXT_PARALLEL,
    MAX_STEP,
    MAX_WORKERS,
    BlendStep,
    ExcludeRule,
    weight_problem,
)
from energon_platform.training.settings import ModelConfig, TrainConfig
from task_encoders.config_parser import (
    At,
    ConfigError,
    parse,
    read_yaml,
    require,
)

#: the run config's own names, then those of the sections' modules, importable from here as before
__all__ = [
    "ConfigError",
    "RunConfig",
    "load_config",
    "BALANCE_MODES",
    "FLAT_BALANCE_KEYS",
    "LOADER_BALANCE_KEYS",
    "MAX_BALANCE_LOOKAHEAD",
    "MAX_BALANCE_WINDOW",
    "BalanceConfig",
    "RAY_ACTOR_OPTIONS",
    "ExecutorConfig",
    "HIGHEST_WEIGHT",
    "LOWEST_WEIGHT",
    "MAX_BATCH",
    "MAX_CONTEXT_PARALLEL",
    "MAX_STEP",
    "MAX_WORKERS",
    "BlendStep",
    "ExcludeRule",
    "weight_problem",
    "BlendAdaptConfig",
    "MIN_SAMPLE_TIMEOUT",
    "LoaderConfig",
    "LoaderOptions",
    "ModelConfig",
    "TrainConfig",
]


@dataclass(frozen=True)
class DataConfig:
    """``data:``: the dataset a run reads."""

    path: Path
    """A dataset written by ``energon-platform convert`` (or any Energon webdataset): a local
    folder, or ``msc://PROFILE/prefix`` on object storage (then kept as that string)."""
    train_split: str = "train"
    """The split the run trains on."""
    val_split: str | None = "val"
    """The split ``build_val_loader`` reads; null for none."""


@dataclass(frozen=True)
class RunConfig:
    """A whole run config: what `load_config` returns."""

    data: DataConfig
    """The dataset (the ``data`` table below)."""
    encoder: Any
    """The path of an encoder YAML (``configs/encoders/``), or an inline mapping
    (``task_encoders.registry.get_encoder``)."""
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    """The loader (the ``loader`` table below)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The reference model (the ``model`` table below)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The reference trainer (the ``train`` table below)."""
    source: str = "<dict>"
    """Set by `load_config`, not read from the file: the YAML file's path, or ``<dict>``."""

    def check(self, at: At) -> None:
        if isinstance(self.encoder, str):
            object.__setattr__(self, "encoder", str(parse(Path, self.encoder, at.child("encoder"))))
        require(
            isinstance(self.encoder, (str, dict)),
            at.child("encoder"),
            f"got {type(self.encoder).__name__}",
            "a path to an encoder YAML or a mapping",
        )


def config_dict(cfg: RunConfig) -> dict:
    """``cfg`` as plain YAML data (mappings, lists, strings, numbers; paths absolute): `load_config`
    of it gives ``cfg`` back (its ``source`` aside; a path it held relative, as a default one,
    absolute from the working folder)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {
                f.name: plain(getattr(value, f.name))
                for f in dataclasses.fields(value)
                if f.name != "source"
            }
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return os.path.abspath(value) if isinstance(value, Path) else value

    return plain(cfg)


def load_config(path_or_dict: str | Path | dict, overrides: dict | None = None) -> RunConfig:
    """Read and validate a run config. ``overrides``: ``{"train.steps": 10, ...}`` applied first."""
    if isinstance(path_or_dict, dict):
        data, at = copy.deepcopy(path_or_dict), At()  # overrides never touch the caller's sections
    else:
        data, at = read_yaml(path_or_dict)
    group_balance(data, at)
    shell = set()
    for dotted, value in (overrides or {}).items():
        dotted = balance_override(data, dotted, value, at)
        if dotted is not None:
            _set_dotted(data, dotted, value, at)
            shell.add(dotted)
    group_balance(data, at)
    data["source"] = at.source
    return parse(RunConfig, data, dataclasses.replace(at, shell_keys=frozenset(shell)))


def _set_dotted(data: dict, dotted: str, value: Any, at: At) -> None:
    """``data["train"]["steps"] = value`` for ``dotted="train.steps"``; ConfigError naming the key
    when a part is empty or a parent is a value, not a section."""
    *parents, leaf = dotted.split(".")
    if not all(parents) or not leaf:
        raise ConfigError(at.source, dotted, "not a key (expected SECTION.KEY, e.g. train.steps)")
    node = data
    for i, name in enumerate(parents):
        if node.get(name) is None:
            node[name] = {}
        node = node[name]
        if not isinstance(node, dict):
            raise ConfigError(
                at.source,
                ".".join(parents[: i + 1]),
                f"is {node!r}, not a section; cannot set {dotted}",
            )
    node[leaf] = value
