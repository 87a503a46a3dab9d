"""The rooms keep their doors: no package imports a package above it.

``storage/`` is the lowest room (paths, opening, errors); ``converters/`` and ``task_encoders/``
sit on it; ``energon_platform/`` (loader, training, CLI, tools) sits on all three. Every import
statement counts, module-level or inside a function, and so does ``importlib.import_module`` /
``__import__`` with a literal name: a lazy import is still a door.
"""

from __future__ import annotations

import ast
from pathlib import Path

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


# --- the module graph inside energon_platform -------------------------------------------------


def module_name(path: Path) -> str:
    """The dotted module name of a file under the repository (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str = "energon_platform") -> dict[str, set[str]]:
    """Module → the modules of ``package`` it imports (at any depth, lazily or not): an imported
    name that is no module of ``package`` counts as the nearest module above it (``from a.b import
    c``: ``a.b``, unless ``a.b.c`` is a module)."""
    modules = {module_name(p): p for p in sorted((REPO / package).rglob("*.py"))}
    assert len(modules) > 10, f"{package}/ has too few modules: the check would pass vacuously"
    graph = {}
    for name, path in modules.items():
        edges = set()
        for _, imported in imported_modules(path.read_text()):
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != package and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a list of modules, the first repeated at the end) per strongly connected
    group of ``graph`` with more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(_cycle_in(sorted(group), graph))
    return groups


def _cycle_in(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A cycle through ``group[0]`` inside the strongly connected ``group`` (breadth first)."""
    members, start = set(group), group[0]
    came_from = {start: None}
    queue = [start]
    for node in queue:
        for child in sorted(graph[node] & members):
            if child == start:
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if child not in came_from:
                came_from[child] = node
                queue.append(child)
    raise AssertionError(f"{group} is not strongly connected")


def test_the_cycle_finder_names_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_energon_platform_modules_import_each_other_without_cycles():
    assert import_cycles(import_graph()) == []


#: the registries the sections read the names of their keys from (what these import is theirs)
CONFIG_REGISTRIES = {
    "energon_platform.loader.balance.costs",  # the cost models: loader.balance.mode
    "energon_platform.loader.mixing.method",  # the mixing methods: loader.blend_adapt.method
    "energon_platform.loader.executors.registry",  # the executors: loader.executor
}


def is_section(module: str) -> bool:
    """A section's module: ``settings`` (or ``*_settings``) beside the component it configures."""
    return module.rpartition(".")[2].endswith("settings")


def test_config_composes_only_the_sections_which_import_only_sections_and_registries():
    """The run config is read before any room opens: ``config.py`` composes the sections, each in
    a ``settings`` module beside its component, and they import only each other and the
    registries that hold their names; no room's machinery (which takes the config) is imported.
    (Importing a module runs its packages' doors too: `test_doors` imports each section first and
    reads a config importing nothing heavy.)"""
    graph = import_graph()
    sections = sorted(m for m in graph if is_section(m))
    assert "energon_platform.loader.balance.settings" in sections  # the check is not vacuous
    assert CONFIG_REGISTRIES <= set(graph)
    beyond = [
        f"{m} imports {target}"
        for m in ["energon_platform.config", *sections]
        for target in sorted(graph[m])
        if not is_section(target) and target not in CONFIG_REGISTRIES
    ]
    assert beyond == []


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


def test_scripts_and_tests_leave_the_import_path_alone():
    """The benchmarks and tools run as modules from the repository root (``python -m
    scripts.bench.loader``), and so do the processes they and the tests start (``cwd`` the
    repository): none adds a folder to ``sys.path``."""
    edits = ("sys.path.insert(", "sys.path.append(")
    this = Path(__file__).resolve()
    bad = [
        f"{path.relative_to(REPO)}:{number}"
        for folder in ("scripts", "tests")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path.resolve() != this
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(edit in line for edit in edits)
    ]
    assert bad == [], bad
