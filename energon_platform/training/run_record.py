"""A run folder that records itself: ``run.yaml`` and ``run.json`` beside ``log.jsonl``.

* ``run.yaml``: the config the run trains with: every ``--set`` applied, ``train.steps`` and
  ``train.out`` as the command gave them, paths absolute. `load_config` reads it back to the same
  `RunConfig`. A resume rewrites it with the config it resumed with.
* ``run.json``: how the run was made: the command line, the versions (energon-platform and its git
  commit when it runs from a checkout, Python, torch, megatron-energon), each dataset's identity,
  the loader's fingerprint, the start time and the world size. Each resume appends an entry to
  ``resumes`` with its own command, time, world size and the config keys it changed.

`record_run` writes both (rank 0, each file written whole and renamed into place); the commands
that read a run (``spikes``, ``report``, ``replay``, ``trace``) take ``--run R`` alone through
`recorded_config`, and `config_changes` names what another config changes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from energon_platform.config import RunConfig, config_dict, load_config
from storage.outputs import OutputError, write_atomic

RUN_YAML, RUN_JSON = "run.yaml", "run.json"
#: the packages whose versions a run records
PACKAGES = ("energon-platform", "torch", "megatron-energon")


def record_run(
    out: str | Path,
    cfg: RunConfig,
    world_size: int,
    loader: Any = None,
    argv: list[str] | None = None,
    resumed: bool = False,
) -> dict:
    """Write ``OUT/run.yaml`` and ``OUT/run.json`` for a run that starts or resumes now (module
    doc); ``loader``: its `TrainLoader` (dataset identities and fingerprint). ``resumed``: the
    run continues from a checkpoint, so ``run.json`` keeps its first start and gains an entry
    (a run folder of an earlier version, without one, is recorded as this start). Returns what
    ``run.json`` now holds."""
    out = Path(out)
    check_record(out)
    data = config_dict(cfg)
    now = {
        "command": list(sys.argv if argv is None else argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "world_size": world_size,
    }
    earlier = _read_json(out / RUN_JSON) if resumed else None
    if earlier is None:
        record = {
            **now,
            "versions": versions(),
            "datasets": _datasets(loader),
            "fingerprint": getattr(
                getattr(getattr(loader, "loader", loader), "plan", None), "fingerprint", None
            ),
            "resumes": [],
        }
    else:
        before = _read_yaml(out / RUN_YAML)
        changed = config_changes(before, data) if isinstance(before, dict) else {}
        record = {**earlier, "resumes": [*earlier.get("resumes", []), {**now, "changed": changed}]}
    with write_atomic(out / RUN_YAML) as tmp:
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    with write_atomic(out / RUN_JSON) as tmp:
        tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


def check_record(out: str | Path) -> None:
    """`OutputError` unless ``OUT/run.yaml`` and ``OUT/run.json`` are new or a run's record
    (`record_run` wrote them): a config of the user's own named ``run.yaml`` in the run's folder
    is never replaced. Call before any long work."""
    out = Path(out)
    ours = _read_json(out / RUN_JSON)
    ours = isinstance(ours, dict) and {"command", "versions", "started"} <= set(ours)
    for name in (RUN_YAML, RUN_JSON):
        path = out / name
        if (path.exists() or path.is_symlink()) and not (ours and path.is_file()):
            raise OutputError(
                f"{path}: exists and is not this run's record (a run writes how it was made to "
                f"{RUN_YAML} and {RUN_JSON}); nothing was changed; move it away or choose "
                f"another --out"
            )


def recorded_config(run: str | Path, overrides: dict | None = None) -> RunConfig | None:
    """The config ``RUN/run.yaml`` records (with ``overrides`` applied), or None when the run
    folder records none (a run of an earlier version, or not a run)."""
    path = Path(run) / RUN_YAML
    return load_config(path, overrides) if path.is_file() else None


def config_changes(old: dict, new: dict, prefix: str = "") -> dict[str, list]:
    """``{dotted key: [old value, new value]}`` of every key whose value differs (a key only one
    side has: None on the other)."""
    out: dict[str, list] = {}
    for key in list(old) + [k for k in new if k not in old]:
        a, b = old.get(key), new.get(key)
        dotted = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(config_changes(a, b, dotted + "."))
        elif a != b:
            out[dotted] = [a, b]
    return out


def versions() -> dict:
    """Python's and the recorded packages' versions, and this checkout's git commit (None when
    the package does not run from a git checkout)."""
    found: dict[str, Any] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["git_commit"] = git_commit(Path(__file__).resolve().parents[2])
    return found


def git_commit(folder: Path) -> str | None:
    """The commit checked out in ``folder``'s repository, or None (no repository, no git)."""
    if not (folder / ".git").exists():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _datasets(loader: Any) -> dict:
    """Each dataset's identity, of a `TrainLoader` (or of a wrapper that names one ``loader``)."""
    plan = getattr(getattr(loader, "loader", loader), "plan", None)
    return plan.dataset_identities() if plan is not None else {}


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
