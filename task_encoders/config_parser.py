"""Config files and sections → frozen, validated dataclasses: the parser every config of the
project goes through (run configs, encoder configs, cost files).

Every problem raises `ConfigError`, whose message names the source (the YAML file, or
``<dict>``), the key path and what was expected, e.g.:

    configs/encoders/image_text.yaml: image.transforms[1].name: unknown transform 'RandomFlip'
    (expected one of CenterCrop, ColorJitter, ...)

How a section is read: `parse` walks the dataclass's type hints (``int``, ``float``,
``bool``, ``str``, ``Path``, ``X | None``, ``tuple[X, ...]``, ``list[X]``, ``dict[str, X]``,
``Literal[...]``, nested dataclasses), rejects unknown and missing keys, then calls the
dataclass's ``check(at)`` for rules between values. A field whose names come from a registry marks
them with `CHOICES` in its metadata (the registry stays their one list). A section's keys that a file leaves out keep
the defaults of that section. A dataclass may take over its own parsing with a classmethod
``from_config_value(value, at)``. Relative paths are resolved against the YAML file's folder (the
working directory for dicts); a ``Path`` key given a URL (``msc://...``) keeps it as a string.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """An invalid encoder configuration: ``"<source>: <key>: <problem>"``."""

    def __init__(self, source: str, key: str, problem: str):
        self.source, self.key, self.problem = source, key, problem
        super().__init__(f"{source}: {key}: {problem}" if key else f"{source}: {problem}")


@dataclass(frozen=True)
class At:
    """Where a value sits: the config's source, the key path and the folder for relative paths.
    ``shell_keys``: the keys set on the command line (``--set``), whose relative paths are the
    shell's (resolved against the working folder, not the config's)."""

    source: str = "<dict>"
    key: str = ""
    base_dir: Path = field(default_factory=Path.cwd)
    shell_keys: frozenset[str] = frozenset()

    @property
    def folder(self) -> Path:
        """The folder a relative path at this key is resolved against."""
        return Path.cwd() if self.key in self.shell_keys else self.base_dir

    def child(self, name: str) -> At:
        return dataclasses.replace(self, key=f"{self.key}.{name}" if self.key else name)

    def item(self, index: int) -> At:
        return dataclasses.replace(self, key=f"{self.key}[{index}]")

    def error(self, problem: str, expected: str | None = None) -> ConfigError:
        return ConfigError(
            self.source, self.key, problem + (f" (expected {expected})" if expected else "")
        )


def read_yaml(path: str | Path) -> tuple[dict, At]:
    """Read a YAML mapping; returns it with the `At` of its top level."""
    path = Path(path)
    at = At(source=str(path), base_dir=path.resolve().parent)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise at.error("file not found") from None
    except yaml.YAMLError as e:
        raise at.error(f"not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise at.error(f"top level is {type(data).__name__}", "a mapping of sections")
    return data, at


def parse(tp: Any, value: Any, at: At, default: Any = None) -> Any:
    """Convert ``value`` (from YAML) to type ``tp``, raising `ConfigError` at ``at``.

    For a dataclass, keys the value leaves out keep their values in ``default`` (the enclosing
    config's default for that section), else the dataclass's own defaults.
    """
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _parse_dataclass(tp, value, at, default)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return parse(inner, value, at)
    if origin is Literal:
        _check_choice(value, args, at)
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise at.error(f"got {_kind(value)}", "a list")
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise at.error(f"got {len(value)} values", f"a list of {len(args)}")
            return tuple(parse(a, v, at.item(i)) for i, (a, v) in enumerate(zip(args, value)))
        items = [parse(args[0], v, at.item(i)) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise at.error(f"got {_kind(value)}", "a mapping with string keys")
        return {k: parse(args[1], v, at.child(k)) for k, v in value.items()}
    return _parse_scalar(tp, value, at)


#: a field's ``metadata`` key: a callable giving the names the field may take (a registry's keys,
#: read when a value is parsed, so a name registered is a name allowed); any other value is refused
#: as a ``Literal``'s is, the error listing the names
CHOICES = "choices"


def _check_choice(value: Any, names: Iterable[Any], at: At) -> None:
    """ConfigError at ``at`` listing ``names`` unless ``value`` is one of them."""
    names = tuple(names)
    if value not in names:
        raise at.error(f"got {value!r}", "one of " + ", ".join(map(repr, names)))


def _parse_scalar(tp: Any, value: Any, at: At) -> Any:
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        number = _number_text(value)
        if number is not None:
            return number
    if tp is str and isinstance(value, str):
        return value
    if tp is Path and isinstance(value, str) and "://" in value:
        return value  # a URL (``msc://PROFILE/prefix``): kept as written, a string, never resolved
    if tp is Path and isinstance(value, str) and value:
        path = Path(value).expanduser()
        return path if path.is_absolute() else (at.folder / path).resolve()
    expected = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        Path: "a path",
    }
    raise at.error(f"got {_kind(value)} {value!r}", expected.get(tp, str(tp)))


#: A number YAML 1.1 (PyYAML) leaves a string: ``1e308``, ``3e-4`` (no dot, or no sign in the
#: exponent), ``nan``, ``inf``; ``.inf`` and ``.nan`` are YAML's own spellings.
_NUMBER_TEXT = re.compile(
    r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?|[-+]?\.?(inf|nan)", re.IGNORECASE
)


def _number_text(text: str) -> float | None:
    """The float a string spells for a key that takes a number (None if it spells none). Whether
    a non-finite or huge value is allowed is the key's own check."""
    text = text.strip()
    if not _NUMBER_TEXT.fullmatch(text):
        return None
    return float(re.sub(r"\.(?=inf|nan)", "", text, flags=re.IGNORECASE))


def _parse_dataclass(cls: type[T], value: Any, at: At, default: Any = None) -> T:
    custom = getattr(cls, "from_config_value", None)
    if custom is not None:
        obj = custom(value, at)
    else:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise at.error(f"got {_kind(value)}", "a mapping")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, cls)) if f.init}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise at.child(str(unknown[0])).error("unknown key", "one of " + ", ".join(fields))
        if default is None:
            default = _defaults_of(cls, fields)
        kwargs = {}
        for name in fields:
            if name in value:
                names = fields[name].metadata.get(CHOICES)
                if names is not None:
                    _check_choice(value[name], tuple(names()), at.child(name))
                kwargs[name] = parse(
                    hints[name], value[name], at.child(name), getattr(default, name, None)
                )
            elif not hasattr(default, name):
                raise at.child(name).error("missing", _describe(hints[name]))
            else:
                kwargs[name] = getattr(default, name)
        obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(at)
    return obj


