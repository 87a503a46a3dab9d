"""Encoder configuration: YAML → frozen, validated dataclasses.

Every problem raises `ConfigError`, whose message names the source (the YAML file, or
``<dict>``), the key path and what was expected, e.g.:

    configs/encoders/image_text.yaml: image.transforms[1].name: unknown transform 'RandomFlip'
    (expected one of CenterCrop, ColorJitter, ...)

How a section is read: `parse` walks the dataclass's type hints (``int``, ``float``,
``bool``, ``str``, ``Path``, ``X | None``, ``tuple[X, ...]``, ``list[X]``, ``dict[str, X]``,
``Literal[...]``, nested dataclasses), rejects unknown and missing keys, then calls the
dataclass's ``check(at)`` for rules between values. A section's keys that a file leaves out keep
the encoder's defaults for that section (``packing: {buffer_size: 64}`` in a text config keeps
packing enabled). A dataclass may take over its own parsing
with a classmethod ``from_config_value(value, at)``. Relative paths are resolved against the YAML
file's folder (the working directory for dicts); a ``Path`` key given a URL (``msc://...``) keeps
it as a string.

The sections every encoder shares live here (`EncoderConfig`); an encoder adds its own
by subclassing it (see ``task_encoders.image_text.ImageTextConfig``). Which subclass reads a file
is decided by its ``encoder:`` name through `task_encoders.registry`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
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
    if dataclasses.is_dataclass(tp):
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
        if value not in args:
            raise at.error(f"got {value!r}", "one of " + ", ".join(map(repr, args)))
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
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise at.child(str(unknown[0])).error("unknown key", "one of " + ", ".join(fields))
        if default is None:
            default = _defaults_of(cls, fields)
        kwargs = {}
        for name in fields:
            if name in value:
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


def to_plain(obj: Any) -> Any:
    """A config as plain YAML/JSON data (paths as strings); stable for fingerprints."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


# --- Sections every encoder shares ---------------------------------------------------------------


@dataclass(frozen=True)
class TextConfig:
    """``text:``: tokenizer and sequence length."""

    tokenizer: Path | None = None
    """A local Hugging Face tokenizer folder (``AutoTokenizer.from_pretrained``); null: the
    shipped ``task_encoders/assets/tokenizer``."""
    seq_len: int = 128
    """Tokens per sequence, BOS and EOS included; longer texts are truncated (EOS kept)."""
    bos_token: str | None = None
    """The BOS token string; null: the tokenizer's own."""
    eos_token: str | None = None
    """The EOS token string; null: the tokenizer's own."""
    pad_token: str | None = None
    """The padding token string; null: the tokenizer's own, else EOS."""

    def check(self, at: At) -> None:
        require(
            4 <= self.seq_len <= 1 << 20,
            at.child("seq_len"),
            f"{self.seq_len} is impossible",
            "an integer from 4 (BOS, two tokens, EOS) to 1048576",
        )
        if self.tokenizer is not None:
            require(
                self.tokenizer.is_dir(),
                at.child("tokenizer"),
                f"no directory {self.tokenizer}",
                "a local Hugging Face tokenizer directory",
            )


@dataclass(frozen=True)
class PackingConfig:
    """``packing:``: several documents per sequence (Energon ``select_samples_to_pack``/``pack_selected_samples``).

    The encoder exposes ``buffer_size`` as ``packing_buffer_size`` (None when packing is off).
    """

    enabled: bool = False
    """Whether documents are packed."""
    buffer_size: int = 512
    """The ``packing_buffer_size`` handed to Energon's ``get_train_dataset``: a larger buffer
    packs tighter; the last pack of every buffer is the one left part-empty."""
    max_docs: int | None = None
    """At most this many documents per pack; null: no limit."""

    def check(self, at: At) -> None:
        require(
            self.buffer_size >= 1,
            at.child("buffer_size"),
            f"got {self.buffer_size}",
            "an integer >= 1",
        )
        if self.max_docs is not None:
            require(
                self.max_docs >= 1, at.child("max_docs"), f"got {self.max_docs}", "an integer >= 1"
            )


@dataclass(frozen=True)
class ErrorsConfig:
    """``errors:``: what a worker tolerates before a bad-data flood becomes an error."""

    max_consecutive_failures: int = 100
    """Energon's own limit (``failure_tolerance``), applied to every stage of this encoder and,
    by `task_encoders.skipping.SkipPolicy`, across all stages (decoding included)."""
    max_skipped_fraction: float = 0.05
    """The share of a worker's samples that may fail, checked once ``fraction_after`` samples
    were attempted."""
    fraction_after: int = 200
    """Samples a worker attempts before ``max_skipped_fraction`` is checked."""

    def check(self, at: At) -> None:
        require(
            self.max_consecutive_failures >= 1,
            at.child("max_consecutive_failures"),
            f"got {self.max_consecutive_failures}",
            "an integer >= 1",
        )
        require(
            0.0 <= self.max_skipped_fraction <= 1.0,
            at.child("max_skipped_fraction"),
            f"got {self.max_skipped_fraction}",
            "a number from 0 to 1",
        )
        require(
            self.fraction_after >= 1,
            at.child("fraction_after"),
            f"got {self.fraction_after}",
            "an integer >= 1",
        )


@dataclass(frozen=True)
class EncoderConfig:
    """Top level of every encoder config file (each encoder adds its own sections)."""

    encoder: str = ""
    """The registered name of the encoder (`task_encoders.registry`)."""
    module: str | None = None
    """A module to import first, for encoders registered outside this package."""
    seed: int = 0
    """The run seed of per-sample randomness (`task_encoders.seeding`); a run config's
    ``loader.seed`` overrides it."""
    text: TextConfig = field(default_factory=TextConfig)
    """Tokenizer and sequence length (the ``text`` table below)."""
    packing: PackingConfig = field(default_factory=PackingConfig)
    """Several documents per sequence (the ``packing`` table below)."""
    errors: ErrorsConfig = field(default_factory=ErrorsConfig)
    """How many bad samples a worker tolerates (the ``errors`` table below)."""

    def check(self, at: At) -> None:
        require(
            0 <= self.seed < 1 << 63,
            at.child("seed"),
            f"got {self.seed}",
            "an integer from 0 to 2**63-1",
        )
