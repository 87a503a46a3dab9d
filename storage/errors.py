"""What a dataset or its store failing reads like: one line that names the path.

`DatasetError` is bad input (not a dataset, an unknown profile, a missing shard);
`StorageError` is the store failing a read (credentials refused, connection lost after the
client's retries, an object gone). Callers never skip a sample on a ``StorageError``: a skip caused
by the store would change the data of one run and not another.
"""

from __future__ import annotations

import contextlib


class DatasetError(ValueError):
    """The dataset path is not a usable Energon dataset (one line, names the path).

    Raised in a DataLoader worker, PyTorch re-raises it in the main process with the worker's
    traceback as its message; ``str()`` gives back the one line (``args[0]`` keeps the traceback).
    """

    def __str__(self) -> str:
        text = super().__str__()
        if "Original Traceback" not in text:
            return text
        return text.rstrip().splitlines()[-1].partition(": ")[2] + " (in a DataLoader worker)"


class StorageError(DatasetError):
    """The dataset's storage failed a read (one line, names the path and the cause)."""


def caused_by(error: BaseException, kinds: type | tuple[type, ...]) -> bool:
    """Whether ``error`` or its direct cause is one of ``kinds``: MSC raises a failed download as
    ``OSError("Failed to download file ...")`` from what the store answered (a refused credential,
    a missing object)."""
    return any(isinstance(x, kinds) for x in (error, error.__cause__))


@contextlib.contextmanager
def storage_errors(path: str, what: str):
    """Turn what the storage client raises inside the block into `StorageError`: ``OSError``
    (permission, missing object, I/O), MSC's ``RuntimeError`` (connection failed after botocore's
    retries), ``RetryableError`` (MSC's own retries used up) and `RetriesExhausted`
    (ours). ``DatasetError`` passes through."""
    from multistorageclient.types import RetryableError

    from storage.retry import RetriesExhausted

    try:
        yield
    except DatasetError:
        raise
    except RetriesExhausted as e:
        raise StorageError(
            f"{path}: cannot reach {what} after {e.tries} tries ({type(e.last).__name__}: {e.last})"
        ) from e
    except (OSError, RuntimeError, RetryableError) as e:
        hint = ""
        if isinstance(e, PermissionError) and path.startswith("msc://"):
            from megatron.energon.epathlib import EPath

            hint = f"; check the credentials of MSC profile {EPath(path).profile!r} (MSC_CONFIG)"
        raise StorageError(f"{path}: cannot read {what} ({type(e).__name__}: {e}){hint}") from e