def _defaults_of(cls: type, fields: dict[str, dataclasses.Field]) -> Any:
    """An object holding the dataclass's default value of every field that has one."""
    values = {}
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            values[name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[name] = f.default_factory()
    return types.SimpleNamespace(**values)


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def require(condition: bool, at: At, problem: str, expected: str) -> None:
    """Raise ``at.error(problem, expected)`` unless ``condition``."""
    if not condition:
        raise at.error(problem, expected)


def finite(value: Any) -> bool:
    """Whether a number is finite (an int always is: Python's are exact at any size)."""
    return isinstance(value, int) or math.isfinite(value)


def at_least(section: Any, at: At, null_ok: bool = False, **lowest: float) -> None:
    """ConfigError naming the key unless every ``section.<key>`` is a finite number ``>= lowest[key]``
    (or null if ``null_ok``): NaN and infinity are refused like a value below the bound."""
    for name, low in lowest.items():
        value = getattr(section, name)
        if value is None and null_ok:
            continue
        kind = "a finite number " if isinstance(value, float) else ""
        require(
            value is not None and finite(value) and value >= low,
            at.child(name),
            f"got {value}",
            f"{kind}>= {low}" + (" or null" if null_ok else ""),
        )


def at_most(section: Any, at: At, **highest: float) -> None:
    """ConfigError naming the key unless every ``section.<key>`` is null or ``<= highest[key]``
    (run after `at_least`, which refuses what is not a finite number)."""
    for name, high in highest.items():
        value = getattr(section, name)
        require(value is None or value <= high, at.child(name), f"got {value}", f"at most {high}")


#: a field's ``metadata`` key: the field is left out of `to_plain` while it holds its default, so a
#: key added later does not change the fingerprints of the configs written before it
OMITTED_WHEN_DEFAULT = "omitted_when_default"


def to_plain(obj: Any) -> Any:
    """A config as plain YAML/JSON data (paths as strings); stable for fingerprints (fields marked
    `OMITTED_WHEN_DEFAULT` appear only when set)."""
    if dataclasses.is_dataclass(obj):
        return {
            f.name: to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not (f.metadata.get(OMITTED_WHEN_DEFAULT) and getattr(obj, f.name) == f.default)
        }
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj
