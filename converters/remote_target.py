"""The ``msc://PROFILE/prefix`` a conversion writes to is the authority on what it holds.

The local staging folder (`converters.remote.staging_dir`) is only a cache: another machine,
or a cleared temp folder, has an empty one. So before anything is written, `claim` reads the
prefix itself: its conversion state ``.convert/state.json`` (put there before the first shard and
marked ``finished`` after the last upload) or, for a prefix uploaded before that state existed,
its ``report.json`` (``source`` and ``options``). A bucket's root (``msc://PROFILE/``) is a prefix
like any other: everything in the bucket is under it. Then:

- a prefix holding objects but no conversion (a WebDataset put there by hand and indexed with
  ``prepare``, other datasets beside a bucket root) is refused, ``overwrite`` or not: nothing on it
  is a conversion's to remove (`ConvertError` naming the URL; nothing is written);
- a prefix holding a conversion of another input or options is refused unless ``overwrite``;
- ``overwrite`` refuses, removing nothing, when the prefix holds an object a conversion does not
  write (`conversion_key`: shards and their ``.tar.idx`` under ``train/``/``val/``, the
  per-shard records ``.convert/units/*.json``, ``.nv-meta/*``, ``report.json``, ``skipped.jsonl``,
  the state); otherwise it deletes them all, the dataset's commit files first and the state last;
- the same conversion, finished, with every file its report names present at its recorded size,
  is returned as done (nothing to convert or upload);
- otherwise the prefix is claimed: this conversion's state goes up (not finished) before any shard.

Progress lives on the prefix too: a unit is done (`done_units`) when its record
``.convert/units/NAME.json`` is there and names a shard present at its recorded size with its
``.tar.idx``; so any machine, with an empty staging folder, converts only the missing units.

Errors: an unknown profile or an unusable ``MSC_CONFIG`` is a one-line `ConvertError`;
the store refusing or failing is a ``StorageError`` (one line).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from converters.energon_meta import META, META_FILES
from converters.output import STATE_FILE, ConvertError, different, state_diff
from converters.remote import COMMIT_FILES
from converters.writer import STATS_DIR
from storage import StorageError, storage_errors, with_retries

_CONVERSION_KEY = re.compile(
    r"^(?:(?:train|val)/shard-\d{6}\.tar(?:\.idx)?|\.nv-meta/[^/]+|report\.json|"
    r"skipped\.jsonl|"
    + re.escape(STATE_FILE)
    + r"|"
    + re.escape(STATS_DIR)
    + r"/(?:train|val)-shard-\d{6}\.json)$"
)
#: What a finished dataset has besides its shards and their ``.tar.idx``.
FINISHED_KEYS = ("report.json", "skipped.jsonl") + tuple(f"{META}/{n}" for n in META_FILES)


def conversion_key(rel: str) -> bool:
    """Whether an object (key relative to the prefix) is one a conversion writes."""
    return bool(_CONVERSION_KEY.match(rel))


@dataclass
class Prefix:
    """An object-storage prefix: the MSC client and the prefix's key (no trailing slash)."""

    url: str
    client: object
    key: str

    def _retried(self, what: str, action, attempts: int | None = None):
        """``action()`` retried while the store fails for a while (`storage.with_retries`:
        a restarting server answers 5xx; ``attempts`` tries, default its), then a one-line
        ``StorageError`` naming ``what``."""
        with storage_errors(self.url, what):
            return with_retries(action, attempts)[0]

    def full_key(self, rel: str) -> str:
        """The store's key of the object at ``rel`` (a bucket root's key is empty)."""
        return f"{self.key}/{rel}" if self.key else rel

    def listing(self) -> dict[str, object]:
        """Every object under the prefix: relative key → MSC's ``ObjectMetadata``."""
        base = self.full_key("")
        return self._retried(
            "the prefix's listing",
            lambda: {
                o.key[len(base) :]: o for o in self.client.list(base) if o.key.startswith(base)
            },
        )

    def objects(self) -> dict[str, int]:
        """Every object under the prefix: relative key → size."""
        return {rel: o.content_length for rel, o in self.listing().items()}

    def read(self, rel: str) -> bytes | None:
        """The bytes of the object at ``rel``, None when there is none."""

        def read() -> bytes | None:
            try:
                return self.client.read(self.full_key(rel))
            except FileNotFoundError:
                return None

        return self._retried(rel, read)

    def read_json(self, rel: str) -> dict | None:
        """The JSON object at ``rel``, None when there is none; an unreadable one is ``{}``."""
        data = self.read(rel)
        if data is None:
            return None
        try:
            value = json.loads(data)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def write_state(self, state: dict, attempts: int | None = None) -> None:
        data = (json.dumps(state, indent=1, sort_keys=True) + "\n").encode()
        self._retried(
            STATE_FILE, lambda: self.client.write(self.full_key(STATE_FILE), data), attempts
        )

    def delete(self, rels: list[str]) -> None:
        for rel in rels:
            self._retried(
                "an object to replace", lambda rel=rel: self.client.delete(self.full_key(rel))
            )


def open_prefix(url: str) -> Prefix:
    """Resolve ``url`` through MSC (no request is sent). A missing or unknown profile, or an
    ``MSC_CONFIG`` that names no readable config, is a one-line ``ConvertError``."""
    import multistorageclient as msc

    try:
        client, key = msc.resolve_storage_client(url)
    except (ValueError, OSError) as e:
        message = " ".join(str(e).split())
        raise ConvertError(
            f"--out {url}: {message} (set MSC_CONFIG to a config that defines the profile)"
        ) from None
    return Prefix(url, client, key.rstrip("/"))


