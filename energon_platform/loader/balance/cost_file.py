"""The cost file of ``energon-platform calibrate``, read back: a calibrated model's cost per micro-batch.

``calibrate`` (`energon_platform.training.calibrate`) times a model on micro-batches and
writes a JSON cost file: ``format_version`` (`FORMAT_VERSION`), ``features``,
``coefficients`` (seconds per unit of each feature), ``row_width``,
``model``, ``encoder_digest`` and its fit's report. `load_cost_model` reads it for one
encoder as a `CostModel`; ``loader.balance: measured`` plans global batches with its
predictions. Every problem with the file is a one-line `CostFileError` naming the file and
the field.

Two layouts are read:

* **version 2** (what ``calibrate`` writes): the features of a micro-batch as it runs
  (`MICRO_BATCH_FEATURES`: padded positions, one call per tower) and ``row_width``, how its rows
  were laid out when timed (`Shape.as_run`). The planner costs an unpacked micro-batch as a
  whole (`CostModel.shape_cost`).
* **version 1**: the sum of the samples' features (`FEATURES`); planned as before, each
  sample's cost added up.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from energon_platform.loader.fingerprint import encoder_digest
from task_encoders.config_parser import ConfigError
from task_encoders.features import FEATURES, LONGEST, MICRO_BATCH_FEATURES, MODULES, Shape

if TYPE_CHECKING:
    from task_encoders.base import SeededTaskEncoder


#: Version of the cost file's layout that ``calibrate`` writes.
FORMAT_VERSION = 2
#: The layouts read, by version: the features their coefficients name.
READ_VERSIONS: dict[int, tuple[str, ...]] = {1: FEATURES, 2: MICRO_BATCH_FEATURES}


class CostFileError(ConfigError):
    """A cost file that cannot be used: ``"<file>: <field>: <problem>"`` (one line)."""


@dataclass(frozen=True)
class CostModel:
    """Seconds a micro-batch takes: ``Σ coefficients[f] · features[f]``. ``coefficients`` name
    `FEATURES` (version 1: a micro-batch costs the sum of its samples) or
    `MICRO_BATCH_FEATURES` (version 2: `grouped`, the micro-batch as it runs with rows laid out
    as ``row_width`` says, `Shape.as_run`). A sample alone (`predict_work`) is costed by the
    `FEATURES` terms only: the calls are a micro-batch's, not a sample's."""

    coefficients: dict[str, float]
    model: str
    encoder_digest: str
    row_width: int | str | None = None

    @property
    def grouped(self) -> bool:
        """Whether the coefficients cost a micro-batch as it runs (version 2): the planner then
        deals an unpacked global batch by `shape_cost`."""
        return set(self.coefficients) == set(MICRO_BATCH_FEATURES)

    def shape_cost(self, shape: Shape) -> float:
        """Predicted seconds of a micro-batch of ``shape`` as it runs (a `grouped` model)."""
        return sum(c * x for c, x in zip(self._grouped_terms, shape.as_run(self.row_width)))

    @cached_property
    def _grouped_terms(self) -> tuple[float, ...]:
        return tuple(self.coefficients.get(name, 0.0) for name in MICRO_BATCH_FEATURES)

    def predict(self, features: Mapping[str, float]) -> float:
        """Predicted seconds of a micro-batch with ``features`` (names not given count 0)."""
        return sum(c * float(features.get(name, 0.0)) for name, c in self.coefficients.items())

    def predict_work(self, work: tuple[float, ...]) -> float:
        """`predict` of a sample's features as the planner holds them: a tuple in `FEATURES`
        order (no mapping built per sample). The same terms summed in the same order as
        `predict`, so the same float: a plan does not depend on which of the two is asked."""
        return sum(c * float(work[i]) for i, c in self._terms)

    @cached_property
    def _terms(self) -> tuple[tuple[int, float], ...]:
        """``(index in FEATURES, coefficient)`` in the coefficients' order (`predict`'s)."""
        index = {name: i for i, name in enumerate(FEATURES)}
        return tuple((index[name], c) for name, c in self.coefficients.items() if name in index)

    def predict_modules(self, features: Mapping[str, float]) -> dict[str, float]:
        """`predict`'s part per model module (`MODULES`)."""
        return {
            module: sum(self.coefficients.get(n, 0.0) * float(features.get(n, 0.0)) for n in names)
            for module, names in MODULES.items()
        }

    @property
    def digest(self) -> str:
        """What the predictions are a function of: the features and their coefficients, and a
        grouped model's row width (16 hex; a version 1 model's digest is what it always was)."""
        names = MICRO_BATCH_FEATURES if self.grouped else FEATURES
        content: dict[str, Any] = {"features": list(names), "coefficients": self.coefficients}
        if self.grouped:
            content["row_width"] = self.row_width
        text = json.dumps(content)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_cost_model(path: str | Path, encoder: SeededTaskEncoder) -> CostModel:
    """The cost model in ``path`` for ``encoder``. `CostFileError` naming the file and the
    field: a missing or unreadable file, not JSON, another format version, features other than
    `FEATURES`, a coefficient missing or not a finite number >= 0, another encoder's digest."""
    data = _read_json(Path(path))
    source = str(path)
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version not in READ_VERSIONS:
        raise _field_error(source, "format_version", data, " or ".join(map(str, READ_VERSIONS)))
    names = READ_VERSIONS[version]
    _field(data.get("features") == list(names), source, "features", data, list(names))
    coefficients = data.get("coefficients")
    if not isinstance(coefficients, dict):
        raise _field_error(source, "coefficients", data, "a mapping")
    unknown = sorted(set(coefficients) - set(names))
    if unknown:
        raise CostFileError(
            source, "coefficients", f"unknown feature(s) {unknown} (known: {list(names)})"
        )
    width = data.get("row_width") if version >= 2 else None
    _field(row_width_ok(width), source, "row_width", data, f"null, {LONGEST!r} or an integer > 0")
    for name in names:
        value = coefficients.get(name)
        if not coefficient_ok(value):
            raise CostFileError(
                source,
                f"coefficients.{name}",
                f"got {value!r} (expected seconds per unit: a number from 0 to {MAX_COEFFICIENT:g})",
            )
    if not any(coefficients[name] for name in names):
        raise CostFileError(
            source,
            "coefficients",
            "every coefficient is 0: the file predicts no cost, so nothing can be balanced by it; "
            "run energon-platform calibrate again",
        )
    digest = encoder_digest(encoder)
    if data.get("encoder_digest") != digest:
        raise CostFileError(
            source,
            "encoder_digest",
            f"{data.get('encoder_digest')!r} is another encoder configuration's (this one's is "
            f"{digest!r}); run energon-platform calibrate again with this config",
        )
    return CostModel(
        {n: float(coefficients[n]) for n in names}, str(data.get("model")), digest, width
    )


