"""Run configuration: one YAML file → validated, frozen dataclasses.

Sections: ``data`` (an Energon dataset), ``encoder`` (a task-encoder config file or inline
mapping, see ``configs/encoders/``), ``loader``, ``model``, ``train``. Errors name the file, the
key and what was expected (the parsing rules are ``task_encoders.config``'s). Relative paths
resolve against the YAML file's folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from task_encoders.config import At, ConfigError, parse, read_yaml, require

__all__ = ["ConfigError", "RunConfig", "load_config"]


@dataclass(frozen=True)
class DataConfig:
    """``data:``: ``path`` of a dataset written by ``energon-platform convert`` (or any Energon
    webdataset); ``train_split``/``val_split`` name its splits (``val_split: null`` for none)."""

    path: Path
    train_split: str = "train"
    val_split: str | None = "val"


@dataclass(frozen=True)
class LoaderConfig:
    """``loader:``

    ``global_batch_size``: items per training step over all data-parallel ranks (samples, or pack
    groups with packing); fixed for the life of a run. ``micro_batch_size``: items per ``next()``
    on a rank (None: the rank's whole share, i.e. no gradient accumulation). ``pack_group``:
    samples handed to the encoder's packer together; None: the encoder's ``packing.buffer_size``
    when its packing is enabled, else 1 (no packing). ``shuffle_buffer``: None for
    a full permutation per epoch, K for a windowed shuffle of K (shard-local reads).
    ``num_workers`` may change between save and restore; the others may not.
    """

    global_batch_size: int = 8
    micro_batch_size: int | None = None
    num_workers: int = 2
    seed: int = 1234
    shuffle_buffer: int | None = None
    pack_group: int | None = None
    prefetch_factor: int = 2

    def check(self, at: At) -> None:
        require(self.global_batch_size >= 1, at.child("global_batch_size"), f"got {self.global_batch_size}", ">= 1")
        require(self.micro_batch_size is None or self.micro_batch_size >= 1, at.child("micro_batch_size"),
                f"got {self.micro_batch_size}", ">= 1 or null")
        require(self.num_workers >= 0, at.child("num_workers"), f"got {self.num_workers}", ">= 0")
        require(self.shuffle_buffer is None or self.shuffle_buffer >= 1, at.child("shuffle_buffer"),
                f"got {self.shuffle_buffer}", ">= 1 or null")
        require(self.pack_group is None or self.pack_group >= 1, at.child("pack_group"), f"got {self.pack_group}",
                ">= 1 or null")
        require(self.prefetch_factor >= 1, at.child("prefetch_factor"), f"got {self.prefetch_factor}", ">= 1")


@dataclass(frozen=True)
class ModelConfig:
    """``model:``: the reference captioning model (see :mod:`energon_platform.model`)."""

    dim: int = 64
    layers: int = 2
    heads: int = 4
    patch: int = 8
    dropout: float = 0.0

    def check(self, at: At) -> None:
        require(self.dim % self.heads == 0, at.child("dim"), f"{self.dim} is not divisible by heads={self.heads}",
                "a multiple of heads")


@dataclass(frozen=True)
class TrainConfig:
    """``train:``: ``steps`` optimizer steps; a checkpoint every ``checkpoint_every`` steps into
    ``out``/checkpoints; the JSON-lines log at ``out``/log.jsonl."""

    steps: int = 40
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 5
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    out: Path = Path("out/train")

    def check(self, at: At) -> None:
        require(self.steps >= 1, at.child("steps"), f"got {self.steps}", ">= 1")
        require(self.checkpoint_every >= 1, at.child("checkpoint_every"), f"got {self.checkpoint_every}", ">= 1")
        require(self.keep_checkpoints >= 1, at.child("keep_checkpoints"), f"got {self.keep_checkpoints}", ">= 1")


@dataclass(frozen=True)
class RunConfig:
    data: DataConfig
    encoder: Any  #: path of an encoder YAML, or an inline mapping (``task_encoders.registry.get_encoder``)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    source: str = "<dict>"

    def check(self, at: At) -> None:
        if isinstance(self.encoder, str):
            object.__setattr__(self, "encoder", str(parse(Path, self.encoder, at.child("encoder"))))
        require(isinstance(self.encoder, (str, dict)), at.child("encoder"), f"got {type(self.encoder).__name__}",
                "a path to an encoder YAML or a mapping")


def load_config(path_or_dict: str | Path | dict, overrides: dict | None = None) -> RunConfig:
    """Read and validate a run config. ``overrides``: ``{"train.steps": 10, ...}`` applied first."""
    if isinstance(path_or_dict, dict):
        data, at = dict(path_or_dict), At()
    else:
        data, at = read_yaml(path_or_dict)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    data["source"] = at.source
    return parse(RunConfig, data, at)
