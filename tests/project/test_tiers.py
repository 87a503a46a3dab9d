"""The two tiers (`tests.helpers.tiers`): the fast list names real tests, its tests are marked at
collection, and a fast test that starts a process fails. No process is started here: the process
starters are replaced by stand-ins first, so a broken guard calls a stand-in, not the system."""

from __future__ import annotations

import ast
import multiprocessing.process
import os
import subprocess
import threading

import pytest

from tests.conftest import pytest_itemcollected
from tests.helpers import REPO, tiers


def _tests_defined(module: str) -> set[str]:
    """Names of the test functions (and ``Class::test`` methods) ``module`` defines."""
    tree = ast.parse((REPO / module).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            names.add(node.name)
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.update(
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test")
            )
    return names


def _marks_slow(module: str) -> bool:
    """Whether ``module`` uses ``pytest.mark.slow`` anywhere (a decorator, ``pytestmark``, a
    parametrization's ``marks``)."""
    tree = ast.parse((REPO / module).read_text())
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "slow"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        for node in ast.walk(tree)
    )


def test_the_fast_list_names_existing_tests_once_in_order():
    assert tiers.FAST, "the fast tier names no test"
    assert list(tiers.FAST) == sorted(set(tiers.FAST)), "FAST: sorted, each entry once"
    for entry in tiers.FAST:
        module, _, test = entry.partition("::")
        assert module.startswith("tests/") and (REPO / module).is_file(), f"no module {module}"
        defined = _tests_defined(module)
        assert defined, f"{module} defines no test"
        assert not test or test in defined, f"{module} defines no test {test}"
        if not test:
            assert not _marks_slow(module), f"{module} has slow tests: name its fast ones"


@pytest.mark.parametrize(
    "nodeid,fast",
    [
        (
            "tests/project/test_tiers.py::test_the_fast_list_names_existing_tests_once_in_order",
            True,
        ),
        ("tests/project/test_tiers.py::test_a_fast_test_is_marked[nodeid]", True),
        ("tests/project/test_tiers.pyx::test_a_fast_test_is_marked", False),
        ("tests/project/test_lint.py::test_ruff", False),
    ],
)
def test_a_fast_test_is_marked(nodeid, fast):
    class Item:
        def __init__(self):
            self.nodeid, self.markers = nodeid, []

        def add_marker(self, mark):
            self.markers.append(mark.name)

    item = Item()
    pytest_itemcollected(item)
    assert item.markers == (["fast"] if fast else [])


@pytest.fixture
def starters(monkeypatch) -> list[str]:
    """The process starters `tiers.no_process` guards, replaced by stand-ins that record a call."""
    calls: list[str] = []
    for owner, name in (
        (subprocess.Popen, "_execute_child"),
        (multiprocessing.process.BaseProcess, "start"),
        (os, "fork"),
        (os, "posix_spawn"),
        (os, "system"),
    ):
        monkeypatch.setattr(owner, name, lambda *a, _n=name, **k: calls.append(_n))
    return calls


def _start_each():
    """Starts a process each way; yields what each raised (None: it went through)."""
    for start in (
        lambda: subprocess.run(["true"]),
        lambda: multiprocessing.process.BaseProcess.start(object()),
        os.fork,
        lambda: os.posix_spawn("/bin/true", ["true"], {}),
        lambda: os.system("true"),
    ):
        try:
            start()
            yield None
        except tiers.ProcessRefused as e:
            yield e


def test_no_process_refuses_and_records_each_way_of_starting_one(starters):
    originals = (subprocess.Popen._execute_child, os.fork, os.system)
    with tiers.no_process() as started:
        raised = list(_start_each())
    assert all(isinstance(e, tiers.ProcessRefused) for e in raised), raised
    assert starters == [], "a guarded call reached the starter"
    assert started == ["subprocess", "multiprocessing", "os.fork", "os.posix_spawn", "os.system"]
    assert (subprocess.Popen._execute_child, os.fork, os.system) == originals, "not restored"


def test_no_process_leaves_threads_that_were_running_before(starters):
    go, done, finish = threading.Event(), threading.Event(), threading.Event()

    def earlier():
        go.wait(10)
        os.system("true")
        done.set()
        finish.wait(10)  # alive until the later thread ran: its ident cannot be reused

    thread = threading.Thread(target=earlier)
    thread.start()
    try:
        with tiers.no_process() as started:
            go.set()
            assert done.wait(10)
            refused = []
            later = threading.Thread(target=lambda: refused.extend(_start_each()))
            later.start()
            later.join(10)
    finally:
        finish.set()
        thread.join(10)
    assert starters == ["system"], "the earlier thread's call went through, the later one's not"
    assert len(started) == len(refused) == 5
    assert all(isinstance(e, tiers.ProcessRefused) for e in refused)


def test_a_shared_library_lookup_is_left_alone():
    """``find_library`` runs ``ldconfig -p`` (a real one, here) and goes through; nothing else."""
    import ctypes.util

    with tiers.no_process() as started:
        assert ctypes.util.find_library("c")
        with pytest.raises(tiers.ProcessRefused):
            subprocess.run(["true"])
    assert started == ["subprocess"]


def test_a_fast_test_that_starts_a_process_fails_in_one_line(starters):
    with pytest.raises(pytest.fail.Exception) as failed, tiers.fast_test("tests/x.py::test_y"):
        with pytest.raises(tiers.ProcessRefused):
            subprocess.run(["true"])
    assert str(failed.value).startswith("tests/x.py::test_y is in the fast tier but started")
    assert "\n" not in str(failed.value)
    with tiers.fast_test("tests/x.py::test_y"):
        pass  # no process: passes
