"""``loader:``'s config, beside the loader it configures: `LoaderConfig`, the loader's keys and
their checks. Its entries that apply from a step on (``blend_schedule``, ``exclude``) and the
bounds are `energon_platform.loader.step_settings`'s; the groups of other components are theirs:
``loader.balance`` (`energon_platform.loader.balance.settings`),
``loader.blend_adapt`` (`energon_platform.loader.mixing.settings`) and the executor's keys
(`energon_platform.loader.executors.settings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from energon_platform.loader.balance.settings import BalanceConfig
from energon_platform.loader.executors.settings import ExecutorConfig
from energon_platform.loader.mixing.settings import BlendAdaptConfig
from energon_platform.loader.step_settings import (
    MAX_BATCH,
    MAX_CONTEXT_PARALLEL,
    MAX_WORKERS,
    BlendStep,
    ExcludeRule,
)
from task_encoders.config_parser import At, at_least, at_most, require

#: The least ``loader.sample_timeout`` (seconds): a worker's start and its first sample take
#: longer than a fraction of a second on a loaded machine.
MIN_SAMPLE_TIMEOUT = 1.0


@dataclass(frozen=True)
class LoaderOptions:
    """The loader's own keys of ``loader:`` (`LoaderConfig`: these, then the executor's)."""

    global_batch_size: int = 8
    """Items per training step over all data-parallel ranks (samples, or pack groups with
    packing); fixed for the life of a run."""
    micro_batch_size: int | None = None
    """Items per ``next()`` on a rank; null: the rank's whole share (no gradient accumulation)."""
    num_workers: int = 2
    """Loader worker processes per rank (may change between save and restore)."""
    seed: int = 1234
    """The seed of the sample order and of per-sample randomness."""
    shuffle_buffer: int | None = None
    """null: a full permutation per epoch; K: a windowed shuffle of K (shard-local reads)."""
    pack_group: int | None = None
    """Samples handed to the encoder's packer together; null: the encoder's
    ``packing.buffer_size`` when its packing is enabled, else 1 (no packing)."""
    prefetch_factor: int = 2
    """Batches each worker prepares ahead."""
    shuffle_run: int = 1
    """With ``shuffle_buffer``: runs of this many consecutive samples stay together (one read
    each on object storage)."""
    blend_unit: Literal["sample", "batch"] = "sample"
    """Blends: ``sample`` (datasets interleave sample by sample) or ``batch`` (every micro-batch
    from one dataset; needs ``micro_batch_size``)."""
    blend_schedule: tuple[BlendStep, ...] = ()
    """Blends: weights from given steps on (a curriculum), a list of ``{step, weights}``
    overriding the metadataset's weights from each entry's step on."""
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    """How global batches are made: a mode alone (``balance: attention``) or the group below."""
    length_cache: str | None = None
    """A folder for length indexes that cannot be stored with their dataset (object storage, a
    read-only folder; a folder every node sees, shared); null: ``$ENERGON_PLATFORM_CACHE/lengths``
    or ``~/.cache/energon-platform/lengths``."""
    length_index: Literal["build", "require"] = "build"
    """A dataset without a length index at start-up: ``build`` it then (after one line naming
    ``energon-platform index`` and the time it takes), or ``require`` it (stop with that line)."""
    exclude: tuple[ExcludeRule, ...] = ()
    """Samples skipped from given steps on: a list of ``{step, keys, shards, datasets}``."""
    blend_adapt: BlendAdaptConfig | None = None
    """Blends: weights that follow the per-dataset loss (`BlendAdaptConfig`); null: fixed
    weights (the metadataset's, ``blend_schedule``)."""
    sample_timeout: float | None = None
    """Seconds a loader worker may spend reading and encoding one sample; null: no limit."""
    context_parallel: int = 1
    """The model's context-parallel ranks (Megatron's ``--context-parallel-size``; 1: off)."""


