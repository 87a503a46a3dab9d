"""Image augmentation from config: a checked list of ``torchvision.transforms.v2`` steps.

``image.transforms`` (training) and ``image.eval_transforms`` are lists of
``{name: <transform>, <param>: <value>, ...}``. Supported transforms and parameters are in
`CATALOG`; every value is checked when the config is read, and the pipeline must end at one
fixed output size (so a batch stacks), which means a ``RandomResizedCrop``, a ``Resize`` to
``[h, w]``, or a crop after a ``Resize``. A crop larger than the ``Resize`` before it, or any side
over `MAX_SIDE`, is refused.

Input: float (C, H, W) in [0, 1] (Energon's ``torchrgb`` decoding). Output: float32 (C, h, w).
Randomness: v2 transforms draw from torch's global RNG; the encoder runs the pipeline inside
`task_encoders.seeding.seeded_global_torch` with the sample's seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchvision.transforms import v2

from task_encoders.config_parser import At, require

#: Largest output side accepted anywhere in a pipeline.
MAX_SIDE = 4096


def _number(lo: float, hi: float) -> Callable[[Any, At], float]:
    def check(value: Any, at: At) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi
        require(ok, at, f"got {value!r}", f"a number from {lo} to {hi}")
        return float(value)

    return check


def _size(value: Any, at: At) -> int | tuple[int, int]:
    sides = value if isinstance(value, list) else [value]
    ok = len(sides) in (1, 2) and all(
        isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= MAX_SIDE for s in sides
    )
    require(ok, at, f"got {value!r}", f"a side or [height, width], integers from 1 to {MAX_SIDE}")
    return tuple(sides) if len(sides) == 2 else sides[0]


def _range(lo: float, hi: float) -> Callable[[Any, At], tuple[float, float]]:
    one = _number(lo, hi)

    def check(value: Any, at: At) -> tuple[float, float]:
        require(
            isinstance(value, list) and len(value) == 2,
            at,
            f"got {value!r}",
            f"[low, high] within [{lo}, {hi}]",
        )
        pair = (one(value[0], at.item(0)), one(value[1], at.item(1)))
        require(pair[0] <= pair[1], at, f"low {pair[0]} > high {pair[1]}", "low <= high")
        return pair

    return check


def _triple(positive: bool) -> Callable[[Any, At], tuple[float, float, float]]:
    def check(value: Any, at: At) -> tuple[float, float, float]:
        ok = (
            isinstance(value, list)
            and len(value) == 3
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and (v > 0 or not positive)
                for v in value
            )
        )
        require(
            ok,
            at,
            f"got {value!r}",
            "3 numbers, one per RGB channel" + (", all > 0" if positive else ""),
        )
        return float(value[0]), float(value[1]), float(value[2])

    return check


def _interpolation(value: Any, at: At) -> str:
    choices = ("nearest", "bilinear", "bicubic")
    require(value in choices, at, f"got {value!r}", "one of " + ", ".join(choices))
    return value


def _flag(value: Any, at: At) -> bool:
    require(isinstance(value, bool), at, f"got {value!r}", "true or false")
    return value


#: name → (torchvision v2 class, {parameter: checker}); parameters not given keep v2's defaults.
CATALOG: dict[str, tuple[type, dict[str, Callable[[Any, At], Any]]]] = {
    "RandomResizedCrop": (
        v2.RandomResizedCrop,
        {
            "size": _size,
            "scale": _range(1e-6, 1.0),
            "ratio": _range(1e-3, 1e3),
            "interpolation": _interpolation,
            "antialias": _flag,
        },
    ),
    "Resize": (v2.Resize, {"size": _size, "interpolation": _interpolation, "antialias": _flag}),
    "CenterCrop": (v2.CenterCrop, {"size": _size}),
    "RandomCrop": (v2.RandomCrop, {"size": _size}),
    "RandomHorizontalFlip": (v2.RandomHorizontalFlip, {"p": _number(0.0, 1.0)}),
    "ColorJitter": (
        v2.ColorJitter,
        {
            "brightness": _number(0.0, 10.0),
            "contrast": _number(0.0, 10.0),
            "saturation": _number(0.0, 10.0),
            "hue": _number(0.0, 0.5),
        },
    ),
    "Normalize": (v2.Normalize, {"mean": _triple(False), "std": _triple(True)}),
}
_CROPS = ("CenterCrop", "RandomCrop")


@dataclass(frozen=True)
class TransformSpec:
    """One step: a `CATALOG` name and its checked parameters."""

    name: str
    params: dict = field(default_factory=dict)

    @classmethod
    def from_config_value(cls, value: Any, at: At) -> TransformSpec:
        require(
            isinstance(value, dict) and isinstance(value.get("name"), str),
            at,
            f"got {value!r}",
            "a mapping with a 'name' and the transform's parameters",
        )
        name = value["name"]
        require(
            name in CATALOG,
            at.child("name"),
            f"unknown transform {name!r}",
            "one of " + ", ".join(CATALOG),
        )
        checkers = CATALOG[name][1]
        params = {}
        for key, raw in value.items():
            if key != "name":
                require(
                    key in checkers,
                    at.child(key),
                    f"unknown parameter of {name}",
                    "one of " + ", ".join(checkers),
                )
                params[key] = checkers[key](raw, at.child(key))
        require(
            "size" in params or "size" not in checkers,
            at.child("size"),
            "missing",
            "the output size",
        )
        return cls(name=name, params=params)

    def build(self) -> Any:
        return CATALOG[self.name][0](**self.params)


def output_size(specs: tuple[TransformSpec, ...], at: At) -> tuple[int, int]:
    """The fixed (height, width) the pipeline produces; ``ConfigError`` when there is none or a crop
    exceeds the ``Resize`` before it."""
    size: tuple[int, int] | None = None  # exact output size so far
    short: int | None = None  # shorter side after Resize(int)
    for i, spec in enumerate(specs):
        raw = spec.params.get("size")  # `_size`: a side or (height, width)
        hw: tuple[int, int] | None = (raw, raw) if isinstance(raw, int) else raw
        if spec.name == "RandomResizedCrop" or (spec.name == "Resize" and not isinstance(raw, int)):
            size, short = hw, None
        elif spec.name == "Resize":
            size, short = None, raw
        elif spec.name in _CROPS and hw is not None:
            bound = size or ((short, short) if short else None)
            if bound is None:
                raise at.item(i).error(
                    f"{spec.name} on images of unknown size",
                    "a Resize or RandomResizedCrop before it",
                )
            require(
                hw[0] <= bound[0] and hw[1] <= bound[1],
                at.item(i).child("size"),
                f"crop {list(hw)} is larger than the {list(bound)} it is cut from",
                "a crop within the resized image",
            )
            size, short = hw, None
    if size is None:
        raise at.error(
            "the output size is not fixed",
            "RandomResizedCrop, Resize to [height, width], or a crop after Resize",
        )
    return size


def default_eval_specs(
    train: tuple[TransformSpec, ...], size: tuple[int, int]
) -> tuple[TransformSpec, ...]:
    """Evaluation pipeline derived from a training one: Resize the shorter side, CenterCrop to the
    training output size, then the training pipeline's Normalize steps."""
    height, width = size
    steps = [
        TransformSpec("Resize", {"size": max(height, width)}),
        TransformSpec("CenterCrop", {"size": (height, width)}),
    ]
    return tuple(steps + [s for s in train if s.name == "Normalize"])


def build_pipeline(specs: tuple[TransformSpec, ...]) -> v2.Compose:
    """The v2 ``Compose`` of the checked steps."""
    return v2.Compose([spec.build() for spec in specs])
