"""What the docs tests share: the site, built once per test run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.once import once_per_run


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """``mkdocs build --strict`` of the docs into a temporary folder; the build must succeed with no
    warning (none is silenced: without ``-q`` mkdocs counts warnings for ``--strict`` at the levels
    it shows). Built with ``COLUMNS=60``, so a CLI reference that took the terminal's width instead
    of its own fixed one would show it. Built once for all the run's test processes (the tests
    only read it, or write files of their own names beside a page)."""

    def build(out: Path) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "COLUMNS": "60"},
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return str(out)

    return Path(once_per_run(tmp_path_factory, "site", build))
