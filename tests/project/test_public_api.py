"""The public Python API: every name in ``energon_platform.__all__`` imports from the
package itself, the list is the one docs/reference/api.md documents, and importing the package
loads no torch (each name is imported on first use); the trainer integrations' documented names
import from their modules; scripts/examples/public_api_lightning.py imports nothing else."""

from __future__ import annotations

import ast
import importlib
import re

import energon_platform
from tests.helpers import REPO
from tests.helpers.cli import run_python


def documented_names() -> list[str]:
    page = (REPO / "docs/reference/api.md").read_text()
    section = page.split("## Importing", 1)[1].split("\n## ", 1)[0]
    return sorted(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))


def documented_integrations() -> dict[str, list[str]]:
    """Module -> names, from the page's trainer-integrations table."""
    page = (REPO / "docs/reference/api.md").read_text()
    section = page.split("## Trainer integrations", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(
        r"^\| `(energon_platform\.integrations\.\w+)` \| (.+) \|$", section, flags=re.M
    )
    return {module: re.findall(r"`(\w+)`", names) for module, names in rows}


def imports_of(path) -> list[tuple[str, str | None]]:
    """``(module, name)`` for each name a script imports (``name`` None for ``import module``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out += [("." * node.level + (node.module or ""), alias.name) for alias in node.names]
    return out


def non_public_imports(path) -> list[str]:
    """What ``path`` imports from this repository other than the documented public names."""
    public = {("energon_platform", name) for name in energon_platform.__all__}
    public |= {
        (module, name) for module, names in documented_integrations().items() for name in names
    }
    # import module
    public |= {(module, None) for module in ("energon_platform", *documented_integrations())}
    # packages, and the scripts' helpers
    ours = {p.name for p in REPO.iterdir() if (p / "__init__.py").exists()}
    ours |= {
        p.stem
        for folder in ("scripts", "scripts/examples", "tests")
        for p in (REPO / folder).glob("*.py")
    }
    return [
        f"{module}: {name}"
        for module, name in imports_of(path)
        if (module.split(".")[0] in ours or module.startswith(".")) and (module, name) not in public
    ]


def test_every_public_name_imports_from_the_package():
    for name in energon_platform.__all__:
        value = getattr(energon_platform, name)
        assert value is not None and getattr(value, "__name__", name) == name, name
    namespace: dict = {}
    exec("from energon_platform import *", namespace)
    assert set(energon_platform.__all__) <= set(namespace)


def test_the_public_names_are_those_the_docs_list():
    assert documented_names() == sorted(energon_platform.__all__)
    assert len(energon_platform.__all__) <= 12  # small on purpose


def test_the_public_names_are_the_internal_objects_and_unknown_names_fail():
    from energon_platform.loader.train_loader import TrainLoader
    from energon_platform.training.step_log_writer import StepLog

    assert energon_platform.TrainLoader is TrainLoader and energon_platform.StepLog is StepLog
    try:
        energon_platform.NoSuchName  # noqa: B018 (the attribute access is the test)
    except AttributeError as e:
        assert "NoSuchName" in str(e)
    else:
        raise AssertionError("an unknown name imported")


def test_importing_the_package_loads_no_torch():
    code = "import sys, energon_platform; print('torch' in sys.modules, 'TrainLoader' in dir(energon_platform))"
    r = run_python(code, timeout=60)
    assert r.stdout.split() == ["False", "True"], r.stdout + r.stderr


def test_the_trainer_integrations_documented_names_import_from_their_modules():
    documented = documented_integrations()
    assert {
        "energon_platform.integrations.lightning",
        "energon_platform.integrations.accelerate",
        "energon_platform.integrations.deepspeed",
    } <= set(documented)
    for module_name, names in documented.items():
        module = importlib.import_module(module_name)
        assert names and all(getattr(module, name, None) is not None for name in names), module_name
        # exported where it says
        assert set(names) <= set(getattr(module, "__all__", names)), module_name


def test_the_public_api_script_imports_only_documented_names(tmp_path):
    script = REPO / "scripts/examples/public_api_lightning.py"
    assert ("energon_platform.integrations.lightning", "EnergonHooks") in imports_of(script)
    assert non_public_imports(script) == []
    # the check bites: the other examples reach a helper of their own; an internal path is caught
    assert "tiny_model: TinyModel" in non_public_imports(
        REPO / "scripts/examples/lightning_example.py"
    )
    internal = tmp_path / "internal.py"
    internal.write_text("from energon_platform.loader.train_loader import TrainLoader\n")
    assert non_public_imports(internal) == ["energon_platform.loader.train_loader: TrainLoader"]


def test_examples_docs_and_docstrings_import_energon_platform_by_its_public_names():
    """What users copy (the examples, the docs' snippets, the docstrings' examples) imports from
    ``energon_platform`` and the documented integration modules only."""
    internal = re.compile(
        r"^\s*(?:from|import) (energon_platform\.(?!integrations\.)\w+[.\w]*)", re.M
    )
    texts = [
        *(REPO / "scripts/examples").glob("*.py"),
        *(REPO / "docs").rglob("*.md"),
        REPO / "README.md",
    ]
    found = [
        f"{path.relative_to(REPO)}: {m}"
        for path in texts
        for m in internal.findall(path.read_text())
    ]
    for module in (
        "energon_platform.training.step_log_writer",
        "energon_platform.loader.train_loader",
    ):
        doc = importlib.import_module(module).__doc__ or ""
        found += [f"{module} docstring: {m}" for m in internal.findall(doc)]
    assert found == []
