"""``data.path`` → the datasets of a run and their blend: one Energon dataset, or a metadataset.

A metadataset YAML is read by Energon itself (``megatron.energon.load_dataset`` → its
``get_datasets``): ``MetadatasetV2`` with ``blend`` (weights, nested weights multiplied down) or
``blend_epochized`` (repetitions, fractional allowed: a dataset's units per blend epoch are
``round(len × repetitions)``), ``subflavors``, ``split_part``, relative paths, and the older
``Metadataset`` (``datasets:`` with ``weight``). Constructs whose meaning our schedule does not
reproduce (``join``, ``subset``, ``shuffle_over_epochs_multiplier``) are refused at start with one
line naming the file and the key.

Each leaf becomes a :class:`BlendEntry` with a *name* that is stable across runs (the dataset's
folder name, ``@split`` unless ``train``, ``[key=value,...]`` subflavors; ``#2``, ``#3`` for repeated entries) and a stream id derived
from that name, so two entries of the same dataset walk independent orders, and adding a dataset
at resume leaves the other datasets' orders unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from energon_platform.loader.source import DatasetError, SampleSource

#: Metadataset keys whose meaning our schedule does not reproduce.
UNSUPPORTED_KEYS = ("join", "subset", "shuffle_over_epochs_multiplier", "shuffle_over_epochs")
SUPPORTED = "blend (weight), blend_epochized (repetitions), nested metadatasets, path, split_part, subflavors"


@dataclass
class BlendEntry:
    """One dataset of a run: its source, stable name, subflavors and blend share."""

    name: str
    source: SampleSource
    share: Fraction  #: weight (``blend``) or units per blend epoch (``blend_epochized``)
    subflavors: dict = field(default_factory=dict)


@dataclass
class DatasetSet:
    """The datasets of a run. ``metadataset``: whether ``data.path`` was a metadataset (then sample
    keys are prefixed with the entry name); ``mode``: ``single``, ``weights`` or ``repetitions``."""

    entries: list[BlendEntry]
    metadataset: bool
    mode: str

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def weights(self) -> tuple[str, ...]:
        return tuple(str(e.share) for e in self.entries)


def is_metadataset(path: str) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix in (".yaml", ".yml")


def _refuse_unsupported(path: Path, node: Any, at: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            where = f"{at}.{k}" if at else str(k)
            if k in UNSUPPORTED_KEYS:
                raise DatasetError(f"{path}: {where}: {k!r} is not supported by energon-platform's schedule "
                                   f"(supported: {SUPPORTED})")
            _refuse_unsupported(path, v, where)
            if k == "path" and isinstance(v, str) and is_metadataset(str(path.parent / v)):
                nested = path.parent / v
                _refuse_unsupported(nested, yaml.safe_load(nested.read_text()))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _refuse_unsupported(path, v, f"{at}[{i}]")


def _entry_name(factory: Any, split: str, subflavors: dict, seen: dict) -> str:
    base = Path(str(factory.path)).name or "dataset"
    name = base if split == "train" else f"{base}@{split}"
    if subflavors:
        name += "[" + ",".join(f"{k}={v}" for k, v in sorted(subflavors.items())) + "]"
    name = name.replace("/", "_").replace(":", "_")  # a key is "{name}:{sample key}"; keys never hold "/"
    seen[name] = seen.get(name, 0) + 1
    return name if seen[name] == 1 else f"{name}#{seen[name]}"


def open_datasets(path: str, split: str) -> DatasetSet:
    """The datasets of ``path`` (a dataset folder or a metadataset YAML) for the ``split`` split."""
    if not is_metadataset(path):
        source = SampleSource(path, split)
        return DatasetSet([BlendEntry("dataset", source, Fraction(1))], False, "single")
    from megatron.energon import WorkerConfig
    from megatron.energon.metadataset import load_dataset
    from megatron.energon.metadataset.loader_interface import DatasetBlendMode

    mds_path = Path(path)
    try:
        _refuse_unsupported(mds_path, yaml.safe_load(mds_path.read_text()))
        mds = load_dataset(path)
        leaves = mds.traverse(split_part=split)  # paths, split parts and subflavors, in blend order
        loaded = mds.get_datasets(training=False, split_part=split,
                                  worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0))
    except DatasetError:
        raise
    except (ValueError, KeyError, TypeError, FileNotFoundError, AssertionError, yaml.YAMLError) as e:
        raise DatasetError(f"{path}: not a usable Energon metadataset: {type(e).__name__}: {e}") from None
    repetitions = loaded.blend_mode == DatasetBlendMode.SAMPLE_REPETITIONS
    entries, seen = [], {}
    if len(leaves) != len(loaded.datasets):
        raise DatasetError(f"{path}: the metadataset's leaves and its loaded datasets disagree "
                           f"({len(leaves)} against {len(loaded.datasets)})")
    for leaf, ld in zip(leaves, loaded.datasets):
        f = ld.dataset
        sub = dict(leaf.subflavors or {})
        leaf_split = leaf.split_part or split
        source = SampleSource(str(leaf.path), leaf_split, subflavors=sub or None)
        if repetitions:
            share = Fraction(round(Fraction(str(ld.repetitions)) * len(source)))
        else:
            share = Fraction(str(ld.weight)) if ld.weight is not None else Fraction(1)
        entries.append(BlendEntry(_entry_name(f, leaf_split, sub, seen), source, share, sub))
    if not entries:
        raise DatasetError(f"{path}: the metadataset has no datasets for split {split!r}")
    if all(e.share == 0 for e in entries):
        raise DatasetError(f"{path}: every dataset of the blend has weight 0")
    # canonical order by name: the interleave and the saved history do not depend on the YAML's order
    return DatasetSet(sorted(entries, key=lambda e: e.name), True, "repetitions" if repetitions else "weights")
