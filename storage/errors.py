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


def no_bucket(error: BaseException) -> bool:
    """Whether ``error``, its cause or its context is the store saying the bucket does not exist
    (botocore's ``NoSuchBucket``, raised through MSC as it is)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        code = getattr(error, "response", None)
        if isinstance(code, dict) and code.get("Error", {}).get("Code") == "NoSuchBucket":
            return True
        error = error.__cause__ or error.__context__
    return False


def bucket_error(path: str) -> StorageError:
    """The one line of a ``path`` whose bucket does not exist."""
    profile = str(path).split("://", 1)[1].split("/", 1)[0]
    return StorageError(
        f"{path}: the bucket of MSC profile {profile!r} does not exist (NoSuchBucket); create it, "
        f"or correct the profile's base_path in MSC_CONFIG"
    )


@contextlib.contextmanager
def storage_errors(path: str, what: str):
    """Turn what the storage client raises inside the block into `StorageError`: ``OSError``
    (permission, missing object, I/O), MSC's ``RuntimeError`` (connection failed after botocore's
    retries), ``RetryableError`` (MSC's own retries used up) and `RetriesExhausted`
    (ours); a bucket that does not exist (`bucket_error`), however it is raised.
    ``DatasetError`` passes through."""
    from multistorageclient.types import RetryableError

    from storage.retry import RetriesExhausted

    try:
        yield
    except DatasetError:
        raise
    except (RetriesExhausted, OSError, RuntimeError, RetryableError) as e:
        if no_bucket(e):
            raise bucket_error(path) from e
        if isinstance(e, RetriesExhausted):
            raise StorageError(
                f"{path}: cannot reach {what} after {e.tries} tries "
                f"({type(e.last).__name__}: {e.last})"
            ) from e
        hint = ""
        if isinstance(e, PermissionError) and path.startswith("msc://"):
            from megatron.energon.epathlib import EPath

            hint = f"; check the credentials of MSC profile {EPath(path).profile!r} (MSC_CONFIG)"
        raise StorageError(f"{path}: cannot read {what} ({type(e).__name__}: {e}){hint}") from e
    except Exception as e:  # botocore's ClientError, as MSC lets it through
        if no_bucket(e):
            raise bucket_error(path) from e
        raise
