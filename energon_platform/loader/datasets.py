"""``data.path`` → the datasets of a run and their blend: one Energon dataset, or a metadataset.

A metadataset YAML is read by Energon itself (``megatron.energon.load_dataset`` → its
``traverse`` and ``get_datasets``): ``MetadatasetV2`` with ``blend`` (weights, nested weights
multiplied down) or ``blend_epochized`` (repetitions, fractional allowed: a dataset's units per
blend epoch are ``round(len × repetitions)``, refused when that rounds a non-zero repetitions to
0), ``subflavors``, ``split_part``, relative paths, and the older ``Metadataset`` (``datasets:``
with ``weight``). Constructs whose meaning our schedule does not reproduce (``join``, ``subset``,
``shuffle_over_epochs_multiplier``) are refused at start with one line naming the file and the key.
The weights are read from the YAML as written, checked and exact, before Energon parses them
(`metadataset_weights`); every leaf's split is opened before
Energon loads it, so a missing or empty split is one line naming the entry.

Each leaf becomes a `BlendEntry` with a *name* that is stable across runs (the dataset's
folder name, ``@split`` unless ``train``, ``[key=value,...]`` subflavors; ``#2``, ``#3`` for entries
sharing that name, numbered in the order of their paths, never of the list) and a stream id
derived from that name, so two entries of the same dataset walk independent orders, and adding a
dataset at resume leaves the other datasets' orders unchanged.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml
from megatron.energon import WorkerConfig
from megatron.energon.metadataset import load_dataset
from megatron.energon.metadataset.loader_interface import DatasetBlendMode

from energon_platform.loader.metadataset_weights import (
    WrittenLeaf,
    read_metadataset,
    written_shares,
)
from energon_platform.loader.source import SampleSource
from storage import DatasetError, check_there

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
    #: the paths of every folder sharing this entry's folder name
    clash: list = field(default_factory=list)


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

    def key_prefix(self, dataset: int) -> str:
        """What the loader puts before dataset ``dataset``'s sample keys: ``"name:"`` in a metadataset, else ``""``."""
        return f"{self.entries[dataset].name}:" if self.metadataset else ""

    def clash_note(self, saved_names) -> str:
        """For a refused resume: ``". Note: ..."`` explaining that entries of the checkpoint share a
        folder name with other datasets of this run (numbered by path, so a dataset added at resume
        may take an existing entry's name), or ``""``."""
        clashes = {
            e.name.split("#")[0]: e.clash
            for e in self.entries
            if e.clash and e.name.split("#")[0] in {n.split("#")[0] for n in saved_names}
        }
        if not clashes:
            return ""
        name, paths = next(iter(clashes.items()))
        return (
            f". Note: this run has {len(paths)} datasets in folders named {name!r} ({', '.join(sorted(paths))}); "
            f"entries that share a folder name are numbered {name!r}, {name + '#2'!r}, ... in the order of "
            f"their paths, so a dataset added at resume can take the name of the one the checkpoint saved: "
            f"give the added dataset a folder with another name (a symlink will do)"
        )


def is_metadataset(path: str) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix in (".yaml", ".yml")


