"""A metadataset's weights as written: read from its YAML, checked, exact, before Energon parses it.

Energon reads ``weight`` / ``repetitions`` as floats: ``1:1:1`` becomes ``0.3333333333333333``
each, a negative or all-zero blend fails with a ``ZeroDivisionError`` inside it, a string, NaN or
inf weight with a misleading "Missing value at ... join". `written_shares` walks the YAML in
Energon's leaf order (``splits.<split>``, then ``blend`` / ``blend_epochized`` / the older
``datasets`` lists, nested metadatasets through their ``path``) and returns, per leaf dataset,
its key path and its exact share:

* ``blend`` (and ``datasets``): the product, down the nesting, of ``weight / sum of the weights
  of its list`` (as Energon computes it, but in fractions of the decimals as written);
* ``blend_epochized``: the product of the ``repetitions`` down the nesting.

Every weight and repetitions is a number as Energon's YAML reader reads it (not a quoted string,
not a bool), finite, 0 or in [``LOWEST_WEIGHT``, ``HIGHEST_WEIGHT``]
(`config`); a list's weights have a positive sum. Anything else is a
`DatasetError` naming the file, the key and the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml
from megatron.energon.eyaml import load_yaml

from energon_platform.loader.step_settings import weight_problem
from storage import DatasetError


@dataclass(frozen=True)
class WrittenLeaf:
    where: str  #: ``FILE: splits.train.blend[1]`` (the innermost list entry that names the dataset)
    share: Fraction  #: exact weight (``blend``) or repetitions (``blend_epochized``)
    written: str  #: the value as written at ``where`` (``weight`` or ``repetitions``)


def exact_number(value: Any, where: str, key: str = "weight") -> Fraction:
    """``value`` as an exact fraction of its decimal text; `DatasetError` naming ``where``
    and ``key`` unless `weight_problem` accepts it."""
    problem = weight_problem(value)
    if problem:
        raise DatasetError(f"{where}: {key} {problem}")
    return Fraction(value) if isinstance(value, int) else Fraction(repr(value))


def read_metadataset(path: Path) -> dict:
    """The YAML mapping of a metadataset file, read as Energon reads it (its ``load_yaml``: ``1e30``
    is a number, ``'3'`` a string); `DatasetError` for an empty or non-mapping file."""
    try:
        text = path.read_bytes()
        doc = yaml.safe_load(text)  # checked first: a clean message for malformed YAML
    except OSError as e:
        raise DatasetError(
            f"{path}: cannot read the metadataset ({type(e).__name__}: {e})"
        ) from None
    except yaml.YAMLError as e:
        raise DatasetError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if isinstance(doc, dict):
        doc = load_yaml(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("splits"), dict):
        raise DatasetError(
            f"{path}: not an Energon metadataset ("
            f"{'the file is empty' if doc is None else 'no splits: mapping'}; expected "
            f"__class__: MetadatasetV2 with splits: {{train: {{blend: [...]}}}})"
        )
    return doc


def written_shares(path: str | Path, split: str) -> tuple[str, list[WrittenLeaf]]:
    """``(mode, leaves)`` of split ``split`` of the metadataset ``path``: ``mode`` is ``single``,
    ``weights`` or ``repetitions``; ``leaves`` in Energon's traversal order (see the module doc)."""
    path = Path(path)
    splits = read_metadataset(path)["splits"]
    if split not in splits:
        raise DatasetError(
            f"{path}: no split {split!r} (the metadataset has: {', '.join(map(str, splits)) or 'none'})"
        )
    return _node(path, splits[split], f"splits.{split}", split)


def _node(path: Path, node: Any, at: str, split: str) -> tuple[str, list[WrittenLeaf]]:
    if not isinstance(node, dict):
        raise DatasetError(
            f"{path}: {at}: expected a mapping (blend, blend_epochized or path), got {node!r}"
        )
    for key, mode in (
        ("blend", "weights"),
        ("datasets", "weights"),
        ("blend_epochized", "repetitions"),
    ):
        if key in node:
            return mode, _blend(path, node[key], f"{at}.{key}", split, mode)
    return _reference(path, node, at, split)


def _reference(path: Path, ref: dict, at: str, split: str) -> tuple[str, list[WrittenLeaf]]:
    """A ``path:`` reference: a dataset (one leaf, share 1) or a nested metadataset."""
    target = ref.get("path")
    if not isinstance(target, str):
        # Energon names what is wrong
        return "single", [WrittenLeaf(f"{path}: {at}", Fraction(1), "1")]
    nested = path.parent / target
    if not (nested.is_file() and nested.suffix in (".yaml", ".yml")):
        return "single", [WrittenLeaf(f"{path}: {at}", Fraction(1), "1")]
    return written_shares(nested, ref.get("split_part") or split)


def _blend(path: Path, items: Any, at: str, split: str, mode: str) -> list[WrittenLeaf]:
    if not isinstance(items, list) or not items:
        raise DatasetError(f"{path}: {at}: expected a non-empty list of datasets, got {items!r}")
    key = "weight" if mode == "weights" else "repetitions"
    values = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise DatasetError(
                f"{path}: {at}[{i}]: expected a mapping with path and {key}, got {item!r}"
            )
        values.append(exact_number(item.get(key, 1), f"{path}: {at}[{i}]", key))
    if mode == "weights" and sum(values) == 0:
        raise DatasetError(
            f"{path}: {at}: every weight is 0 (expected weights >= 0 with a positive sum)"
        )
    total = sum(values) if mode == "weights" else Fraction(1)
    leaves = []
    for i, (item, value) in enumerate(zip(items, values)):
        inner_mode, inner = _reference(path, item, f"{at}[{i}]", item.get("split_part") or split)
        if inner_mode not in ("single", mode):
            raise DatasetError(
                f"{path}: {at}[{i}]: a nested {inner_mode} metadataset inside a "
                f"{'blend' if mode == 'weights' else 'blend_epochized'} (Energon cannot mix "
                f"blend with blend_epochized)"
            )
        for leaf in inner:
            written = str(item.get(key, 1)) if inner_mode == "single" else leaf.written
            where = f"{path}: {at}[{i}]" if inner_mode == "single" else leaf.where
            leaves.append(WrittenLeaf(where, value / total * leaf.share, written))
    return leaves
