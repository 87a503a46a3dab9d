"""Where a dataset lives: a local folder or ``msc://PROFILE/prefix`` (multi-storage-client, the
profile from ``MSC_CONFIG``), read and listed through Energon's ``EPath`` either way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.errors import DatasetError

if TYPE_CHECKING:
    from megatron.energon.epathlib import EPath


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
