"""Where a dataset lives: a local folder or ``msc://PROFILE/prefix`` (multi-storage-client, the
profile from ``MSC_CONFIG``), read and listed through Energon's ``EPath`` either way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from storage.errors import DatasetError, bucket_error, no_bucket

if TYPE_CHECKING:
    from megatron.energon.epathlib import EPath


#: the folder beside a dataset's shards that holds what the loader derives from them (the length
#: indexes): a conversion's ``--overwrite`` removes it with the shards
DERIVED_FOLDER = ".energon-platform"


def is_remote(path) -> bool:
    """Whether ``path`` names object storage (``msc://PROFILE/prefix``) rather than a local folder."""
    return "://" in str(path)


def dataset_root(path: str) -> EPath:
    """``EPath`` of a dataset folder or ``msc://PROFILE/...`` URL; an unknown MSC profile is a
    `DatasetError`."""
    from megatron.energon.epathlib import EPath

    try:
        return EPath(path)
    except ValueError as e:  # MSC: profile not in MSC_CONFIG / ~/.msc_config.yaml
        raise DatasetError(f"{path}: {e}") from None


def check_there(path: str) -> None:
    """Raise the one line that says nothing can be at ``path``: a local path that does not exist
    (`DatasetError`), a bucket that does not exist (`StorageError`), a conversion that wrote no
    sample there (its ``report.json`` says so: `DatasetError` with the report's reasons); else
    return. Ask it before saying "not an Energon dataset" of a path, which would send the user to
    convert it."""
    if not is_remote(path):
        if not Path(path).exists():
            raise DatasetError(f"{path}: no such file or folder")
    else:
        root = dataset_root(path)
        try:
            next(iter(root.fs.list(str(root.internal_path).rstrip("/") + "/")), None)
        except Exception as e:
            if no_bucket(e):
                raise bucket_error(path) from e
            # anything else is for the caller's own read to meet and name
    _check_wrote_samples(path)


def _check_wrote_samples(path: str) -> None:
    """`DatasetError` when ``path`` holds the ``report.json`` of a conversion that wrote no sample,
    naming the report's skip reasons; nothing when there is no such report or it cannot be read."""
    try:
        report = json.loads((dataset_root(path) / "report.json").read_text())
        written, seen = report["totals"]["written"], report["totals"]["seen"]
        skipped = report.get("skipped_by_reason") or {}
        reasons = ", ".join(f"{reason} {entry['count']}" for reason, entry in skipped.items())
    except Exception:  # no report there, or not a conversion's: not this check's to name
        return
    if written == 0:
        raise DatasetError(
            f"{path}: its conversion wrote no sample ({seen} read, skipped: {reasons or 'none'}; "
            f"see its report.json); fix the input and convert again"
        )