#: The largest coefficient read (seconds per unit of a feature): far above any model's, and small
#: enough that a global batch's predicted cost stays finite (1e308 passed as finite and overflowed
#: in the planner).
MAX_COEFFICIENT = 1e3


def coefficient_ok(value: Any) -> bool:
    """Whether ``value`` is a coefficient: a number from 0 to `MAX_COEFFICIENT` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and 0 <= value <= MAX_COEFFICIENT


def names_of(coefficients: Any) -> tuple[str, ...] | None:
    """The features of the cost file version whose features ``coefficients`` names, or None."""
    if not isinstance(coefficients, dict):
        return None
    return next((v for v in READ_VERSIONS.values() if set(v) == set(coefficients)), None)


def row_width_ok(width: Any) -> bool:
    """Whether ``width`` is a row width `Shape.as_run` knows."""
    if isinstance(width, bool):
        return False
    return width is None or width == LONGEST or (isinstance(width, int) and width > 0)


def _read_json(path: Path) -> dict:
    """The JSON object in ``path``; `CostFileError` when missing, unreadable or not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CostFileError(
            str(path), "", "file not found (write it with energon-platform calibrate)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise CostFileError(str(path), "", f"cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise CostFileError(str(path), "", f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CostFileError(
            str(path), "", f"top level is {type(data).__name__} (expected an object)"
        )
    return data


def _field(ok: bool, source: str, key: str, data: dict, expected: Any) -> None:
    if not ok:
        raise _field_error(source, key, data, expected)


def _field_error(source: str, key: str, data: dict, expected: Any) -> CostFileError:
    """The refusal of field ``key`` of the cost file ``source``: what it holds, what it must."""
    return CostFileError(source, key, f"got {data.get(key)!r} (expected {expected})")
