"""Checks a run makes before its first step, so that a mistake costs one line, not a crashed run.

`preflight` (``train`` and ``check-resume`` call it) refuses, with the error types the CLI
prints as one line:

* a dataset the loader cannot use: missing split, missing shard (``SampleSource`` checks the
  train split when the loader opens it; the validation split is checked here too, for a
  metadataset every entry of its validation split);
* an encoder that cannot encode this dataset's samples (an image encoder on audio shards, the
  reverse, a field map without the fields the encoder reads): it encodes the first samples in
  dataset order and fails when as many fail in a row as the encoder's ``errors`` section allows;
* a model that does not fit the encoded media (an image patch larger than the images).

It leaves every global RNG (torch, numpy, python) as it found it, so a run that calls it draws
the same numbers as one that does not.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from energon_platform.config import RunConfig
from energon_platform.config_checks import check_model_fits
from energon_platform.loader.datasets import is_metadataset, open_datasets
from energon_platform.loader.metadataset_weights import read_metadataset
from energon_platform.loader.source import SampleSource, split_parts
from energon_platform.loader.train_loader import TrainLoader
from energon_platform.training import checkpoint
from storage import DatasetError, StorageError, dataset_root
from task_encoders.skipping import _reason

if TYPE_CHECKING:
    from task_encoders.base import SeededTaskEncoder


@contextmanager
def _rng_untouched() -> Iterator[None]:
    saved = checkpoint.rng_state()
    try:
        yield
    finally:
        checkpoint.set_rng_state(saved)


class SampleTimedOut(Exception):
    """A sample of the start-up check took longer than ``loader.sample_timeout``."""


@contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """The block raises `SampleTimedOut` once it has run ``seconds`` (a ``SIGALRM`` timer, in the
    main thread only: elsewhere, or with ``seconds`` None, no limit). A timer the process had set
    (a harness's own time limit) is set again after, less the time the block took."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise SampleTimedOut(f"took longer than loader.sample_timeout={seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    start = time.monotonic()
    delay, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if delay > 0:
            left = delay - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), interval)


def check_encoder_fits(
    source: SampleSource, encoder: SeededTaskEncoder, timeout: float | None = None
) -> Any:
    """The first sample of ``source`` that ``encoder`` encodes (an ``EncodedDoc``), trying up to
    ``errors.max_consecutive_failures`` samples; `DatasetError` naming the dataset, its
    sample type and the encoder's error when every one fails. Counts nothing in the encoder's
    skip policy. ``timeout`` (``loader.sample_timeout``): a sample that takes longer counts as
    failed here, as the loader counts it (a hung first sample hung the start-up before)."""
    tries = min(len(source), encoder.config.errors.max_consecutive_failures)
    kind, error = "samples", None
    with _rng_untouched():
        for index in range(tries):
            try:
                with _time_limit(timeout):
                    sample = source.load(index, encoder.decoder)
                    kind = f"{type(sample).__name__} samples"
                    return encoder.encode(sample)
            # the store or the installation failed, not the sample
            except (
                StorageError,
                ImportError,
            ):
                raise
            except Exception as e:  # noqa: BLE001 - the sample's failure; reported below
                error = e
    raise DatasetError(
        f"{source.path}: the {encoder.name or type(encoder).__name__} encoder cannot "
        f"encode the {kind} of split {source.split!r} ({tries} of {tries} tried failed; first: "
        f"{_reason(error).splitlines()[0]}); use an encoder for this dataset's modality"
    )


def preflight(cfg: RunConfig, loader: Any = None) -> None:
    """Every check of the module doc, for every dataset of the run (each entry of a metadataset).
    ``loader``: the run's ``TrainLoader`` (built here, on one rank without workers, if not given)."""
    if loader is None:
        loader = TrainLoader(cfg, num_workers=0)
    for source in [e.source for e in loader.plan.datasets.entries]:
        check_model_fits(
            cfg.model,
            check_encoder_fits(source, loader.encoder, cfg.loader.sample_timeout),
            cfg.source,
        )
    path = str(cfg.data.path)
    if not cfg.data.val_split:
        return
    # a metadataset's val split, when it has one: every entry's split is opened
    if is_metadataset(path):
        if cfg.data.val_split in read_metadataset(Path(path))["splits"]:
            open_datasets(path, cfg.data.val_split)
    elif (
        dataset_root(path) / ".nv-meta" / "split.yaml"
        # no val split: the run logs no val_loss
    ).is_file() and cfg.data.val_split in split_parts(path):
        SampleSource(path, cfg.data.val_split)  # its shards are checked when opened
