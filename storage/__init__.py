"""The storage room: where a dataset lives (a local folder or ``msc://PROFILE/prefix`` on object
storage, through multi-storage-client and Energon's ``EPath``) and how its failures read.

It sits below the other packages: ``converters/`` (``info``, ``verify``, uploads) and the loader
(``energon_platform.loader``) both use it, and it imports none of them (``tests/test_layering.py``).

* `storage.errors`: `DatasetError`, `StorageError`, `storage_errors`, `caused_by`.
* `storage.paths`: `dataset_root` (path or URL → ``EPath``), `is_remote`, `check_there` (nothing
  can be at a path: no such folder, no such bucket).
* `storage.outputs`: the output rule of every command that writes (`check_file`, `check_folder`,
  `write_atomic`).
* `storage.retry`: `with_retries` (backoff over a store's passing failures).
* `storage.lazy_exports`: `lazy_exports`, the doors of every package (names imported on
  first use).
"""

from storage.errors import DatasetError, StorageError, caused_by, storage_errors
from storage.paths import check_there, dataset_root, is_remote
from storage.retry import RetriesExhausted, with_retries

__all__ = [
    "DatasetError",
    "RetriesExhausted",
    "StorageError",
    "caused_by",
    "check_there",
    "dataset_root",
    "is_remote",
    "storage_errors",
    "with_retries",
]
