"""The check's ``--out``: claimed before a run starts (anything the check did not write there is
refused), and its ``report.json`` written whole.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from energon_platform.training import checkpoint
from storage.outputs import refuse_places

#: what the check writes in ``--out`` (besides its two run folders); a leftover write probe is harmless
OUT_FILES = {"report.json", ".report.json.tmp", "loss.png"}
RUN_DIRS = ("straight", "killed")


def _own_report(path: Path) -> bool:
    """Whether ``path`` is a report check-resume wrote (a JSON object with its verdict's fields)."""
    try:
        report = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and {"steps_compared", "resume_step", "passed", "rows"} <= set(
        report
    )


def _foreign(d: Path, allowed: set[str]) -> list[str]:
    """The names in folder ``d`` that are not in ``allowed`` (none when ``d`` is no folder)."""
    if not d.is_dir():
        return []
    return sorted(
        p.name
        for p in d.iterdir()
        if p.name not in allowed and not p.name.startswith(".write-test-")
    )


def claim_out(out: Path, run_files: set[str]) -> tuple[Path, Path]:
    """Make ``out`` the check's folder, with its two run folders emptied for new runs; returns them.

    Before anything is written or deleted, refuses (`CheckpointError`, one
    line) an ``out`` that holds anything check-resume did not write: a name other than its run
    folders, ``report.json`` and ``loss.png``; a ``report.json`` that is not a check-resume
    report (a converted dataset's, say); a ``loss.png`` without one; a run folder holding more
    than a run writes (``run_files``). A new or empty folder, or one an earlier check made, is fine.
    First the output rule's places (`storage.outputs.refuse_places`): not inside a dataset, a
    conversion or a run's checkpoints, not the home folder, the root or a repository's root."""
    refuse_places(out, "--out", folder=True)
    foreign = _foreign(out, OUT_FILES | set(RUN_DIRS))
    report = out / "report.json"
    if report.exists() and not _own_report(report):
        foreign.insert(0, report.name)
    elif (out / "loss.png").exists() and not report.exists():
        foreign.insert(0, "loss.png")
    if foreign:
        raise checkpoint.CheckpointError(
            f"{out}: holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, which check-resume did not "
            f"write; it writes only into a new or empty folder or one it made: choose another --out"
        )
    dirs = tuple(out / name for name in RUN_DIRS)
    # a run folder is deleted whole: it must be a real folder holding only a run's files
    for d in dirs:
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            raise checkpoint.CheckpointError(
                f"{d}: a {'link' if d.is_symlink() else 'file'} check-resume did not "
                f"make; it deletes only its own runs: choose another --out"
            )
        foreign = _foreign(d, run_files)
        if foreign:
            raise checkpoint.CheckpointError(
                f"{d}: holds {', '.join(foreign[:3])}, which check-resume did not write; "
                f"it deletes only its own runs: choose another --out"
            )
    checkpoint.writable_dir(out, "the check's runs and report")
    for d in dirs:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    return dirs


def write_report(out: Path, result: dict) -> None:
    """``OUT/report.json``, replaced whole (a kill never leaves half a report, which a rerun would refuse)."""
    tmp = out / ".report.json.tmp"
    # strict JSON: NaN/inf become null
    tmp.write_text(json.dumps(_finite(result), indent=1, allow_nan=False))
    tmp.replace(out / "report.json")


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
