"""The code is lint-clean and formatted: ``ruff check`` and ``ruff format --check`` (config in
pyproject.toml, line length 100) over the whole repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def _ruff(*args: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is not installed (it is in the [test] extra of pyproject.toml)"
    return subprocess.run([ruff, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check_finds_nothing():
    r = _ruff("check", "--output-format", "concise", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_changes_nothing():
    r = _ruff("format", "--check", ".")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
