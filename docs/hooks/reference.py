"""mkdocs hook: the reference pages generated from the code at build time.

- ``reference/cli.md``: the marker `CLI_MARKER` becomes the ``--help`` of every command of
  ``energon_platform.cli.build_parser`` (nested ones included), each under its own heading, as
  argparse prints it with ``COLUMNS=HELP_COLUMNS``.
- ``reference/config.md``: the marker `CONFIG_MARKER` becomes one table per section of the run
  config (``energon_platform.config.RunConfig``) and of the encoder config
  (``task_encoders.config.EncoderConfig``): key, type, default and meaning, the meaning being the
  field's attribute docstring (read with griffe, inherited ones included). A field without one
  stops the build. Then, under `ENCODER_KINDS_TITLE`, one table per encoder the package ships (its
  ``encoder:`` name from ``task_encoders.registry``): the keys its config class adds, nested groups
  as dotted keys, and the shared keys whose default it changes (`kind_rows`).
- Every page: the version (``pyproject.toml``, else the installed package's) in
  ``extra.version`` and the footer, and ``repo_url``/``edit_uri`` from the checkout's ``origin``
  remote when it has one (no remote: no repository link).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import subprocess
import typing
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLI_MARKER = "<!-- generated: the --help of every command -->"
CONFIG_MARKER = "<!-- generated: config keys -->"
#: The terminal width the help is formatted for (argparse reads ``COLUMNS``).
HELP_COLUMNS = 100
PROG = "energon-platform"
#: (heading, dataclass) of each config whose keys are tabled.
CONFIGS = (
    ("Run config", "energon_platform.config.RunConfig"),
    ("Encoder config (`configs/encoders/*.yaml`)", "task_encoders.config.EncoderConfig"),
)
#: The heading of the per-encoder tables, and the sentence under it.
ENCODER_KINDS_TITLE = "Encoder configs"
ENCODER_KINDS_INTRO = (
    "One table per encoder, under the name its `encoder:` key takes: the keys it adds to the "
    "shared encoder config above (a group's keys follow it, dotted), and the shared keys whose "
    "default it changes. Every other shared key applies as tabled above."
)
#: A required field's default in `config_rows`.
REQUIRED = object()


# --- the version and the repository ------------------------------------------------------------


def project_version() -> str:
    """The ``[project] version`` of ``pyproject.toml``, else the installed distribution's."""
    try:
        import tomllib

        return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    except (ImportError, OSError, KeyError):
        from importlib.metadata import version

        return version(PROG)


def _git(*args: str) -> str | None:
    """``git ARGS`` in the checkout, stripped; None when git fails or is missing."""
    try:
        r = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def web_url(remote: str) -> str | None:
    """The browsable https address of a git remote (``git@host:o/r.git`` or ``https://...``), or
    None for one that has none (a local path)."""
    if remote.startswith("git@") and ":" in remote:
        host, path = remote[4:].split(":", 1)
        remote = f"https://{host}/{path}"
    if remote.startswith("ssh://git@"):
        remote = "https://" + remote.removeprefix("ssh://git@")
    if not remote.startswith(("https://", "http://")):
        return None
    return remote.rstrip("/").removesuffix(".git")


def on_config(config):
    """Set the version and, from the ``origin`` remote, the repository link."""
    version = project_version()
    config.extra["version"] = version
    config.copyright = f"{PROG} {version}"
    remote = _git("remote", "get-url", "origin")
    url = web_url(remote) if remote else None
    if url and not config.repo_url:
        config.repo_url = url
        config.repo_name = url.split("://", 1)[1].split("/", 1)[-1]
        branch = (_git("rev-parse", "--abbrev-ref", "origin/HEAD") or "").removeprefix("origin/")
        host = url.split("/")[2]
        edits = host in ("github.com", "gitlab.com") and branch and branch != "origin/HEAD"
        config.edit_uri = f"edit/{branch}/docs/" if edits else ""
    return config


# --- the CLI reference ---------------------------------------------------------------------------


