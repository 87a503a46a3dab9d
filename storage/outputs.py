"""The output rule: a command writes only what is its own, and refuses before any long work.

Every command that writes (``convert``, ``check-resume``, ``replay``, ``calibrate``, ``report``,
``preview``, ``train --out``, ``scripts/render_measurements.py``) asks this module first, with what
it reads (``inputs``) and how it recognises its own earlier output (``own``, by a marker or the
file's own format):

* `check_file`: a file written whole (a cost file, an HTML report, a picture).
* `check_folder`: a folder a command fills (a replayed run, a check's runs).
* `refuse_places`: the places nothing may write into, alone (``convert`` adds its own rules).

Refused, in one line naming the path and what to do (`OutputError`), before anything is written:
an input of the command (or, for a folder, a folder that is, holds or lies inside one); a path
inside a dataset (a folder with ``.nv-meta/``) or a conversion (``.convert/``); a run's own files
(``log.jsonl``, ``run.yaml``, ``run.json`` of a training run's folder) and anything inside a run's
``checkpoints/``; a folder output that is the home folder, the file system's root or a
repository's root; and an existing path the command did not write. A file the command wrote
before is replaced; a folder it filled before only with ``--overwrite``; in the refusal of a
folder, only the names the command did not write are listed.

A training run's folder is one that holds the `RUN_RECORD` a training run wrote (`run_record`:
a JSON object with the run's command, versions and start); a ``log.jsonl`` or a ``checkpoints/``
alone does not make one (a user's folder may hold either).

`write_atomic` writes through a temporary sibling renamed into place, so a kill never leaves half
a file where the user's was.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path

from storage.paths import is_remote

#: What a training run writes beside its ``checkpoints/`` folder (never another command's output).
RUN_FILES = ("log.jsonl", "run.yaml", "run.json")
#: The record that makes a folder a training run's (``energon_platform.training.run_record``).
RUN_RECORD = "run.json"
#: What every record a training run writes holds, with the type of each.
RUN_RECORD_KEYS = {"command": list, "versions": dict, "started": str}


class OutputError(ValueError):
    """An output path a command may not write; one line naming it and what to do."""


def run_record(folder: Path) -> dict:
    """The `RUN_RECORD` a training run wrote in ``folder``; `OutputError` naming the file when
    there is none, when it cannot be read or parsed (said so: never reported as missing), or
    when it is not a run's record (not an object with the `RUN_RECORD_KEYS`)."""
    import json

    path = Path(folder) / RUN_RECORD
    if not path.exists() and not path.is_symlink():
        raise OutputError(f"{path}: missing; a training run writes it when it starts")
    try:
        text = path.read_bytes()
    except OSError as e:
        raise OutputError(f"{path}: unreadable ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise OutputError(
            f"{path}: unparsable ({str(e).splitlines()[0]}), so not a training run's record"
        ) from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), t) for k, t in RUN_RECORD_KEYS.items()
    ):
        raise OutputError(
            f"{path}: not a training run's record (a run records its "
            f"{', '.join(RUN_RECORD_KEYS)} there)"
        )
    return data


def is_run(folder: str | Path) -> bool:
    """Whether ``folder`` is a training run's folder: it holds the record a run wrote
    (`run_record`); a ``log.jsonl`` or a ``checkpoints/`` alone does not make one."""
    try:
        run_record(Path(folder))
    except OutputError:
        return False
    return True


def protected_place(path: Path) -> str | None:
    """Why nothing may be written at ``path`` (resolved), or None: a place inside a dataset, a
    conversion or a run's checkpoints, or one of a run's own files."""
    if path.name in RUN_FILES and is_run(path.parent):
        return f"a file of the training run {path.parent}"
    for folder in [path, *path.parents]:
        if (folder / ".nv-meta").is_dir() and folder != path:
            return f"inside the dataset {folder}"
        if (folder / ".convert" / "state.json").is_file() and folder != path:
            return f"inside the conversion {folder}"
        if folder.name == "checkpoints" and is_run(folder.parent):
            return f"inside the checkpoints of the run {folder.parent}"
    return None


def _is_special_folder(path: Path) -> str | None:
    """``path`` (resolved) is the home folder, the file system's root or a repository's root."""
    if path == Path(path.anchor):
        return "the file system's root"
    if path == Path.home().resolve():
        return "your home folder"
    if (path / ".git").exists():
        return "a repository's root"
    return None


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def refuse_places(
    path: str | Path, flag: str = "--out", inputs: Iterable = (), folder: bool = False
) -> Path:
    """``path`` resolved, after refusing an input, a protected place (`protected_place`) and, for
    a ``folder`` output, the home folder, the root, a repository root and a folder that holds or
    lies in an input. Remote inputs (``msc://``) are left out."""
    resolved = Path(path).resolve()
    special = _is_special_folder(resolved) if folder else None
    if special:
        raise OutputError(
            f"{flag} {path}: {special}; this command writes only into a folder of its own; "
            f"nothing was written; choose another {flag}"
        )
    for inp in inputs:
        if inp is None or is_remote(inp):
            continue
        r = Path(inp).resolve()
        if r == resolved or (folder and (_inside(r, resolved) or _inside(resolved, r))):
            raise OutputError(
                f"{flag} {path}: {'is' if r == resolved else 'is inside or holds'} {inp}, which "
                f"this command reads; nothing was written; choose another {flag}"
            )
    why = protected_place(resolved)
    if why:
        raise OutputError(
            f"{flag} {path}: {why}; this command writes only its own output there; nothing was "
            f"written; choose another {flag}"
        )
    return resolved


