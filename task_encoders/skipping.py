"""Bad samples inside a worker: skip, log the key, count, and stop a flood with a clear error.

How it plugs into Energon 7.4.1: every stage of Energon's pipeline (the dataset's own decode step,
``encode_sample``, packing, ``batch``) runs inside an ``ErrorContext`` that, on an exception, calls
``WorkerConfig.global_error_handler(exception, sample, sources)`` and skips the sample. The same
context raises ``FatalSampleError`` after ``failure_tolerance`` *consecutive* failures of that one
stage (Energon's limit; our encoders set it from ``errors.max_consecutive_failures``; Energon's own
decode stage keeps its fixed 100).

`SkipPolicy` is such a handler. Give it to the worker config
(``SeededTaskEncoder.worker_config(...)`` does) and it logs each skipped key with its reason,
counts failures per worker, and raises `TooManyBadSamples` when failures come
``max_consecutive_failures`` times in a row across *all* stages, or exceed
``max_skipped_fraction`` of the samples a worker attempted (checked after ``fraction_after``
attempts). Successes are reported by the encoder (`SkipPolicy.record_success`); the handler
object is shared by the encoder and the worker config, and each worker process has its own copy,
so counts are per worker.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from megatron.energon.errors import FatalSampleError

from task_encoders.config import ErrorsConfig

log = logging.getLogger(__name__)


class TooManyBadSamples(FatalSampleError):
    """A worker skipped more samples than the ``errors:`` section of the encoder config allows."""


def failed_keys(sample: Any) -> list[str]:
    """Keys of whatever a failing stage held: a sample, a raw (undecoded) sample, a batch or pack."""
    if isinstance(sample, (list, tuple)):
        return [key for item in sample for key in failed_keys(item)]
    if isinstance(sample, dict):
        return [str(sample["__key__"])] if "__key__" in sample else []
    key = getattr(sample, "__key__", None)
    if isinstance(key, str):
        return [key.rsplit("/", 1)[-1]]
    if isinstance(key, list):
        return [str(k) for k in key]
    data = getattr(sample, "data", None)  # Energon's RawSampleData, before decoding
    return failed_keys(list(data)) if isinstance(data, tuple) else []


def _where(sample: Any, sources: Any) -> str:
    """`` in <shard> (<members>)`` from Energon's source info (raw samples carry it inside)."""
    if not sources:
        data = getattr(sample, "data", None)
        first = data[0] if isinstance(data, tuple) and data else None
        sources = first.get("__sources__") if isinstance(first, dict) else None
    if not sources:
        return ""
    source = sources[0]
    return f" in {getattr(source, 'shard_name', '?')} {tuple(getattr(source, 'file_names', ()))}"


def _reason(exception: BaseException) -> str:
    """``Type: message``, following the cause chain past messageless wrappers (webdataset's
    ``DecodingError`` has no text of its own)."""
    while not str(exception):
        inner = exception.__cause__ or exception.__context__
        if inner is None:
            break
        exception = inner
    return f"{type(exception).__name__}: {exception}"


class SkipPolicy:
    """Energon ``global_error_handler`` with limits (see module doc). Picklable."""

    def __init__(self, config: ErrorsConfig, source: str = "<dict>"):
        self.config = config
        self.source = source
        self.successes = 0
        self.failures = 0
        self.consecutive = 0
        self.recent: collections.deque[str] = collections.deque(maxlen=5)

    def record_success(self) -> None:
        """Called by the encoder after each sample it encoded."""
        self.successes += 1
        self.consecutive = 0

    def __call__(self, exception: Exception, sample: Any, sources: Any = None) -> None:
        keys = failed_keys(sample) or ["<unknown>"]
        self.failures += 1
        self.consecutive += 1
        self.recent.extend(keys)
        log.warning(
            "skipped sample %s%s: %s (%d skipped, %d encoded in this worker)",
            ",".join(keys),
            _where(sample, sources),
            _reason(exception),
            self.failures,
            self.successes,
        )
        self._check_limits()

    def _check_limits(self) -> None:
        cfg = self.config
        attempted = self.failures + self.successes
        if self.consecutive >= cfg.max_consecutive_failures:
            why = (
                f"{self.consecutive} samples failed in a row "
                f"(errors.max_consecutive_failures={cfg.max_consecutive_failures})"
            )
        elif (
            attempted >= cfg.fraction_after and self.failures > cfg.max_skipped_fraction * attempted
        ):
            why = (
                f"{self.failures} of {attempted} samples failed "
                f"(errors.max_skipped_fraction={cfg.max_skipped_fraction})"
            )
        else:
            return
        raise TooManyBadSamples(
            f"too many bad samples in one worker: {why}; last keys: {', '.join(self.recent)}. "
            f"The data or the decoding is broken; the limits are in {self.source}, section errors."
        )