@contextmanager
def help_columns(columns: int = HELP_COLUMNS):
    """``COLUMNS`` set to ``columns`` inside (argparse reads it when it formats help)."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(words after the program name, parser)`` of the parser and of every command under it,
    depth first in the order ``--help`` lists them."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def cli_markdown() -> str:
    """One heading and one ``text`` block of ``--help`` per command."""
    from energon_platform.cli import build_parser

    parts = []
    with help_columns():
        for path, parser in commands(build_parser()):
            level = "#" * min(2 + max(len(path) - 1, 0), 4)
            parts.append(
                f"{level} {' '.join((PROG, *path))}\n\n```text\n{parser.format_help()}```\n"
            )
    return "\n".join(parts)


# --- the config reference ------------------------------------------------------------------------


def _dataclass(path: str) -> type:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """Field name → its attribute docstring, on one line (griffe reads the source; a field a
    subclass declares again has the subclass's docstring, one it inherits its base's)."""
    import griffe

    obj = griffe.load(f"{cls.__module__}.{cls.__qualname__}", search_paths=[str(ROOT)])
    return {
        name: " ".join(member.docstring.value.split())
        for name, member in obj.all_members.items()
        if member.docstring is not None
    }


def _item_class(cls: type, f: dataclasses.Field) -> type | None:
    """The dataclass a field holds (``balance``), or holds a tuple of (``blend_schedule``); None
    for one that reads its own value (``from_config_value``, e.g. a transform step): its fields are
    no keys."""
    hint = typing.get_type_hints(cls)[f.name]
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return None if hasattr(candidate, "from_config_value") else candidate
    return None


def _plain(value: Any) -> Any:
    """A value as its YAML spelling holds it: a transform step is one mapping of its name and
    parameters."""
    from task_encoders.image_transforms import TransformSpec

    if isinstance(value, TransformSpec):
        return {"name": value.name, **value.params}
    return value


def _yaml(value) -> str:
    """A default as YAML writes it (flow style; a string with spaces at an end, a control
    character or nothing in it double-quoted)."""
    value = _plain(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and (value != value.strip() or not value.isprintable()):
        return json.dumps(value)
    return str(value) or '""'


def _default_text(value: Any) -> str:
    """The default column: ``required``, ``the group below`` or the value as YAML."""
    if value is REQUIRED:
        return "required"
    return "the group below" if dataclasses.is_dataclass(value) else f"`{_yaml(value)}`"


def _default_value(f: dataclasses.Field) -> Any:
    """A field's default (a factory's made), or `REQUIRED`."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return REQUIRED


def _default(f: dataclasses.Field) -> str:
    return _default_text(_default_value(f))


def _type(cls: type, f: dataclasses.Field) -> str:
    """The annotation as written, or ``one of `a`, `b``` for a ``Literal`` and for a field whose
    names come from a registry (``task_encoders.config_parser.CHOICES``)."""
    from task_encoders.config_parser import CHOICES

    hint = typing.get_type_hints(cls)[f.name]
    names = f.metadata.get(CHOICES)
    if names is not None:
        return "one of " + ", ".join(f"`{_yaml(v)}`" for v in names())
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(f"`{_yaml(v)}`" for v in typing.get_args(hint))
    return f"`{f.type}`"


def config_sections(cls: type, key: str = ""):
    """``(key of the section, dataclass)`` of ``cls`` and of every dataclass its fields hold,
    outermost first (``loader``, ``loader.balance``, ``loader.blend_schedule[]``)."""
    yield key, cls
    for f in dataclasses.fields(cls):
        item = _item_class(cls, f)
        if item is not None:
            many = "[]" if _default_is_sequence(f) else ""
            yield from config_sections(item, f"{key}.{f.name}{many}".lstrip("."))


def _default_is_sequence(f: dataclasses.Field) -> bool:
    return isinstance(f.default, (tuple, list))


def _documented(cls: type) -> dict[str, str]:
    """`_field_docs` of a dataclass whose every field has one; ValueError naming the others."""
    docs = _field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
    if missing:
        raise ValueError(
            f"{cls.__module__}.{cls.__qualname__}: fields {missing} have no docstring "
            f'(write a """string""" under each field: it is the meaning in reference/config.md)'
        )
    return docs


TABLE_HEAD = ["| key | type | default | meaning |", "|---|---|---|---|"]


