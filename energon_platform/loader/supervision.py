"""What the train loader says and records when its executor's workers fail.

* A sample stuck longer than ``loader.sample_timeout`` (`record_timeouts`, the executor's
  ``on_timeout``): it becomes a failed sample for the rest of this process (its stand-in is used in
  every epoch), one warning names it, the worker and where the workers restart.
* A worker lost (`worker_died`): the one line of
  [`LoaderWorkerError`][energon_platform.loader.train_loader.LoaderWorkerError], naming the worker,
  the micro-batch and how to go on (memory, then a resume, which continues the data exactly).
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

from energon_platform.loader.executors.base import WorkerLost
from energon_platform.loader.key_index import KeyIndex
from energon_platform.loader.sample_watch import Stuck
from storage import DatasetError

log = logging.getLogger(__name__)


def key_of(plan: Any, dataset: int, index: int) -> str:
    """The key of sample ``index`` of ``dataset`` from Energon's index, without reading the sample
    (its read may be what hangs); as in batches, a metadataset's keys carry the dataset name."""
    prefix = plan.datasets.key_prefix(dataset)
    try:
        return prefix + KeyIndex(plan.datasets.entries[dataset].source).keys([index])[0]
    except (DatasetError, sqlite3.Error, OSError):  # no usable index: the position names it
        return f"{prefix}#{index}"


def record_timeouts(loader: Any, stuck: list[Stuck]) -> None:
    """Make the samples of ``stuck`` (workers the executor killed) failed samples of ``loader``
    (its ``timed_out``, which the restarted workers get) and log one warning for each."""
    limit = loader.config.sample_timeout
    for s in stuck:
        key = key_of(loader.plan, s.dataset, s.index)
        loader.timed_out[s.dataset, s.index] = (key, limit)
        log.warning(
            "loader worker %d of rank %d spent %.1f s on sample %s (index %d of dataset %r) in micro-batch "
            "%d, longer than loader.sample_timeout=%g s: worker killed, the sample counts as failed and "
            "its stand-in is used; workers restart at micro-batch %d",
            s.worker,
            loader.rank,
            s.seconds,
            key,
            s.index,
            loader.plan.datasets.entries[s.dataset].name,
            s.micro_batch,
            limit,
            loader.next_microbatch,
        )


def worker_died(loader: Any, lost: WorkerLost) -> str:
    """The message of a worker lost while ``loader``'s next micro-batch was due (a loss that
    says how to resume, such as a Ray cluster that does not answer, keeps its own line)."""
    if lost.says_how_to_resume:
        return str(lost)
    return (
        f"{lost.worker} of rank {loader.rank} died while making micro-batch "
        f"{loader.next_microbatch} (global batch {loader.global_batch}): {lost.reason}. "
        f"Out of memory? Lower loader.num_workers or prefetch_factor; resume from the latest "
        f"checkpoint and the data continues exactly"
    )
