"""The ``energon-platform index`` command that builds the length index a run needs.

A run started with ``--set`` overrides may need another index than its config file names (another
dataset, encoder or cache folder): the command a run prints when it finds no usable index
(`length_store.open_index`) is its config file plus a ``--set`` for each key the index depends on
(`INDEX_KEYS`) whose value in the run differs from the file's. Other overrides (the steps, the
balance mode, ``loader.length_index`` itself) change nothing in the index and are left out.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from energon_platform.config import config_dict, load_config
from task_encoders.config_parser import ConfigError

if TYPE_CHECKING:
    from energon_platform.config import RunConfig

#: the run config's keys a length index depends on: the datasets of the training split, the
#: encoder (its config is the index's name) and the shared folder it is kept in
INDEX_KEYS = ("data.path", "data.train_split", "encoder", "loader.length_cache")
#: what a key the config file does not hold reads as
_ABSENT = object()


def index_command(cfg: RunConfig) -> str:
    """``energon-platform index --config FILE [--set KEY=VALUE ...]`` building the index ``cfg``
    needs (module doc); ``--config RUN.yaml`` for a config built in code (no file to name). A file
    that no longer loads on its own gets a ``--set`` for every key of `INDEX_KEYS`."""
    written = bool(cfg.source) and Path(str(cfg.source)).is_file()
    if not written:
        return "energon-platform index --config RUN.yaml"
    run = config_dict(cfg)
    try:
        as_written = config_dict(load_config(cfg.source))
    except (ConfigError, OSError, ValueError):  # it loads with the run's overrides only
        as_written = {}
    sets = []
    for key in INDEX_KEYS:
        sets += _differences(key, _get(run, key), _get(as_written, key))
    words = ["energon-platform", "index", "--config", str(cfg.source)]
    for key, value in sets:
        words += ["--set", f"{key}={_yaml_text(value)}"]
    return shlex.join(words)


def _get(config: dict, key: str) -> Any:
    node: Any = config
    for name in key.split("."):
        if not isinstance(node, dict) or name not in node:
            return _ABSENT
        node = node[name]
    return node


def _differences(key: str, run: Any, written: Any) -> list[tuple[str, Any]]:
    """``(dotted key, value)`` setting ``written`` to ``run``: one per differing leaf where both
    are mappings (an inline encoder changed in one key), else the whole value."""
    if run == written:
        return []
    if isinstance(run, dict) and isinstance(written, dict):
        return [
            pair
            for name in run
            for pair in _differences(f"{key}.{name}", run[name], written.get(name, _ABSENT))
        ] + [(f"{key}.{name}", None) for name in written if name not in run]
    return [(key, run)]


def _yaml_text(value: Any) -> str:
    """``value`` as the YAML text a ``--set`` reads back as ``value``."""
    if isinstance(value, str) and yaml.safe_load(value) == value and "\n" not in value:
        return value
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20)
    return text.removesuffix("...\n").strip()  # a scalar's document end marker
