"""mkdocs hook: the reference pages generated from the code at build time.

- ``reference/cli.md``: the marker `CLI_MARKER` becomes the ``--help`` of every command of
  ``energon_platform.cli.build_parser`` (nested ones included), each under its own heading, as
  argparse prints it with ``COLUMNS=HELP_COLUMNS``.
- ``reference/config.md``: the marker `CONFIG_MARKER` becomes one table per section of the run
  config (``energon_platform.config.RunConfig``) and of the encoder config
  (``task_encoders.config.EncoderConfig``): key, type, default and meaning, the meaning being the
  field's attribute docstring (read with griffe). A field without one stops the build.
- Every page: the version (``pyproject.toml``, else the installed package's) in
  ``extra.version`` and the footer, and ``repo_url``/``edit_uri`` from the checkout's ``origin``
  remote when it has one (no remote: no repository link).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import subprocess
import typing
from contextlib import contextmanager
from pathlib import Path

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


def _field_docs(cls: type) -> dict[str, str]:
    """Field name → its attribute docstring, on one line (griffe reads the source)."""
    import griffe

    obj = griffe.load(f"{cls.__module__}.{cls.__qualname__}", search_paths=[str(ROOT)])
    return {
        name: " ".join(member.docstring.value.split())
        for name, member in obj.members.items()
        if member.docstring is not None
    }


def _item_class(cls: type, f: dataclasses.Field) -> type | None:
    """The dataclass a field holds (``balance``), or holds a tuple of (``blend_schedule``)."""
    hint = typing.get_type_hints(cls)[f.name]
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _yaml(value) -> str:
    """A default as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value) or '""'


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{_yaml(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "the group below" if dataclasses.is_dataclass(value) else f"`{_yaml(value)}`"
    return "required"


def _type(cls: type, f: dataclasses.Field) -> str:
    """The annotation as written, or ``one of `a`, `b``` for a ``Literal``."""
    hint = typing.get_type_hints(cls)[f.name]
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


def config_table(cls: type, key: str) -> str:
    """The Markdown table of one section; a field without a docstring is an error."""
    docs = _field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
    if missing:
        raise ValueError(
            f"{cls.__module__}.{cls.__qualname__}: fields {missing} have no docstring "
            f'(write a """string""" under each field: it is the meaning in reference/config.md)'
        )
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        name = f"{key}.{f.name}".lstrip(".")
        rows.append(f"| `{name}` | {_type(cls, f)} | {_default(f)} | {docs[f.name]} |")
    return "\n".join(rows)


def config_markdown() -> str:
    """A heading per config and per section, each with its table."""
    parts = []
    for title, path in CONFIGS:
        parts.append(f"## {title}\n")
        for key, cls in config_sections(_dataclass(path)):
            heading = f"`{key}`" if key else "Top level"
            parts.append(f"### {heading}\n\n{config_table(cls, key)}\n")
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
