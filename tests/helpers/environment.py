"""The test process's environment, put back after each test (`environment_as_found`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environment_as_found(keep: frozenset[str] = frozenset()) -> Iterator[None]:
    """After the body, ``os.environ`` is what it was before it: variables added are removed and
    changed ones set back, all but those named in ``keep`` (left as the body left them)."""
    before = {k: v for k, v in os.environ.items() if k not in keep}
    try:
        yield
    finally:
        for key in set(os.environ) - set(before) - keep:
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