@dataclass(frozen=True)
class LoaderConfig(ExecutorConfig, LoaderOptions):
    """``loader:``: the order and batching of the training data, one rank's loader.

    ``num_workers`` may change between save and restore; the others may not. Its keys are
    `LoaderOptions`'s, then the executor's (`ExecutorConfig`: ``executor``, ``ray_address``,
    ``ray_actor_options``).

    Blends (``data.path`` an Energon metadataset): weights may change at resume and datasets may
    be added; the history is kept in the loader state.

    Balance: ``balance`` (`BalanceConfig`, a mode or a group). With a mode set and a
    packing encoder every micro-batch is exactly ``micro_batch_size`` rows of ``seq_len``
    (``global_batch_size`` counts rows), packed globally from a pool of ``balance.lookahead``
    global batches of positions (at most ``balance.window`` samples); samples that do not fit
    wait for a later global batch. Unpacked, ``balance.global_batch_tokens`` makes a global batch
    a cost budget (``global_batch_size`` samples at least). Lengths come from a cached length
    index (``length_cache``).

    ``sample_timeout``: a worker stuck longer is killed, the sample counts as failed (its
    stand-in is used, as for a corrupt sample, and it is not waited for again in this process)
    and the workers restart where the loader is: the order and every other batch stay the same, and so does the
    state. With ``num_workers: 0`` it runs one worker process (a sample stuck in the training
    process could not be stopped). The trainer's start-up check, which encodes a few samples in
    its own process, counts a sample past it as failed too (it tries the next). At
    least 1 second; set it well above the slowest normal sample: a sample that only sometimes
    finishes within it makes runs differ.

    ``context_parallel``: with ``N > 1`` ranks the encoder must pack (``packing.enabled``,
    with or without a balance mode), ``text.seq_len`` must be a multiple of ``2N``, and every
    document's attention segment is padded (loss-masked) to a multiple of ``2N``
    (`energon_platform.loader.context_parallel`); vision-language encoders are refused.
    """

    def check(self, at: At) -> None:
        at_least(
            self,
            at,
            global_batch_size=1,
            num_workers=0,
            prefetch_factor=1,
            seed=0,
            shuffle_run=1,
            context_parallel=1,
        )
        require(
            self.shuffle_run == 1 or self.shuffle_buffer is not None,
            at.child("shuffle_run"),
            f"got {self.shuffle_run} with shuffle_buffer null",
            "1 unless shuffle_buffer is set",
        )
        steps = [b.step for b in self.blend_schedule]
        require(
            steps == sorted(set(steps)) and all(s >= 0 for s in steps),
            at.child("blend_schedule"),
            f"steps {steps}",
            "increasing steps >= 0",
        )
        require(self.seed < 2**63, at.child("seed"), f"got {self.seed}", "< 2**63")
        at_least(self, at, null_ok=True, micro_batch_size=1, shuffle_buffer=1, pack_group=1)
        at_most(
            self,
            at,
            global_batch_size=MAX_BATCH,
            micro_batch_size=MAX_BATCH,
            pack_group=MAX_BATCH,
            num_workers=MAX_WORKERS,
            prefetch_factor=MAX_WORKERS,
            context_parallel=MAX_CONTEXT_PARALLEL,
        )
        mode = self.balance.mode
        require(
            mode == "none" or self.balance.window >= self.global_batch_size,
            at.child("balance").child("window"),
            f"{self.balance.window} < global_batch_size {self.global_batch_size}",
            "at least global_batch_size (the pool must hold a global batch)",
        )
        if mode != "none":
            require(
                not self.blend_schedule,
                at.child("blend_schedule"),
                f"set with balance {mode!r}",
                "no blend_schedule with balance (change weights at resume instead)",
            )
            require(
                self.blend_unit == "sample",
                at.child("blend_unit"),
                f"{self.blend_unit!r} with balance {mode!r}",
                "sample (the planner interleaves samples)",
            )
        if self.blend_adapt is not None:
            require(
                not self.blend_schedule,
                at.child("blend_adapt"),
                "set with blend_schedule",
                "one of blend_adapt and blend_schedule",
            )
            require(
                not any(r.datasets for r in self.exclude),
                at.child("exclude"),
                "datasets listed with blend_adapt",
                "keys or shards (the mixer sets every dataset's weight)",
            )
        require(
            mode == "none" or not any(r.datasets for r in self.exclude),
            at.child("exclude"),
            f"datasets listed with balance {mode!r}",
            "keys or shards (with balance, set a dataset's weight to 0 at resume instead)",
        )
        require(
            self.sample_timeout is None
            or (self.sample_timeout > 0 and math.isfinite(self.sample_timeout)),
            at.child("sample_timeout"),
            f"got {self.sample_timeout}",
            "seconds > 0, or null for no limit",
        )
        self.check_executor(at, self.num_workers)
        require(
            self.sample_timeout is None or self.sample_timeout >= MIN_SAMPLE_TIMEOUT,
            at.child("sample_timeout"),
            f"got {self.sample_timeout}: below it every worker is killed before its first "
            f"sample (a new worker takes seconds to start)",
            f"at least {MIN_SAMPLE_TIMEOUT:g} second, well above the slowest normal sample",
        )
