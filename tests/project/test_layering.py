"""The rooms keep their doors: no package imports a package above it.

``storage/`` is the lowest room (paths, opening, errors); ``converters/`` and ``task_encoders/``
sit on it; ``energon_platform/`` (loader, training, CLI, tools) sits on all three. Every import
statement counts, module-level or inside a function, and so does ``importlib.import_module`` /
``__import__`` with a literal name: a lazy import is still a door.
"""

from __future__ import annotations

import ast

import pytest

from tests.helpers import REPO

#: package (a folder) → the packages above it (dotted), which it must never import. Inside
#: ``energon_platform``, the loader is the lowest room: training, the trainer integrations, the
#: tools and the CLI sit on it.
ABOVE = {
    "storage": {"energon_platform", "converters", "task_encoders"},
    "converters": {"energon_platform"},
    "task_encoders": {"energon_platform"},
    "energon_platform/loader": {
        "energon_platform.training",
        "energon_platform.integrations",
        "energon_platform.tools",
        "energon_platform.cli",
    },
    "energon_platform/training": {"energon_platform.tools", "energon_platform.cli"},
    "energon_platform/integrations": {"energon_platform.tools", "energon_platform.cli"},
    # the benchmarks and tools under scripts/ stand alone: tests may import them, never the reverse
    "scripts": {"tests"},
    "energon_platform/tools": {
        "energon_platform.training",
        "energon_platform.integrations",
        "energon_platform.cli",
    },
}


def imported_modules(source: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every absolute import in ``source``, at any depth: ``import a.b``,
    ``from a.b import c`` and ``importlib.import_module("a.b")`` / ``__import__("a.b")``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))  # relative imports stay inside their package
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def violations(package: str) -> list[str]:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"{package}/ has no modules: the check would pass vacuously"
    bad = []
    for path in files:
        for line, name in imported_modules(path.read_text()):
            if any(name == above or name.startswith(above + ".") for above in ABOVE[package]):
                bad.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    return bad


def test_the_checker_sees_lazy_and_dynamic_imports():
    source = (
        "import os\nfrom . import sibling\n"
        "def f():\n    from energon_platform.loader.source import SampleSource\n"
        "    import importlib\n    return importlib.import_module('converters.remote')\n"
    )
    names = [name for _, name in imported_modules(source)]
    assert names == ["os", "energon_platform.loader.source", "importlib", "converters.remote"]


def test_storage_imports_no_package_above_it():
    assert violations("storage") == []


def test_converters_do_not_import_energon_platform():
    assert violations("converters") == []


def test_task_encoders_do_not_import_energon_platform():
    assert violations("task_encoders") == []


@pytest.mark.parametrize("room", ["loader", "training", "integrations", "tools"])
def test_rooms_inside_energon_platform_import_none_above_them(room):
    assert violations(f"energon_platform/{room}") == []


def test_scripts_import_nothing_from_tests():
    assert violations("scripts") == []


def test_scripts_put_no_tests_folder_on_the_import_path():
    # ``sys.path.insert(0, REPO / "tests")`` then ``import corpora`` imports from tests/ too
    bad = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "scripts").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "sys.path" in line and "tests" in line
    ]
    assert bad == []
