"""A run folder that records itself: ``run.yaml`` and ``run.json`` beside ``log.jsonl``.

* ``run.yaml``: the config the run trains with: every ``--set`` applied, ``train.steps`` and
  ``train.out`` as the command gave them, paths absolute. `load_config` reads it back to the same
  `RunConfig`. A resume rewrites it with the config it resumed with.
* ``run.json``: how the run was made: the command line, the versions (energon-platform and its git
  commit when it runs from a checkout, Python, torch, megatron-energon), each dataset's identity,
  the loader's fingerprint, the start time and the world size. Each resume appends an entry to
  ``resumes`` with its own command, time, world size and the config keys it changed.

`record_run` writes both (rank 0, each file written whole and renamed into place, ``run.json``
first: a folder holding it is a run's, `storage.outputs.is_run`); the commands that read a run
(``spikes``, ``report``, ``replay``, ``trace``) take ``--run R`` alone through `recorded_config`,
and `config_changes` names what another config changes.

`check_out` is ``train --out``'s output rule: a new or empty folder, or a training run's own
(which it resumes); `run_folder` is where a run's own ``run.yaml`` trains: the folder holding it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from energon_platform.config import RunConfig, config_dict, load_config
from storage.outputs import (
    RUN_RECORD,
    OutputError,
    is_run,
    refuse_places,
    run_record,
    write_atomic,
)

RUN_YAML, RUN_JSON = "run.yaml", RUN_RECORD
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
    # run.json first: a run killed between the two leaves a folder that is still a run's
    with write_atomic(out / RUN_JSON) as tmp:
        tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    with write_atomic(out / RUN_YAML) as tmp:
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    return record


def check_record(out: str | Path) -> None:
    """`OutputError` unless ``OUT/run.yaml`` and ``OUT/run.json`` are new or a run's record
    (`record_run` wrote them): a config of the user's own named ``run.yaml`` in the run's folder
    is never replaced. Call before any long work."""
    out = Path(out)
    ours = is_run(out)
    for name in (RUN_YAML, RUN_JSON):
        path = out / name
        if (path.exists() or path.is_symlink()) and not (ours and path.is_file()):
            raise OutputError(
                f"{path}: exists and is not this run's record (a run writes how it was made to "
                f"{RUN_YAML} and {RUN_JSON}); nothing was changed; move it away or choose "
                f"another --out"
            )


#: what ``train`` writes in its folder (besides the files its own output is captured in)
TRAIN_NAMES = ("log.jsonl", "checkpoints", RUN_YAML, RUN_JSON)


def check_out(out: str | Path, inputs: Iterable = (), writes: Iterable = ()) -> Path:
    """Refuse (`OutputError`, one line naming what is foreign; nothing written) a ``train
    --out`` that is not a new or empty folder or a training run's own (it holds the run.json a
    run wrote, `storage.outputs.run_record`: the run resumed, or started afresh over it). First
    `storage.outputs.refuse_places` for a folder: the file system's root, the home folder, a
    repository's root, a place in a dataset or a run's checkpoints, or a folder that is, holds
    or lies in one of ``inputs``. A folder without a run's record may hold only what a run
    leaves before it records itself: a ``checkpoints/`` with nothing but its run lock, the
    files this process's own output goes to (a launcher such as check-resume captures the run's
    output in its folder), and what the run's config has it write there (``writes``: the
    ``loader.length_cache`` folder, say). Returns ``out`` (a path that is a file is left to the
    writability check that follows). Call on rank 0 before the run lock is taken."""
    out = Path(out)
    refuse_places(out, "--out", inputs, folder=True)
    if not out.is_dir():
        return out
    record = out / RUN_JSON
    if record.exists() or record.is_symlink():
        try:
            run_record(out)
        except OutputError as e:
            raise OutputError(
                f"--out {out}: {e}; nothing was changed; move it away or choose a new or empty "
                f"--out"
            ) from None
        return out
    captured = _captured_output()
    written = [Path(w).resolve() for w in writes if w is not None]
    foreign = sorted(
        p.name
        for p in out.iterdir()
        if not _left_by_a_run(p, captured)
        and not any(w == p.resolve() or p.resolve() in w.parents for w in written)
    )
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise OutputError(
            f"--out {out}: holds {shown}, which no training run wrote (a run's folder holds the "
            f"{RUN_JSON} it wrote); nothing was changed; choose a new or empty --out"
        )
    return out


def _captured_output() -> list[os.stat_result]:
    """The regular files this process's standard output and error are written to."""
    found = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append(st)
    return found


def _left_by_a_run(path: Path, captured: list[os.stat_result]) -> bool:
    """Whether ``path`` is what a run leaves before it records itself: its ``checkpoints/``
    holding at most the run lock (or a link to such a folder: checkpoints kept on another
    disk), or a file this process's output goes to."""
    if path.name == "checkpoints" and path.is_dir():
        return {p.name for p in path.iterdir()} <= {".run.lock"}
    if path.is_file() and not path.is_symlink():
        st = path.stat()
        return any(os.path.samestat(st, c) for c in captured)
    return False


def run_folder(cfg: RunConfig) -> Path | None:
    """The training run's folder whose own ``run.yaml`` ``cfg`` was read from (a run moved
    elsewhere included: its record trains where it is, not in the folder it names), or None."""
    source = Path(cfg.source) if cfg.source else None
    if source is None or source.name != RUN_YAML or not source.is_file():
        return None
    return source.parent if is_run(source.parent) else None


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
