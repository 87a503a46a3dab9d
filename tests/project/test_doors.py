"""Each package's door (its ``__init__.py``): ``__all__`` names what it exports, every name there
resolves to the object its module defines, and opening the door imports nothing heavy."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from tests.helpers.cli import run_python

DOORS = [
    "storage",
    "converters",
    "task_encoders",
    "energon_platform",
    "energon_platform.loader",
    "energon_platform.training",
    "energon_platform.integrations",
    "energon_platform.tools",
]
HEAVY = ("torch", "megatron", "lightning", "PIL", "transformers")


@pytest.mark.parametrize("door", DOORS)
def test_every_exported_name_resolves_to_its_module_object(door):
    package = importlib.import_module(door)
    assert package.__all__, f"{door} exports nothing"
    for name in package.__all__:
        module = getattr(package, "_NAMES", {}).get(name)
        if module == f"{door}.{name}":  # a submodule: found, not imported (a trainer's framework)
            assert importlib.util.find_spec(module) is not None, module
            continue
        value = getattr(package, name)
        assert module is None or value is getattr(importlib.import_module(module), name)
        assert name in dir(package)


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    import energon_platform.training

    with pytest.raises(AttributeError, match="'energon_platform.training' has no attribute 'nope'"):
        energon_platform.training.nope  # noqa: B018 (the attribute access is the test)


def test_opening_every_door_imports_nothing_heavy():
    code = (
        f"import sys\nfor door in {DOORS!r}:\n    __import__(door)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    r = run_python(code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_reading_a_run_config_imports_nothing_heavy():
    """The sections' modules sit beside their components: reading a config opens none of them."""
    code = (
        "import sys\nfrom energon_platform.config import load_config\n"
        "load_config({'data': {'path': '/d'}, 'encoder': {'name': 'image_text'},"
        " 'loader': {'balance': 'tokens', 'blend_adapt': {'method': 'odm'}, 'executor': 'ray'}})\n"
        f"print(sorted(m for m in {(*HEAVY, 'ray')!r} if m in sys.modules))"
    )
    r = run_python(code, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_each_sections_module_and_each_reader_of_one_imports_first():
    """A section's module sits in its component's package, whose door may import that component's
    machinery, and that machinery may read the section: each ``settings`` module, and each module
    importing one, must import in a fresh interpreter before anything else (no cycle through a
    package's door, which the import graph of `test_layering` does not count)."""
    from tests.project.test_layering import import_graph

    graph = import_graph()
    sections = {m for m in graph if m.rpartition(".")[2].endswith("settings")}
    readers = {m for m, edges in graph.items() if edges & sections}
    assert len(sections) >= 5 and "energon_platform.config" in readers
    code = (
        "import subprocess, sys\n"
        "for name in sys.argv[1:]:\n"
        "    r = subprocess.run([sys.executable, '-c', f'import {name}'], capture_output=True,"
        " text=True)\n"
        "    print(name, r.returncode, r.stderr.strip().splitlines()[-1:] if r.returncode else '')\n"
    )
    r = run_python(code, *sorted(sections | readers), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    failed = [line for line in r.stdout.splitlines() if " 0 " not in line]
    assert failed == []
