"""The executors ``loader.executor`` names: `EXECUTORS`, name → builder, the one list of them.

A builder is ``build(loader_config, maker_source, workers) -> Executor`` (see
`energon_platform.loader.executors.build`); the package registers its own with `register` when it
is imported, which importing this module does first. The config (`settings.ExecutorConfig`) reads
the names from here, so an executor registered is an executor a config may name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: ``loader.executor`` → its builder, in the order they were registered
EXECUTORS: dict[str, Callable[..., Any]] = {}


def register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make a builder the executor ``loader.executor: NAME`` picks."""

    def add(builder: Callable[..., Any]) -> Callable[..., Any]:
        EXECUTORS[name] = builder
        return builder

    return add


def executor_names() -> tuple[str, ...]:
    """The names ``loader.executor`` takes."""
    return tuple(EXECUTORS)
