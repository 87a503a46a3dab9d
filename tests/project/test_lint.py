"""The code is lint-clean and formatted: ``ruff check`` and ``ruff format --check`` (config in
pyproject.toml, line length 100) over the whole repository; and the loader and the task encoders
type-check clean: ``pyright`` in basic mode (``[tool.pyright]``), as ``make lint`` runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed (it is in the [test] extra of pyproject.toml)"
    return found


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_tool("ruff"), *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_ruff_check_finds_nothing():
    r = _ruff("check", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_changes_nothing():
    r = _ruff("format", "--check", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_pyright_finds_no_error_in_the_loader_and_the_task_encoders():
    """``pyright`` with the project's ``[tool.pyright]`` (``energon_platform/loader`` and
    ``task_encoders``, basic mode); it runs on the machine's Node.js, offline."""
    r = subprocess.run(
        # --project: the repository's config, not a pyrightconfig.json in a folder above it
        [_tool("pyright"), "--project", str(REPO / "pyproject.toml"), "--outputjson"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads(r.stdout)
    errors = [
        f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']} ({d.get('rule', '')})"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]
    assert report["summary"]["filesAnalyzed"] > 50, report["summary"]
    assert not errors and r.returncode == 0, "\n".join(errors[:40]) + r.stderr[-2000:]
