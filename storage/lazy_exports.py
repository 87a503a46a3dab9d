"""Doors that import on first use (PEP 562): a package lists the names it exports and the module
that defines each, and importing the package imports none of those modules.

It sits in the lowest room so that every package (``storage``, ``converters``, ``task_encoders``,
``energon_platform`` and its rooms) can keep a cheap door with the same rule; it imports nothing
but the standard library.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, which exports ``names`` (public
    name → dotted module that defines it; a name whose module is ``package.name`` is that submodule
    itself). A name is imported on first access and then stored in the package, so later lookups
    skip ``__getattr__``; any other name raises ``AttributeError`` as for a plain module (so
    ``from package import submodule`` still finds the submodules not listed)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        imported = importlib.import_module(module)
        value = imported if module == f"{package}.{name}" else getattr(imported, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
