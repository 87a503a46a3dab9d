"""The suite puts the test process's environment back after each test (`tests/conftest.py`), with
the converter's `environment_as_found` (which `run_ray` uses after Ray)."""

from __future__ import annotations

import os

import pytest

from converters.executor import environment_as_found


def test_what_a_body_adds_or_changes_is_put_back_but_what_it_keeps(monkeypatch):
    monkeypatch.setenv("EP_ENV_CHANGED", "before")
    monkeypatch.delenv("EP_ENV_ADDED", raising=False)
    monkeypatch.delenv("EP_ENV_KEPT", raising=False)
    with environment_as_found(keep=frozenset({"EP_ENV_KEPT"})):
        os.environ["EP_ENV_ADDED"] = "1"
        os.environ["EP_ENV_CHANGED"] = "after"
        os.environ["EP_ENV_KEPT"] = "1"
    assert "EP_ENV_ADDED" not in os.environ and os.environ["EP_ENV_CHANGED"] == "before"
    assert os.environ.pop("EP_ENV_KEPT") == "1"


def test_a_removed_variable_comes_back(monkeypatch):
    monkeypatch.setenv("EP_ENV_REMOVED", "here")
    with environment_as_found():
        del os.environ["EP_ENV_REMOVED"]
    assert os.environ["EP_ENV_REMOVED"] == "here"


@pytest.fixture(scope="module")
def checked_after_the_test():
    """Torn down after the function-scoped fixtures of the test that asks for it, the suite's
    autouse one included: what the test leaked must be gone by then."""
    yield
    assert "EP_ENV_LEAKED_BY_A_TEST" not in os.environ


def test_the_suite_puts_a_leaked_variable_back(checked_after_the_test):
    os.environ["EP_ENV_LEAKED_BY_A_TEST"] = "1"
