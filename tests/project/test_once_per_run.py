"""`tests.helpers.once.once_per_run`: one build for all the test processes of a run."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.once import once_per_run


class _Process:
    """What `once_per_run` reads of a test process's ``tmp_path_factory``: its base folder."""

    def __init__(self, base: Path) -> None:
        base.mkdir()
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


def test_three_processes_asking_at_once_get_one_build(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    processes = [_Process(tmp_path / f"popen-gw{i}") for i in range(3)]
    calls = []

    def build(folder: Path) -> dict:
        calls.append(folder)
        time.sleep(0.3)  # the others ask while it builds
        (folder / "made").write_text("x")
        return {"builds": len(calls)}

    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda p: once_per_run(p, "thing", build), processes))
    assert got == [{"builds": 1}] * 3 and calls == [tmp_path / "thing"]
    assert (tmp_path / "thing" / "made").read_text() == "x"


def test_a_build_that_raised_is_built_again_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    first, second = _Process(tmp_path / "popen-gw0"), _Process(tmp_path / "popen-gw1")

    def broken(folder: Path) -> None:
        (folder / "half").write_text("")
        raise RuntimeError("the build failed")

    with pytest.raises(RuntimeError, match="the build failed"):
        once_per_run(first, "thing", broken)
    assert once_per_run(second, "thing", lambda f: sorted(p.name for p in f.iterdir())) == []


def test_without_xdist_the_base_folder_is_the_processs_own(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    alone = _Process(tmp_path / "base")
    assert once_per_run(alone, "thing", str) == str(tmp_path / "base" / "thing")
