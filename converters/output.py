"""The output folder: what a conversion owns there, the lock, and what ``--overwrite`` may remove.

Ownership: a folder is a conversion's when ``OUT/.convert/state.json`` exists (written under the
lock before any shard). A conversion writes only `OUTPUT_ENTRIES` into OUT, and into
``train/`` and ``val/`` only ``shard-NNNNNN.tar`` (plus Energon's ``.tar.idx`` and ``.tmp`` names
while writing). ``--overwrite`` first lists everything it would remove and refuses, having
removed nothing, unless every entry is provably ours: a folder without our ``state.json``, any
other name in OUT, a symlink, a sub-folder or a foreign file in ``train/``/``val/`` all refuse.
The input is never inside OUT (`check_target`), so it is never removed.

Lock: ``OUT/.convert/lock`` is ``flock``-ed for the whole conversion. The kernel releases it when
the holder exits, SIGKILL included, so it never stays stuck; a second conversion (or an
``--overwrite``) of the same OUT is refused with one line naming the holder (pid, host, start time,
written by `OutputLock.announce` once the holder is going to write).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import time
from pathlib import Path

from storage.outputs import READERS_FILE, read_by_a_run
from storage.paths import DERIVED_FOLDER

STATE_FILE = ".convert/state.json"
LOCK_FILE = ".convert/lock"
#: Everything a conversion writes into OUT, and what the loader derives from it there (the length
#: indexes, `DERIVED_FOLDER`): ``--overwrite`` removes it with the shards it was derived from.
OUTPUT_ENTRIES = (
    "train",
    "val",
    ".nv-meta",
    ".convert",
    "report.json",
    "skipped.jsonl",
    DERIVED_FOLDER,
)
SPLIT_DIRS = ("train", "val")
_SHARD_FILE = re.compile(r"^shard-\d{6}\.tar(\.idx)?(\.tmp)?$")


class ConvertError(Exception):
    """The conversion cannot start or go on (output unusable or holds something else); one line."""


def _os_error(what: str, e: OSError) -> ConvertError:
    return ConvertError(f"{what}: {e.strerror or e}")


def check_target(out: Path, inputs: list[Path]) -> None:
    """Before reading or writing anything: ``out`` is a folder or can be one, and no input is OUT
    itself or inside it."""
    if out.exists() and not out.is_dir():
        raise ConvertError(f"--out {out} exists and is not a folder")
    resolved = out.resolve()
    for inp in inputs:
        r = Path(inp).resolve()
        if r == resolved or resolved in r.parents:
            raise ConvertError(
                f"--out {out} is or holds the input {inp}; choose an --out outside the input"
            )


#: What identifies a conversion: a state or report differing in one of these is another conversion.
FINGERPRINT = ("source", "options", "records")


def state_diff(old: dict, state: dict, keys: tuple[str, ...] = FINGERPRINT) -> list[str]:
    """The ``keys`` in which a recorded conversion ``old`` (a state, or a report for source and
    options) differs from ``state``. A text conversion written before text outputs left the media
    options out compares without them. Input paths alone do not differ where the records are
    compared and the same (an input folder moved with the clone it lies in)."""
    if state.get("modality") == "text" and isinstance(old.get("options"), dict):
        old = {
            **old,
            "options": {k: v for k, v in old["options"].items() if k not in ("image", "audio")},
        }
    diff = [k for k in keys if old.get(k) != state[k]]
    moved = (old.get("source") or {}).get("kind") == state["source"].get("kind")
    if diff == ["source"] and "records" in keys and moved:
        return []  # the same records of the same kind, read from where the input now lies
    return diff


#: What a conversion differing in each `FINGERPRINT` key differs in, in words.
DIFF_WORDS = {
    "source": "input (another kind of corpus, or other input paths)",
    "options": "set of options",
    "records": "input content (records added, removed or changed: a caption, an id, a media "
    "file's size or time)",
}


def different(diff: list[str]) -> str:
    """``a conversion of another ...`` in words, for the keys ``diff`` of `state_diff`."""
    return "a conversion of another " + " and ".join(DIFF_WORDS[k] for k in diff)


def owned(out: Path) -> bool:
    return (out / STATE_FILE).is_file()


def check_not_foreign(out: Path) -> None:
    """Refuse a non-empty folder that holds no conversion (nothing there is ours to touch)."""
    try:
        entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    except OSError as e:
        raise _os_error(f"cannot list --out {out}", e) from e
    if not entries or owned(out):
        return
    if (
        entries == [".convert"]
        and (out / ".convert").is_dir()
        and all(
            p.name in ("lock", Path(READERS_FILE).name, "state.json.tmp")
            for p in (out / ".convert").iterdir()
        )
    ):
        return  # a conversion stopped before it wrote its state
    raise ConvertError(
        f"{out} is not empty and holds no energon-platform conversion (found "
        f"{', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}); nothing was changed; "
        f"choose an empty --out"
    )


class OutputLock:
    """``with OutputLock(out):`` holds OUT's conversion lock (creating OUT if needed)."""

    def __init__(self, out: Path):
        self.out, self._file = out, None

    def __enter__(self) -> OutputLock:
        path = self.out / LOCK_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a+")
        except OSError as e:
            raise _os_error(f"cannot write to --out {self.out}", e) from e
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise ConvertError(
                f"{self.out} is being written by another conversion ({holder}); "
                f"wait for it to finish or choose another --out"
            ) from None
        return self

    def announce(self) -> None:
        """Name this process as the holder (shown to a refused second conversion). Called only once
        the run will write, so that a rerun with nothing to do changes no file."""
        self._file.seek(0)
        self._file.truncate()
        self._file.write(
            f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        )
        self._file.flush()

    def __exit__(self, *exc) -> None:
        self._file.close()  # releases the flock


