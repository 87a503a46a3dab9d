"""The public Python API (issue 21): every name in ``energon_platform.__all__`` imports from the
package itself, the list is the one docs/reference/api.md documents, and importing the package
loads no torch (each name is imported on first use)."""

from __future__ import annotations

import re
import subprocess
import sys

import energon_platform
from demo_datasets import REPO


def documented_names() -> list[str]:
    page = (REPO / "docs/reference/api.md").read_text()
    section = page.split("## Importing", 1)[1].split("\n## ", 1)[0]
    return sorted(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))


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
    from energon_platform.training.step_log import StepLog

    assert energon_platform.TrainLoader is TrainLoader and energon_platform.StepLog is StepLog
    try:
        energon_platform.NoSuchName
    except AttributeError as e:
        assert "NoSuchName" in str(e)
    else:
        raise AssertionError("an unknown name imported")


def test_importing_the_package_loads_no_torch():
    code = "import sys, energon_platform; print('torch' in sys.modules, 'TrainLoader' in dir(energon_platform))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.stdout.split() == ["False", "True"], r.stdout + r.stderr