def config_table(cls: type, key: str) -> str:
    """The Markdown table of one section; a field without a docstring is an error."""
    docs = _documented(cls)
    rows = list(TABLE_HEAD)
    for f in dataclasses.fields(cls):
        name = f"{key}.{f.name}".lstrip(".")
        rows.append(f"| `{name}` | {_type(cls, f)} | {_default(f)} | {docs[f.name]} |")
    return "\n".join(rows)


class ConfigRow(typing.NamedTuple):
    """One key of a config: its dotted ``key``, the dataclass ``owner`` whose ``field`` it is and
    its ``default`` (`REQUIRED` when it has none)."""

    key: str
    owner: type
    field: dataclasses.Field
    default: Any


def config_rows(cls: type, key: str = "", defaults: Any = None):
    """Every key of ``cls`` and, after each group, its keys (``image``, ``image.tiling``,
    ``image.tiling.enabled``); defaults are those of ``defaults`` (the enclosing config's default
    group, so ``packing.enabled`` of ``text`` is that encoder's), else the dataclass's own."""
    for f in dataclasses.fields(cls):
        default = getattr(defaults, f.name) if defaults is not None else _default_value(f)
        yield ConfigRow(f"{key}.{f.name}".lstrip("."), cls, f, default)
        item = _item_class(cls, f)
        if item is not None:
            group = default if isinstance(default, item) else None
            many = "[]" if _default_is_sequence(f) else ""
            yield from config_rows(item, f"{key}.{f.name}{many}".lstrip("."), group)


def _shown(row: ConfigRow) -> tuple[str, str]:
    """What a row's type and default columns show."""
    return _type(row.owner, row.field), _default_text(row.default)


def kind_rows(cls: type, shared: type) -> list[ConfigRow]:
    """The rows of an encoder's config class ``cls`` that the ``shared`` class's tables do not
    already show as they are: its own keys, and shared ones with another type or default."""
    known = {row.key: _shown(row) for row in config_rows(shared)}
    return [row for row in config_rows(cls) if known.get(row.key) != _shown(row)]


def rows_table(rows: list[ConfigRow]) -> str:
    """The Markdown table of ``rows``; a field without a docstring is an error."""
    lines = list(TABLE_HEAD)
    for row in rows:
        meaning = _documented(row.owner)[row.field.name]
        kind, default = _shown(row)
        lines.append(f"| `{row.key}` | {kind} | {default} | {meaning} |")
    return "\n".join(lines)


def encoder_kinds() -> list[tuple[str, type]]:
    """``(encoder: name, config class)`` of every encoder this package ships, by name (the
    examples under ``task_encoders.examples`` are not shipped encoders)."""
    from task_encoders.registry import available, encoder_class

    return [
        (name, encoder_class(name).config_class)
        for name in available()
        if not encoder_class(name).__module__.startswith("task_encoders.examples")
    ]


def encoder_kinds_markdown() -> str:
    """`ENCODER_KINDS_TITLE`, its sentence and one heading and `kind_rows` table per encoder."""
    from task_encoders.config import EncoderConfig

    parts = [f"## {ENCODER_KINDS_TITLE}\n\n{ENCODER_KINDS_INTRO}\n"]
    for name, cls in encoder_kinds():
        table = rows_table(kind_rows(cls, EncoderConfig))
        parts.append(f"### `encoder: {name}`\n\n{table}\n")
    return "\n".join(parts)


def config_markdown() -> str:
    """A heading per config and per section, each with its table, then the encoders' tables."""
    parts = []
    for title, path in CONFIGS:
        parts.append(f"## {title}\n")
        for key, cls in config_sections(_dataclass(path)):
            heading = f"`{key}`" if key else "Top level"
            parts.append(f"### {heading}\n\n{config_table(cls, key)}\n")
    parts.append(encoder_kinds_markdown())
    return "\n".join(parts)


# --- the hook ------------------------------------------------------------------------------------

GENERATED = {
    "reference/cli.md": (CLI_MARKER, cli_markdown),
    "reference/config.md": (CONFIG_MARKER, config_markdown),
}


def on_page_markdown(markdown, page, config, files):
    """Replace the marker of a generated page with its text (a page without it stops the build)."""
    if page.file.src_uri not in GENERATED:
        return markdown
    marker, render = GENERATED[page.file.src_uri]
    if marker not in markdown:
        raise ValueError(f"docs/{page.file.src_uri}: no {marker!r} line to replace")
    return markdown.replace(marker, render())
