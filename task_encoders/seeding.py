"""Per-sample randomness: one seed per (run seed, sample key, epoch), nothing else.

Contract: every random draw an encoder makes for a sample comes from `derive_seed` of the
run's seed, the sample's key (`sample_key`) and the epoch it is seen in
(`sample_epoch`), optionally split into named streams ("image", "specaugment", ...). Worker
ids, ranks, stream positions and the global RNG state never enter, so a sample's augmented tensors
are the same whatever the number of workers or ranks, or the point a run was resumed from, and
differ between epochs.

Two ways to draw:

* `make_generator`: a private ``torch.Generator`` (for code that accepts ``generator=``).
* `seeded_global_torch`: runs code that draws from torch's global CPU RNG (torchvision v2
  transforms do) with the global generator seeded for the sample, then puts the previous global
  state back. It saves, seeds and restores the CPU generator only: less work per sample than
  ``torch.random.fork_rng`` + ``torch.manual_seed`` (``manual_seed`` reseeds every device backend)
  or Energon's ``@stateless(restore_seeds=True)`` (saves, seeds and restores the torch, numpy and
  ``random`` states). Its cost per sample is part of the encode time ``scripts/bench/video.py``
  measures (its hand-written baseline runs the same transforms under it).

Neither touches numpy's or Python's global RNGs, and the global torch state after encoding is the
state before it. `single_intra_op_thread` removes the last source of difference between
worker layouts: float rounding that depends on the number of intra-op threads.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import torch

_SEED_BITS = 63


def sample_key(sample: Any) -> str:
    """The sample's key as the seed sees it: ``sample.__key__`` after its last ``/``.

    Energon 7.4.1 puts the bare tar-member key there (``"000123"``); other loaders may prefix a
    shard path (``"train/shard-000000.tar/000123"``). Dropping everything up to the last ``/`` gives
    the same key either way. Keys never contain ``/`` (shard contract: ``[A-Za-z0-9_-]+``).
    """
    key = sample.__key__
    if not isinstance(key, str) or not key:
        raise ValueError(f"sample has no string __key__: {key!r}")
    return key.rsplit("/", 1)[-1]


def sample_epoch(sample: Any) -> int:
    """The epoch a sample is seen in: ``sample.__subflavors__["epoch"]``, 0 when absent.

    This is the one place that decides where the epoch comes from. energon_platform's loader
    (whose state is one position, restored without replay) hands out samples whose
    ``__subflavors__`` is a fresh dict holding ``"epoch"``; Energon's own loader gives ``{}`` (or a
    dataset's subflavors), hence epoch 0, unless a metadataset sets an ``epoch`` subflavor.
    """
    subflavors = getattr(sample, "__subflavors__", None) or {}
    epoch = subflavors.get("epoch", 0)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"sample {sample.__key__!r}: epoch must be an int >= 0, got {epoch!r}")
    return epoch


def derive_seed(seed: int, key: str, epoch: int, stream: str = "") -> int:
    """A 63-bit seed from ``blake2b(f"{seed}:{key}:{epoch}")`` (``:{stream}`` appended if given).

    Stable across processes, Python versions and platforms (unlike ``hash()``).
    """
    text = f"{seed}:{key}:{epoch}" + (f":{stream}" if stream else "")
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - _SEED_BITS)


def make_generator(seed: int) -> torch.Generator:
    """A fresh CPU ``torch.Generator`` seeded with ``seed``."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


@contextlib.contextmanager
def seeded_global_torch(seed: int) -> Iterator[None]:
    """Run the body with torch's global CPU generator seeded with ``seed``; restore it after.

    Draws inside equal those after ``torch.manual_seed(seed)``; the global state afterwards equals
    the state before, whether the body returns or raises.
    """
    saved = torch.get_rng_state()
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(saved)


@contextlib.contextmanager
def single_intra_op_thread() -> Iterator[None]:
    """Run the body with one torch intra-op thread, as PyTorch's DataLoader workers always do.

    Float reductions (a ColorJitter contrast mean, a mel filterbank matmul) may split work, and so
    round differently, by thread count; encoding with one thread everywhere keeps a sample's tensors
    bit-identical between ``num_workers=0`` (encoding in the main process) and worker processes.
    Costs one ``torch.get_num_threads`` call where the count is already one.
    """
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)
