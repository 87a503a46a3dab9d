"""The cost file of ``energon-platform calibrate``, read back: a calibrated model's cost per sample.

``calibrate`` (`energon_platform.training.calibrate`) times a model on micro-batches and
writes a JSON cost file: ``format_version`` (`FORMAT_VERSION`), ``features``
(`FEATURES`), ``coefficients`` (seconds per unit of each feature),
``model``, ``encoder_digest`` and its fit's report. `load_cost_model` reads it for one
encoder as a `CostModel`; ``loader.balance: measured`` plans global batches with its
`CostModel.predict` of each sample's cost features. Every problem with the file is a
one-line `CostFileError` naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from energon_platform.loader.fingerprint import encoder_digest
from task_encoders.config import ConfigError
from task_encoders.features import FEATURES, MODULES

#: Version of the cost file's layout.
FORMAT_VERSION = 1


class CostFileError(ConfigError):
    """A cost file that cannot be used: ``"<file>: <field>: <problem>"`` (one line)."""


@dataclass(frozen=True)
class CostModel:
    """Seconds a micro-batch takes: ``Σ coefficients[f] · features[f]`` over `FEATURES`."""

    coefficients: dict[str, float]
    model: str
    encoder_digest: str

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
        """What the predictions are a function of: the features and their coefficients (16 hex)."""
        text = json.dumps({"features": list(FEATURES), "coefficients": self.coefficients})
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_cost_model(path: str | Path, encoder: Any) -> CostModel:
    """The cost model in ``path`` for ``encoder``. `CostFileError` naming the file and the
    field: a missing or unreadable file, not JSON, another format version, features other than
    `FEATURES`, a coefficient missing or not a finite number >= 0, another encoder's digest."""
    data = _read_json(Path(path))
    source = str(path)
    _field(
        data.get("format_version") == FORMAT_VERSION, source, "format_version", data, FORMAT_VERSION
    )
    _field(data.get("features") == list(FEATURES), source, "features", data, list(FEATURES))
    coefficients = data.get("coefficients")
    _field(isinstance(coefficients, dict), source, "coefficients", data, "a mapping")
    unknown = sorted(set(coefficients) - set(FEATURES))
    if unknown:
        raise CostFileError(
            source, "coefficients", f"unknown feature(s) {unknown} (known: {list(FEATURES)})"
        )
    for name in FEATURES:
        value = coefficients.get(name)
        ok = (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
        if not (ok and value >= 0):
            raise CostFileError(
                source, f"coefficients.{name}", f"got {value!r} (expected a finite number >= 0)"
            )
    digest = encoder_digest(encoder)
    if data.get("encoder_digest") != digest:
        raise CostFileError(
            source,
            "encoder_digest",
            f"{data.get('encoder_digest')!r} is another encoder configuration's (this one's is "
            f"{digest!r}); run energon-platform calibrate again with this config",
        )
    return CostModel({n: float(coefficients[n]) for n in FEATURES}, str(data.get("model")), digest)


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
        raise CostFileError(source, key, f"got {data.get(key)!r} (expected {expected})")