def check_file(
    path: str | Path,
    own: Callable[[Path], bool],
    what: str,
    *,
    flag: str = "--out",
    inputs: Iterable = (),
    example: str = "out",
) -> Path:
    """Refuse (`OutputError`) to write the file ``path`` unless it is new or ``own(path)`` says
    it is this command's earlier output (``what``, e.g. "cost file"); also `refuse_places` and a
    parent that cannot take a file. Creates the parent folder. Call before any long work.
    ``example``: the file name a refused folder is shown with (``cost.json``)."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{flag} {path}: a folder; name the {what} to write, e.g. {p / example}")
    refuse_places(p, flag, inputs)
    if p.is_symlink() or (p.exists() and not (p.is_file() and own(p))):
        raise OutputError(
            f"{flag} {path}: exists and is not a {what} this command wrote; nothing was changed; "
            f"move it away or choose another {flag}"
        )
    probe_writable(p.parent, flag, path)
    return p


def check_folder(
    path: str | Path,
    own: Callable[[Path], bool],
    what: str,
    *,
    overwrite: bool,
    flag: str = "--out",
    inputs: Iterable = (),
    foreign: Callable[[Path], list[str]] | None = None,
) -> Path:
    """Refuse (`OutputError`) to fill the folder ``path`` unless it is new or empty, or
    ``own(path)`` says it holds this command's earlier output (``what``, e.g. "replay") and
    ``overwrite`` is set; also `refuse_places` for a folder. ``foreign(path)``: the names in a
    folder ``own`` refuses that the command did not write, the ones the refusal lists (default:
    every name). Call before any long work."""
    p = Path(path)
    refuse_places(p, flag, inputs, folder=True)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{flag} {path}: a file, not a folder; choose another {flag}")
    names = sorted(q.name for q in p.iterdir()) if p.is_dir() else []
    if names and not own(p):
        listed = sorted(foreign(p)) if foreign is not None else names
        listed = listed or names  # a folder refused for what it lacks: all it holds
        raise OutputError(
            f"{flag} {path}: holds {', '.join(listed[:3])}{', ...' if len(listed) > 3 else ''}, "
            f"which no {what} wrote; nothing was changed; choose a new or empty {flag}"
        )
    if names and not overwrite:
        raise OutputError(
            f"{flag} {path}: holds an earlier {what}; pass --overwrite to replace it, or choose "
            f"another {flag}"
        )
    probe_writable(p, flag, path)
    return p


def write_probe(folder: Path) -> None:
    """Create ``folder`` if needed and prove a file can be written in it (a file made and removed:
    a read-only file system, no permission or a file in the way raise ``OSError``)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
    os.close(fd)
    os.unlink(probe)


def probe_writable(folder: Path, flag: str, path) -> None:
    """`write_probe` of ``folder``; `OutputError` naming ``path`` when it fails."""
    try:
        write_probe(folder)
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None


@contextmanager
def write_atomic(path: str | Path):
    """``with write_atomic(path) as tmp:`` write the file ``tmp`` (beside ``path``, whose folder is
    created); on success it replaces ``path`` (a rename), on an error it is removed and ``path`` is
    left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: The file in a converted dataset that every loader reading it holds a shared lock on
#: (`hold_readers`), so that ``convert --overwrite`` does not change the data under a live run.
READERS_FILE = ".convert/readers"


class Readers:
    """Descriptors of `READERS_FILE` s with a shared lock each, released by `release` or when
    this object is collected (plain descriptors: no file object to be finalised first, with a
    warning, when a failed constructor leaves both in a cycle)."""

    def __init__(self, fds: list[int]):
        self.fds = fds

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)  # closing drops the lock
        self.fds = []

    def __del__(self) -> None:
        self.release()


def hold_readers(folders: Iterable) -> Readers:
    """Shared locks (``flock``) on the `READERS_FILE` of each local folder that has one, held
    while the returned `Readers` lives (a loader keeps it; the kernel drops the locks when the
    process ends, SIGKILL included). Folders without the file, or remote ones, are passed over."""
    import fcntl

    held = []
    for folder in folders:
        if folder is None or is_remote(folder):
            continue
        try:
            fd = os.open(Path(folder) / READERS_FILE, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        held.append(fd)
    return Readers(held)


def read_by_a_run(folder: Path) -> bool:
    """Whether a live process holds `hold_readers`' lock on ``folder`` (an exclusive lock cannot
    be had)."""
    import fcntl

    try:
        f = open(folder / READERS_FILE, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False
