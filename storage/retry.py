"""Retrying what a store fails for a while: a restart, a 5xx, a dropped connection.

`with_retries` calls an action until it returns, pausing ``backoff``, ``2 * backoff``, ...
seconds between tries. What a retry cannot fix is raised at once: a refused credential
(``PermissionError``, also as the cause of a ``StorageError``) and a missing object
(``FileNotFoundError``). The number of tries and the first pause come from the caller, else from
``ENERGON_PLATFORM_UPLOAD_ATTEMPTS`` / ``ENERGON_PLATFORM_UPLOAD_BACKOFF``, else
`ATTEMPTS` / `BACKOFF_S`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from storage.errors import caused_by

T = TypeVar("T")

#: Tries per action before giving up, and the first pause between tries in seconds (doubled each time).
ATTEMPTS = 5
BACKOFF_S = 1.0


class RetriesExhausted(Exception):
    """Every try failed: ``last`` is the final failure, ``tries`` how many were made."""

    def __init__(self, last: BaseException, tries: int):
        super().__init__(str(last))
        self.last, self.tries = last, tries


def _permanent(e: BaseException) -> bool:
    return caused_by(e, (PermissionError, FileNotFoundError))


def with_retries(
    action: Callable[[], T], attempts: int | None = None, backoff: float | None = None
) -> tuple[T, int]:
    """``(action(), retries)``: ``action`` retried on ``OSError``/``RuntimeError``/``ValueError``
    (MSC's failed requests are ``RuntimeError``; a ``StorageError`` is an ``OSError``). A permanent
    failure (module doc) is raised as it is; when every try failed, `RetriesExhausted`
    (from the last failure) is raised."""
    attempts = attempts or int(os.environ.get("ENERGON_PLATFORM_UPLOAD_ATTEMPTS") or ATTEMPTS)
    if backoff is None:
        backoff = float(os.environ.get("ENERGON_PLATFORM_UPLOAD_BACKOFF") or BACKOFF_S)
    for attempt in range(attempts):
        try:
            return action(), attempt
        except (OSError, RuntimeError, ValueError) as e:
            if _permanent(e):
                raise
            if attempt + 1 == attempts:
                raise RetriesExhausted(e, attempts) from e
            time.sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")