def _refuse_unsupported(path: Path, node: Any, at: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            where = f"{at}.{k}" if at else str(k)
            if k in UNSUPPORTED_KEYS:
                raise DatasetError(
                    f"{path}: {where}: {k!r} is not supported by energon-platform's schedule "
                    f"(supported: {SUPPORTED})"
                )
            _refuse_unsupported(path, v, where)
            if k == "path" and isinstance(v, str) and is_metadataset(str(path.parent / v)):
                nested = path.parent / v
                _refuse_unsupported(nested, read_metadataset(nested))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _refuse_unsupported(path, v, f"{at}[{i}]")


def _base_name(path: Any, split: str, subflavors: dict | None) -> str:
    base = Path(str(path)).name or "dataset"
    name = base if split == "train" else f"{base}@{split}"
    if subflavors:
        name += "[" + ",".join(f"{k}={v}" for k, v in sorted(subflavors.items())) + "]"
    # a key is "{name}:{sample key}"; keys never hold "/"
    return name.replace("/", "_").replace(":", "_")


def _number_clashes(entries: list[BlendEntry]) -> None:
    """Entries with the same base name get ``#2``, ``#3``, ... in the order of their dataset paths
    (the YAML order only among entries of the same path): names do not depend on the list's order."""
    groups: dict[str, list[BlendEntry]] = {}
    for e in entries:
        groups.setdefault(e.name, []).append(e)
    for name, group in groups.items():
        for n, e in enumerate(sorted(group, key=lambda e: str(e.source.path)), start=1):
            e.name = name if n == 1 else f"{name}#{n}"
            e.clash = (
                [str(g.source.path) for g in group]
                if len({str(g.source.path) for g in group}) > 1
                else []
            )


def _open_leaf(path: str, split: str, subflavors: dict, where: str) -> SampleSource:
    """The leaf's split; a dataset without it (or with it empty) is refused naming the entry."""
    try:
        return SampleSource(path, split, subflavors=subflavors or None)
    except DatasetError as e:
        if type(e) is not DatasetError:  # a storage failure: as it is
            raise
        raise DatasetError(f"{where}: {e}") from None


def _units_per_epoch(leaf: WrittenLeaf, source: SampleSource) -> Fraction:
    """``round(len × repetitions)``; refuses repetitions > 0 that round to no sample at all."""
    units = round(leaf.share * len(source))
    if units == 0 and leaf.share > 0:
        raise DatasetError(
            f"{leaf.where}: repetitions {leaf.written} x {len(source)} samples = "
            f"{float(leaf.share * len(source)):.4g} rounds to 0 samples per blend epoch; "
            f"use repetitions >= {float(Fraction(1, 2 * len(source))):.4g}, or 0 to leave it out"
        )
    return Fraction(units)


@contextlib.contextmanager
def _energon_errors(path: str):
    """What Energon raises for a metadataset it cannot use, as one `DatasetError` line."""
    try:
        yield
    except DatasetError:
        raise
    except FileNotFoundError as e:  # Energon: a path that is neither a dataset nor a metadataset
        check_there(path)
        raise DatasetError(
            f"{path}: {e}: not an Energon dataset (no .nv-meta) or metadataset; convert it with "
            f"`energon-platform convert ...` first"
        ) from None
    except (ValueError, KeyError, TypeError, AssertionError, yaml.YAMLError) as e:
        raise DatasetError(
            f"{path}: not a usable Energon metadataset: {type(e).__name__}: {e}"
        ) from None


def open_datasets(path: str, split: str) -> DatasetSet:
    """The datasets of ``path`` (a dataset folder or a metadataset YAML) for the ``split`` split."""
    if not is_metadataset(path):
        source = SampleSource(path, split)
        return DatasetSet([BlendEntry("dataset", source, Fraction(1))], False, "single")

    mds_path = Path(path)
    _refuse_unsupported(mds_path, read_metadataset(mds_path))
    # checked before Energon parses them, exact as written
    mode, written = written_shares(mds_path, split)
    with _energon_errors(path):
        mds = load_dataset(path)
        leaves = mds.traverse(split_part=split)  # paths, split parts and subflavors, in blend order
    if len(leaves) != len(written):
        raise DatasetError(
            f"{path}: the metadataset's leaves and its weights as written disagree "
            f"({len(leaves)} against {len(written)})"
        )
    # each leaf's split opened first: a missing or empty split is refused naming the entry
    sources = [
        _open_leaf(str(leaf.path), leaf.split_part or split, dict(leaf.subflavors or {}), w.where)
        for leaf, w in zip(leaves, written)
    ]
    with _energon_errors(path):
        loaded = mds.get_datasets(
            training=False,
            split_part=split,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        )
    repetitions = loaded.blend_mode == DatasetBlendMode.SAMPLE_REPETITIONS
    if len(loaded.datasets) != len(leaves) or repetitions != (mode == "repetitions"):
        raise DatasetError(
            f"{path}: the metadataset's leaves and its loaded datasets disagree "
            f"({len(leaves)} against {len(loaded.datasets)})"
        )
    entries = []
    for leaf, source, w in zip(leaves, sources, written):
        share = _units_per_epoch(w, source) if repetitions else w.share
        entries.append(
            BlendEntry(
                _base_name(leaf.path, source.split, source.subflavors),
                source,
                share,
                dict(leaf.subflavors or {}),
            )
        )
    _number_clashes(entries)
    if not entries:
        raise DatasetError(f"{path}: the metadataset has no datasets for split {split!r}")
    if all(e.share == 0 for e in entries):
        raise DatasetError(f"{path}: every dataset of the blend has weight 0")
    # canonical order by name: the interleave and the saved history do not depend on the YAML's order
    return DatasetSet(
        sorted(entries, key=lambda e: e.name), True, "repetitions" if repetitions else "weights"
    )