def _finished_and_whole(objects: dict[str, int], report: dict | None) -> bool:
    try:
        shards = {s["shard"]: s["bytes"] for s in report["shards"]}
    except (TypeError, KeyError):
        return False
    if not all(k in objects for k in FINISHED_KEYS):
        return False
    return all(objects.get(s) == size and s + ".idx" in objects for s, size in shards.items())


def _listing(rels: list[str]) -> str:
    return ", ".join(rels[:3]) + (", ..." if len(rels) > 3 else "")


@dataclass(frozen=True)
class Claim:
    """What `claim` found: ``done``, the prefix's ``report.json`` when it holds this
    conversion finished and whole (nothing to do), else None; ``retries``, the upload retries
    earlier runs of this conversion recorded in its state (`record_retries`)."""

    done: dict | None = None
    retries: int = 0


def _recorded_retries(old: dict) -> int:
    value = old.get("upload_retries", 0)
    return value if isinstance(value, int) and value >= 0 else 0


def _is_conversion(old: dict | None, report: dict | None) -> bool:
    """Whether a prefix's state or report says a conversion wrote it (an old one: a report naming
    its source and options)."""
    return old is not None or (report is not None and "source" in report and "options" in report)


def _refuse_foreign(prefix: Prefix, objects: dict[str, int]) -> None:
    """A prefix with objects and no conversion: nothing on it is ours, ``--overwrite`` or not."""
    raise ConvertError(
        f"{prefix.url} holds objects and no energon-platform conversion (found "
        f"{_listing(sorted(objects))}); nothing was changed; choose an empty prefix for --out "
        f"(--overwrite replaces only a conversion, never other objects)"
    )


def _replace(prefix: Prefix, objects: dict[str, int], state: dict) -> None:
    """``--overwrite`` of a conversion: refuse if any object is not one a conversion writes, else
    delete them (commit files first, the state last) and claim the prefix."""
    foreign = sorted(k for k in objects if not conversion_key(k))
    if foreign:
        raise ConvertError(
            f"--overwrite refused: {prefix.url} holds objects no conversion wrote "
            f"({_listing(foreign)}); nothing was removed; move them away or choose another --out"
        )
    ours = sorted(objects)
    commit = [k for k in COMMIT_FILES[::-1] if k in ours]
    prefix.delete(
        commit
        + [k for k in ours if k not in commit and k != STATE_FILE]
        + [k for k in ours if k == STATE_FILE]
    )
    prefix.write_state(state)


def claim(prefix: Prefix, state: dict, overwrite: bool) -> Claim:
    """Make the prefix this conversion's (module doc) and say what it already holds (`Claim`)."""
    objects = prefix.objects()
    old = prefix.read_json(STATE_FILE) if STATE_FILE in objects else None
    report = prefix.read_json("report.json") if "report.json" in objects else None
    if objects and not _is_conversion(old, report):
        _refuse_foreign(prefix, objects)
    if overwrite:
        _replace(prefix, objects, state)
        return Claim()
    if old is not None:
        diff = state_diff(old, state)
    # uploaded before the state existed: its report names source and options
    elif report is not None:
        diff = state_diff(report, state, keys=("source", "options"))
    else:
        diff = []
    if diff:
        foreign = sorted(k for k in objects if not conversion_key(k))
        remedy = (
            f"use another --out (--overwrite would refuse: the prefix also holds {_listing(foreign)}, "
            f"which no conversion wrote)"
            if foreign
            else "use another --out or pass --overwrite to replace it"
        )
        raise ConvertError(f"{prefix.url} holds {different(diff)}; nothing was changed; {remedy}")
    if old is not None and old.get("finished") and _finished_and_whole(objects, report):
        return Claim(done=report)
    if old is None or old.get("finished"):  # a repair must not leave it marked finished if killed
        prefix.write_state(state)
        return Claim()
    return Claim(retries=_recorded_retries(old))


def record_retries(prefix: Prefix, state: dict, retries: int, attempts: int | None = None) -> None:
    """Keep the conversion's upload retries so far on the prefix (a later run adds its own)."""
    prefix.write_state({**state, "upload_retries": retries}, attempts)


def record_retries_of_failed_run(prefix: Prefix, state: dict, retries: int) -> None:
    """`record_retries` after an upload failed for good: one try, and a store that refuses
    it too is left alone (the upload's own error is what the user needs to see)."""
    try:
        record_retries(prefix, state, retries, attempts=1)
    except StorageError:
        pass


def finish(prefix: Prefix, state: dict, retries: int = 0) -> None:
    """After the last upload: mark the prefix's conversion finished (with its upload retries, if any)."""
    prefix.write_state(
        {**state, "finished": True, **({"upload_retries": retries} if retries else {})}
    )


def done_units(prefix: Prefix, units: list, cache: Path) -> dict[str, dict]:
    """The units the prefix holds done (module doc): unit name → its stats (without ``index``).
    Their records are fetched into ``cache`` (a folder; a cached file of the object's size is
    reused), where the index is later built from them."""
    objects = prefix.objects()
    done = {}
    for unit in units:
        rel = f"{STATS_DIR}/{unit.stats_name}"
        if rel not in objects:
            continue
        path = cache / unit.stats_name
        if not path.is_file() or path.stat().st_size != objects[rel]:
            data = prefix.read(rel)
            if data is None:  # deleted since the listing
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        try:
            stats = json.loads(path.read_text())
        except ValueError:
            continue
        if stats.get("samples") and (
            objects.get(unit.name) != stats.get("bytes") or unit.name + ".idx" not in objects
        ):
            continue
        done[unit.name] = {k: v for k, v in stats.items() if k != "index"}
    return done