def _foreign_in(out: Path) -> list[str]:
    """Entries of a conversion folder that no conversion wrote (relative names)."""
    foreign = []
    for p in sorted(out.iterdir()):
        if (
            p.name not in OUTPUT_ENTRIES
            or p.is_symlink()
            or (p.name in SPLIT_DIRS + (".nv-meta", ".convert", DERIVED_FOLDER)) != p.is_dir()
        ):
            foreign.append(p.name)
        elif p.name in SPLIT_DIRS:
            foreign += [
                f"{p.name}/{q.name}"
                for q in sorted(p.iterdir())
                if q.is_symlink() or not q.is_file() or not _SHARD_FILE.match(q.name)
            ]
    return foreign


def removal_plan(out: Path) -> list[Path]:
    """Everything ``--overwrite`` removes: our entries, but never the lock. Raises
    `ConvertError` (before anything is removed) unless all of OUT is provably ours."""
    if not out.is_dir() or not any(out.iterdir()):
        return []
    if not owned(out):
        check_not_foreign(out)  # refuses unless OUT holds only a lock
        return []
    foreign = _foreign_in(out)
    if foreign:
        raise ConvertError(
            f"--overwrite refused: {out} holds files no conversion wrote "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); nothing was removed; "
            f"move them away or choose another --out"
        )
    if read_by_a_run(out):
        raise ConvertError(
            f"--overwrite refused: {out} is read by a running training job (its loader holds "
            f"{READERS_FILE}); replacing it would change the data under the run; nothing was "
            f"removed; wait for the run to end, or convert into another --out"
        )
    plan = [out / n for n in OUTPUT_ENTRIES if n != ".convert" and (out / n).exists()]
    kept = ("lock", Path(READERS_FILE).name)
    return plan + [p for p in sorted((out / ".convert").iterdir()) if p.name not in kept]


def stale_tmp_files(out: Path) -> list[Path]:
    """``.tmp`` files a killed conversion left (ours by name); safe to remove under the lock."""
    found = [
        p
        for d in SPLIT_DIRS
        for p in sorted((out / d).glob("shard-*.tmp"))
        if _SHARD_FILE.match(p.name)
    ]
    return found + sorted((out / ".convert").rglob("*.json.tmp"))


def remove(paths: list[Path]) -> None:
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
