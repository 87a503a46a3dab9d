"""The reference pages read well and come from the code: the API page renders Google docstrings
with typed signatures and parameter tables (no Sphinx role left anywhere on the site), the CLI page
holds every command's ``--help`` as it prints, the config page tables every key of every config
dataclass with its default and meaning (every shipped encoder's keys included, with the defaults
that encoder gives them), and the site shows the project's version."""

import argparse
import dataclasses
import html
import importlib.util
import json
import os
import re
import typing

import pytest

from energon_platform.cli import build_parser
from energon_platform.config import RunConfig
from task_encoders.config import EncoderConfig
from task_encoders.image_transforms import TransformSpec
from task_encoders.registry import available, encoder_class
from tests.helpers import REPO
from tests.helpers.cli import run_cli

COLUMNS = "100"
#: A Sphinx role as the HTML shows it: Markdown turns its backticks into ``<code>``.
ROLE = re.compile(r":(?:class|func|mod|meth|attr|data|exc):(?:`|<code)")


def page(site, name: str) -> str:
    return (site / name / "index.html").read_text()


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def code_blocks(page_html: str) -> list[str]:
    """The text of every ``<pre>`` block of a page, as it was before HTML escaping."""
    return [text(block) for block in re.findall(r"<pre[^>]*>(.*?)</pre>", page_html, re.S)]


def test_no_sphinx_role_is_left_on_any_page(site):
    found = {
        f"{path.relative_to(site)}: {role}"
        for path in site.rglob("*.html")
        for role in ROLE.findall(path.read_text())
    }
    assert not found, f"Sphinx roles render as text: {sorted(found)}"


def test_api_page_shows_typed_signatures_and_parameter_tables(site):
    api = page(site, "reference/api")
    signatures = [text(s) for s in re.findall(r'class="doc-signature[^"]*">(.*?)</div>', api, re.S)]
    assert any("world_size: int = 1" in s and "TrainLoader(" in s for s in signatures), (
        "TrainLoader's signature with its type annotations"
    )
    i = api.find('id="energon_platform.loader.train_loader.TrainLoader"')
    assert i >= 0
    section = api[i : api.find("</table>", i)]
    assert 'doc-section-title">Parameters:' in section, "Args: renders as a parameters table"
    row = re.search(r"<code>world_size</code>(.*?)</tr>", section, re.S)
    assert row and re.search(r"^\s*int\s+the number of data-parallel ranks", text(row[1])), (
        "world_size's row: its type and its description"
    )


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def test_cli_page_holds_every_commands_help_as_argparse_prints_it(site, monkeypatch):
    blocks = code_blocks(page(site, "reference/cli"))
    monkeypatch.setenv("COLUMNS", COLUMNS)
    helps = {path: parser.format_help() for path, parser in commands(build_parser())}
    assert ("convert", "coco") in helps and ("train",) in helps, sorted(helps)
    missing = [" ".join(path) or "(top)" for path, h in helps.items() if h not in blocks]
    assert not missing, f"commands whose --help the CLI page lacks: {missing}"


def test_every_commands_help_fits_the_100_columns_the_cli_page_promises(monkeypatch):
    monkeypatch.setenv("COLUMNS", COLUMNS)
    wide = [
        f"{' '.join(path) or '(top)'}: {len(line)} columns: {line[:60]!r}..."
        for path, parser in commands(build_parser())
        for line in parser.format_help().splitlines()
        if len(line) > int(COLUMNS)
    ]
    assert not wide, "\n".join(wide)


@pytest.mark.parametrize("words", [(), ("convert", "coco"), ("check-resume",)])
def test_cli_page_matches_the_help_the_command_prints(site, words):
    r = run_cli(*words, "--help", cwd=REPO, timeout=60, env={**os.environ, "COLUMNS": COLUMNS})
    assert r.returncode == 0, r.stderr
    assert r.stdout in code_blocks(page(site, "reference/cli"))
    heading = " ".join(("energon-platform", *words))
    assert f">{heading}<" in page(site, "reference/cli"), f"a heading {heading!r}"


