"""The suite's order (``tests/conftest.py``): each xdist process starts on its share of the slow tests."""

from __future__ import annotations

import pytest

from tests.conftest import pytest_collection_modifyitems


class Item:
    def __init__(self, name: str, slow: bool):
        self.name, self.slow = name, slow

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None


def slices(items: list, workers: int) -> list[list]:
    """The contiguous slices pytest-xdist's worksteal scheduler first hands its processes."""
    out, left = [], list(items)
    for i in range(workers):
        size = len(left) // (workers - i)
        out.append(left[:size])
        left = left[size:]
    return out


@pytest.mark.parametrize("workers,n,slow_every", [(3, 100, 7), (2, 31, 3), (3, 10, 1), (1, 9, 4)])
def test_every_process_starts_on_its_share_of_the_slow_tests(monkeypatch, workers, n, slow_every):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    items = [Item(f"t{i}", i % slow_every == 0) for i in range(n)]
    slow = [i.name for i in items if i.slow]
    pytest_collection_modifyitems(items)
    assert sorted(i.name for i in items) == sorted(f"t{i}" for i in range(n))  # each test once
    shares = []
    for chunk in slices(items, workers):
        flags = [i.slow for i in chunk]
        assert flags == sorted(flags, reverse=True), "slow tests first in every slice"
        shares.append(sum(flags))
    assert max(shares) - min(shares) <= 1 or sum(shares) < len(slow), shares
    assert sum(shares) == len(slow)