def expected_rows(cls: type, key: str = ""):
    """``(key, default as YAML writes it or None when required)`` of every field of ``cls`` and of
    the config dataclasses its fields hold."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{key}.{f.name}".lstrip(".")
        nested = [
            t for t in (hints[f.name], *typing.get_args(hints[f.name])) if isinstance(t, type)
        ]
        nested = [t for t in nested if dataclasses.is_dataclass(t)]
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        yield (
            name,
            default,
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        if nested:
            many = "[]" if isinstance(default, tuple) else ""
            yield from expected_rows(nested[0], name + many)


def as_yaml(value) -> str:
    """A default as a YAML flow value: a transform step as the mapping a config writes, a string
    with spaces at an end or a control character double-quoted."""
    if isinstance(value, TransformSpec):
        value = {"name": value.name, **value.params}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(map(as_yaml, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {as_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and (value != value.strip() or not value.isprintable()):
        return json.dumps(value)
    return str(value) or '""'


def config_page_tables(site) -> dict[tuple[str, str], dict[str, list[str]]]:
    """``(h2 text, h3 text)`` → key → the four cells of its row, for every table of the config
    page."""
    tables: dict[tuple[str, str], dict[str, list[str]]] = {}
    h2 = h3 = ""
    pattern = r"<h2[^>]*>(.*?)</h2>|<h3[^>]*>(.*?)</h3>|<tr>(.*?)</tr>"
    for two, three, row in re.findall(pattern, page(site, "reference/config"), re.S):
        if two:
            h2, h3 = text(two).strip(" ¶"), ""
        elif three:
            h3 = text(three).strip(" ¶")
        else:
            cells = [text(c).strip() for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
            if len(cells) == 4:
                tables.setdefault((h2, h3), {})[cells[0]] = cells
    return tables


def shipped_encoders() -> dict[str, type]:
    """``encoder:`` name → config class of every encoder the package ships: defined in
    ``task_encoders`` and not among its examples (other tests of this process register their
    own)."""
    classes = {name: encoder_class(name) for name in available()}
    return {
        name: cls.config_class
        for name, cls in classes.items()
        if cls.__module__.startswith("task_encoders.")
        and not cls.__module__.startswith("task_encoders.examples")
    }


def encoder_defaults(config, key: str = ""):
    """``(key, default)`` of every field of the config instance ``config`` and of the groups it
    holds, as that instance has them (``packing.enabled`` of ``text`` is true). An absent optional
    group (``video.audio``) has its own class's defaults; a dataclass that reads its own value (a
    transform step) is one value, not a group."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        name = f"{key}.{f.name}".lstrip(".")
        value = getattr(config, f.name)
        yield name, value
        groups = [
            t
            for t in (hints[f.name], *typing.get_args(hints[f.name]))
            if isinstance(t, type)
            and dataclasses.is_dataclass(t)
            and not hasattr(t, "from_config_value")
        ]
        if groups:
            yield from encoder_defaults(
                value if isinstance(value, groups[0]) else groups[0](), name
            )


def shown_default(value) -> str:
    return "the group below" if dataclasses.is_dataclass(value) else as_yaml(value)


@pytest.mark.parametrize("config", [RunConfig, EncoderConfig], ids=lambda c: c.__name__)
def test_config_page_tables_every_field_with_its_default_and_meaning(site, config):
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page(site, "reference/config"), re.S):
        cells = [text(c).strip() for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        if len(cells) == 4:
            rows.setdefault(cells[0], []).append(cells)
    expected = list(expected_rows(config))
    assert len(expected) > 5
    assert "loader.balance.mode" in rows and "loader.exclude[].keys" in rows, sorted(rows)
    for key, default, required in expected:
        assert key in rows, f"{key} is not in the config tables"
        shown = {cells[2] for cells in rows[key]}
        if required:
            assert "required" in shown, (key, shown)
        elif dataclasses.is_dataclass(default):
            assert "the group below" in shown, (key, shown)
        else:
            assert as_yaml(default) in shown, (key, as_yaml(default), shown)
        assert all(cells[3] for cells in rows[key]), f"{key} has no meaning"


def test_config_page_tables_every_shipped_encoders_keys_with_the_defaults_it_gives(site):
    tables = config_page_tables(site)
    shared = tables[("Encoder config (configs/encoders/*.yaml)", "Top level")].copy()
    for (h2, _), rows in tables.items():
        if h2.startswith("Encoder config ("):
            shared.update(rows)
    kinds = {h3: rows for (h2, h3), rows in tables.items() if h2 == "Encoder configs"}
    encoders = shipped_encoders()
    assert {"image_text", "conversation", "multimodal", "video_text"} <= set(encoders)
    assert set(kinds) == {f"encoder: {name}" for name in encoders}, sorted(kinds)
    for name, config in encoders.items():
        own = kinds[f"encoder: {name}"]
        assert own.get("encoder", [""] * 3)[2] == name, f"{name}: its encoder row"
        for key, default in encoder_defaults(config()):
            cells = own.get(key) or shared.get(key)
            assert cells, f"{name}: {key} is in neither its table nor the shared ones"
            assert cells[2] == shown_default(default), (name, key, shown_default(default), cells)
            assert cells[3], f"{name}: {key} has no meaning"


def test_home_page_shows_the_version(site):
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"energon-platform {version}" in text((site / "index.html").read_text())


def hook_module():
    spec = importlib.util.spec_from_file_location(
        "reference_hook", REPO / "docs/hooks/reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repository_link_comes_only_from_a_remote_with_a_web_address():
    web_url = hook_module().web_url
    assert web_url("git@github.com:acme/energon-platform.git") == (
        "https://github.com/acme/energon-platform"
    )
    assert web_url("https://gitlab.com/acme/ep.git/") == "https://gitlab.com/acme/ep"
    assert web_url("/srv/git/energon-platform.git") is None
