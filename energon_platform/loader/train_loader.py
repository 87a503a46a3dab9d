"""Train and validation loaders built from a run config.

[`TrainLoader`][energon_platform.loader.train_loader.TrainLoader] is an iterator of micro-batches
with the ``Stateful`` protocol of ``torch.distributed.checkpoint``
(``state_dict``/``load_state_dict``). Its state is a
[`LoaderState`][energon_platform.loader.state.LoaderState] as a plain dict. Restoring costs the same
as starting (no replay), works with another number of workers, and with another data-parallel world
size when that world size divides the global batch.

``data.path`` is one Energon dataset or a metadataset (`datasets`).
The state records the blend's history (`blend_history`); its
fingerprint splits into what must match (encoder config, seed, global batch, pack group, shuffle
mode, blend unit, schedule version) and the identity of each saved dataset by name, which must be
the same data now; datasets may be added at resume, not removed.

Worker supervision: a worker that dies (killed for memory) stops the run with
[`LoaderWorkerError`][energon_platform.loader.train_loader.LoaderWorkerError]; with
``loader.sample_timeout`` a worker on one sample for longer than the limit is killed, the sample
becomes a failed sample (its stand-in is used, as for a corrupt one) and the workers restart at the
loader's position. Micro-batches are pure functions of their position, so the restart changes no
other batch and the state no field.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from megatron.energon import get_val_dataset
from megatron.energon.savable_loader import BasicDataLoader

from energon_platform.config import RunConfig
from energon_platform.loader.allocator import keep_freed_memory
from energon_platform.loader.batches import MicroBatchMaker, MicroBatchStream
from energon_platform.loader.datasets import is_metadataset
from energon_platform.loader.key_index import KeyIndex
from energon_platform.loader.mixing import AdaptError, BlendAdapter, WeightsFeed
from energon_platform.loader.mixing.adapter import floor_problem
from energon_platform.loader.processes import die_with_parent
from energon_platform.loader.run_plan import RunPlan, build_encoder
from energon_platform.loader.sample_watch import SampleWatch, Stuck
from energon_platform.loader.schedule import LayoutError, Schedule
from energon_platform.loader.source import split_parts
from energon_platform.loader.state import STATE_VERSION, LoaderState, StateMismatchError
from energon_platform.loader.trace import Tracer
from storage import DatasetError
from storage.outputs import hold_readers
from task_encoders.config_parser import ConfigError

log = logging.getLogger(__name__)


class TrainLoader:
    """Micro-batches of one data-parallel rank; infinite (epochs follow each other).

    The global batches are those of its `RunPlan`
    (`plan`); the loader adds the worker processes, their supervision, iteration and the
    ``Stateful`` protocol.

    Args:
        cfg: run config (``data``, ``encoder``, ``loader``).
        rank: this rank's index among the data-parallel ranks.
        world_size: the number of data-parallel ranks.
        num_workers: overrides ``cfg.loader.num_workers`` (may differ from the saved run).
    """

    def __init__(
        self, cfg: RunConfig, rank: int = 0, world_size: int = 1, num_workers: int | None = None
    ):
        lc = self.config = cfg.loader
        self.rank, self.world_size = rank, world_size
        self.num_workers = lc.num_workers if num_workers is None else num_workers
        self.prefetch_factor = lc.prefetch_factor
        self.encoder = build_encoder(cfg)
        #: the run's pure plan: datasets, orders, blend, schedule, batching mode, fingerprint
        self.plan = RunPlan(cfg, self.encoder, world_size, self.num_workers, rank)
        #: shared locks on the datasets read, for this loader's life: ``convert --overwrite``
        #: refuses to replace a dataset a live run reads (`storage.outputs.hold_readers`)
        self._reading = hold_readers(e.source.path for e in self.plan.datasets.entries)
        self.maker = self._maker()
        self.next_microbatch = 0
        self._data_path = cfg.data.path  #: named when ``loader.blend_adapt`` finds no blend
        #: ``loader.blend_adapt``: the run's mixer (None: fixed weights), and the file its new
        #: weights reach the workers through (made when workers start)
        self.adapter: BlendAdapter | None = self._adapter(start=0)
        self._feed: WeightsFeed | None = None
        self._tracer = None  #: for `exclusion_stats`, built at its first use
        self._iter = None
        self._watch: SampleWatch | None = (
            None  #: with ``loader.sample_timeout``: the running workers' watch
        )
        #: ``(dataset, index)`` → ``(key, limit)``: samples a worker was replaced for (failed from then on)
        self.timed_out: dict[tuple[int, int], tuple[str, float]] = {}
        #: set by ``energon_platform.integrations.lightning.EnergonHooks``, which corrects the state
        #: Lightning's checkpoint takes; Lightning asking for the state without it is refused
        self.lightning_hooks = False

    def _maker(self) -> MicroBatchMaker:
        """The micro-batch maker of this rank over the plan's current schedule."""
        plan = self.plan
        return MicroBatchMaker(
            plan.datasets,
            self.encoder,
            plan.schedule,
            self.rank,
            self.world_size,
            plan.micro_items,
            planner=plan.planner,
            exclusions=plan.excluder,
        )

    # --- online mixing (loader.blend_adapt) ----------------------------------------------------

    def _adapter(self, start: int) -> BlendAdapter | None:
        """The mixer of a run with ``loader.blend_adapt``, starting at global batch ``start``."""
        adapt = self.config.blend_adapt
        if adapt is None:
            return None
        names, source = self.plan.datasets.names, self.plan.source
        if not self.plan.datasets.metadataset or len(names) < 2:
            what = (
                "is a metadataset of one dataset"
                if names and self.plan.datasets.metadataset
                else "is one dataset"
            )
            raise ConfigError(
                source,
                "loader.blend_adapt",
                f"needs a blend, but data.path {self._data_path} {what} (set data.path to a "
                f"metadataset of two or more datasets, or loader.blend_adapt to null)",
            )
        problem = floor_problem(adapt.floor, len(names))
        if problem is not None:
            raise ConfigError(source, "loader.blend_adapt.floor", problem)
        unit = start * self.plan.units_per_batch
        weights = [s for s in self.plan.blend.segments if s.start <= unit][-1].weights
        return BlendAdapter(adapt, names, weights, start, self.plan.units_per_batch)

    def report_losses(
        self, step: int, keys: Sequence[str], losses: Sequence[float], group: Any = None
    ) -> None:
        """Report global step ``step``'s per-sample losses of this rank: ``keys`` as the batches
        carry them (``__key__``, ``"{dataset}:{key}"`` in a blend), ``losses`` aligned with them.
        Call it on every data-parallel rank after every step, before that step's checkpoint;
        ``group``: the data-parallel process group (None: the default group, when
        ``torch.distributed`` is initialised). Without ``loader.blend_adapt`` it does nothing.
        With it the losses are summed per dataset over the ranks (one small all-reduce), and every
        ``every`` steps the mixer sets the weights used from ``lag`` steps later on."""
        if self.adapter is None:
            return
        before = self.adapter.decided_before()
        segment = self.adapter.report(
            step, [self._dataset_of(k) for k in keys], losses, _summed_over_ranks(group)
        )
        if self.adapter.decided_before() == before:
            return
        if segment is not None and segment.weights == self.plan.blend.segments[-1].weights:
            segment = None
        if segment is not None:
            self.plan.extend_blend([segment])
            self.maker.schedule = self.plan.schedule
        if self._feed is not None:
            self._feed.publish(self.adapter.decided_before(), segment)

    def _dataset_of(self, key: str) -> int:
        """The dataset number of a sample key as batches carry it."""
        datasets = self.plan.datasets
        for d in range(len(datasets.entries)):
            if key.startswith(datasets.key_prefix(d)):
                return d
        raise AdaptError(
            f"report_losses: key {key!r} is of no dataset of the blend (keys are "
            f"'DATASET:KEY' with DATASET one of {datasets.names})"
        )

    def blend_weights(self, batch: int | None = None) -> dict[str, float]:
        """The blend's weights in force at global batch ``batch`` (default: the next one):
        dataset name → share (for the log row)."""
        return self.plan.blend_weights(self.global_batch if batch is None else batch)

    # --- statistics -------------------------------------------------------------------------

    def balance_stats(self, batch: int) -> dict:
        """Global batch ``batch`` of a planned run: per-rank cost max/mean, padding, samples and
        carried samples (for logs and the resume check); ``{}`` unplanned."""
        return self.plan.batching.stats(batch, self.world_size, self.accumulation)

    def exclusion_stats(self, batch: int) -> dict:
        """``{"excluded": {dataset: n}}``: samples of global batch ``batch`` (all ranks) that
        ``loader.exclude`` replaced, computed as ``trace`` computes them (keys from Energon's
        index, no data read); ``{}`` when none (for the trainer's log row)."""
        if not self.plan.exclusions or not any(ex.active(batch) for ex in self.plan.exclusions):
            return {}
        if self._tracer is None:
            self._tracer = Tracer(self.plan)
        counts = self._tracer.excluded_counts(batch + 1)
        return {"excluded": counts} if counts else {}

    def consumed(self) -> dict:
        """Per dataset name: ``{"samples", "epochs"}`` taken before the next global batch."""
        return self.plan.consumed(self.global_batch)

    # --- iteration --------------------------------------------------------------------------

    @property
    def accumulation(self) -> int:
        """Micro-batches per global batch on this rank (gradient-accumulation steps)."""
        return self.maker.accumulation

    @property
    def global_batch(self) -> int:
        """Index of the global batch the next micro-batch belongs to."""
        return self.next_microbatch // self.accumulation

    @property
    def worker_processes(self) -> int:
        """DataLoader worker processes this loader runs: ``num_workers``, but at least one with
        ``loader.sample_timeout`` (a sample stuck in the training process itself could not be stopped)."""
        return max(self.num_workers, 1 if self.config.sample_timeout else 0)

    def _start(self):
        self._start_microbatch = self.next_microbatch
        workers = self.worker_processes
        self.maker.timed_out = self.timed_out  # the workers fork with what timed out so far
        self.maker.watch = self._watch = (
            SampleWatch(workers) if self.config.sample_timeout else None
        )
        if self.adapter is not None and workers > 0:  # new weights reach the workers by file
            if self._feed is None:
                self._feed = WeightsFeed()
            self.maker.follow = self._feed.reader(
                self.maker, self.plan, self.adapter.decided_before()
            )
        stream = MicroBatchStream(self.maker, self.next_microbatch)
        kwargs = {}
        if workers == 0:  # this process makes the batches
            keep_freed_memory()
        if workers > 0:
            kwargs = {
                "prefetch_factor": self.prefetch_factor,
                "multiprocessing_context": "fork",
                "worker_init_fn": _worker_init(),
            }
        # wake up to look at the workers while waiting for a micro-batch
        if self._watch is not None:
            kwargs["timeout"] = min(1.0, self.config.sample_timeout / 4)
        # a private generator: creating the iterator would otherwise draw from the global torch RNG
        # (its base seed), which the trainer's dropout uses and a resume restores
        loader = torch.utils.data.DataLoader(
            stream,
            batch_size=None,
            num_workers=workers,
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator(),
            **kwargs,
        )
        return _without_sigchld_handler(lambda: iter(loader))

    def _next_from_workers(self) -> tuple[int, Any]:
        """The next ``(micro-batch, batch)`` of the DataLoader. With ``loader.sample_timeout`` the
        DataLoader wakes up every fraction of the limit; each time, workers stuck on one sample for
        longer than the limit are replaced (`_replace_stuck`) and the wait goes on."""
        while True:
            try:
                return next(self._iter)
            # torch's words for its `timeout` (no worker died: that is checked first)
            except RuntimeError as e:
                if self._watch is None or not str(e).startswith("DataLoader timed out"):
                    raise
            stuck = self._watch.stuck(self.config.sample_timeout)
            if stuck:
                self._replace_stuck(stuck)

    def _replace_stuck(self, stuck: list[Stuck]) -> None:
        """Kill the workers in ``stuck``, make their samples failed samples (stand-ins from now on,
        in every epoch of this process) and restart the workers at the loader's position: every
        micro-batch not yet returned is made again, the same but for those samples' stand-ins."""
        limit = self.config.sample_timeout
        with _sigchld_ignored():  # a handler PyTorch installed earlier would raise for this kill
            for s in stuck:
                os.kill(self._iter._workers[s.worker].pid, signal.SIGKILL)
            self.close()  # joins the killed workers: no SIGCHLD of theirs is left to deliver
        for s in stuck:
            key = self._key_of(s.dataset, s.index)
            self.timed_out[s.dataset, s.index] = (key, limit)
            log.warning(
                "loader worker %d of rank %d spent %.1f s on sample %s (index %d of dataset %r) in micro-batch "
                "%d, longer than loader.sample_timeout=%g s: worker killed, the sample counts as failed and "
                "its stand-in is used; workers restart at micro-batch %d",
                s.worker,
                self.rank,
                s.seconds,
                key,
                s.index,
                self.plan.datasets.entries[s.dataset].name,
                s.micro_batch,
                limit,
                self.next_microbatch,
            )
        self._iter = self._start()

    def _key_of(self, dataset: int, index: int) -> str:
        """The key of sample ``index`` of ``dataset`` from Energon's index, without reading the sample
        (its read may be what hangs); as in batches, a metadataset's keys carry the dataset name."""
        prefix = self.plan.datasets.key_prefix(dataset)
        try:
            return prefix + KeyIndex(self.plan.datasets.entries[dataset].source).keys([index])[0]
        except (DatasetError, sqlite3.Error, OSError):  # no usable index: the position names it
            return f"{prefix}#{index}"

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        if self.adapter is not None and self.next_microbatch % self.accumulation == 0:
            self.adapter.check_batch(self.global_batch)
        if self._iter is None:
            self._iter = self._start()
        try:
            c, batch = self._next_from_workers()
        except (RuntimeError, ConnectionError, EOFError) as e:
            dead = self._dead_workers(wait=0 if isinstance(e, RuntimeError) else 1.0)
            workers = self.worker_processes
            # not "Caught X in ..."
            if not (workers and (dead or "DataLoader worker (pid" in str(e))):
                raise
            # killed (the kernel's OOM killer), or exited: PyTorch says so in a RuntimeError, or the
            # kill cut a tensor's transfer (ConnectionResetError)
            worker, pid = (
                dead[0]
                if dead
                else ((self.next_microbatch - self._start_microbatch) % workers, "?")
            )
            self.close()
            raise LoaderWorkerError(
                f"loader worker {worker} (pid {pid}) of rank {self.rank} died while making micro-batch "
                f"{self.next_microbatch} (global batch {self.global_batch}): "
                f"{(str(e).splitlines() or [type(e).__name__])[0]}. "
                f"Out of memory? Lower loader.num_workers or prefetch_factor; resume from the latest "
                f"checkpoint and the data continues exactly"
            ) from None
        # bad data or a failed store: stop the other workers, so this error is the last line
        except DatasetError:
            self.close()
            raise
        assert c == self.next_microbatch, (
            f"micro-batch {c} arrived where {self.next_microbatch} was due"
        )
        self.next_microbatch += 1
        if self.next_microbatch % self.accumulation == 0:
            self.plan.batching.step_done(self.global_batch)
        return batch

    def _dead_workers(self, wait: float) -> list[tuple[int, int]]:
        """``(worker id, pid)`` of the DataLoader workers that died (killed, or exited with an error
        status); waits up to ``wait`` seconds for one (a transfer cut by a kill can surface just
        before the exit is visible). A worker that exited with 0 did not die: PyTorch retired it
        (its iterator ended, e.g. after its own micro-batch raised, which reaches us as "Caught X
        in DataLoader worker process N")."""
        deadline = time.monotonic() + wait
        while True:
            dead = [
                (i, w.pid)
                for i, w in enumerate(getattr(self._iter, "_workers", []))
                if not w.is_alive() and w.exitcode != 0
            ]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.02)

    def close(self) -> None:
        """Stop the worker processes now (a new ``next()`` restarts them at the current position)."""
        shutdown = getattr(self._iter, "_shutdown_workers", None)
        if shutdown is not None:
            if self._feed is not None:
                self._feed.stop_workers()  # a worker waiting for weights stops now
            shutdown()
        self._iter = self._watch = None

    # --- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The position (plain JSON data; [`LoaderState`][energon_platform.loader.state.LoaderState]).
        Refused (``RuntimeError`` naming ``EnergonHooks``) when Lightning's checkpointing asks for it
        and the module lacks that mixin: Lightning takes it one prefetched batch ahead."""
        _refuse_lightning_without_hooks(self)
        return LoaderState(
            version=STATE_VERSION,
            fingerprint={**self.plan.fingerprint, "datasets": self.plan.dataset_identities()},
            next_microbatch=self.next_microbatch,
            accumulation=self.accumulation,
            layout={
                "rank": self.rank,
                "world_size": self.world_size,
                "num_workers": self.num_workers,
                "micro_items": self.maker.micro_items,
            },
            datasets=self.plan.datasets.names,
            blend=self.plan.blend.to_json(),
            consumed=list(self.consumed().values()),
            plan=self.plan.batching.state_at(self.global_batch),
            exclude=[ex.to_json() for ex in self.plan.exclusions] or None,
            blend_adapt=None if self.adapter is None else self.adapter.state_dict(),
        ).to_dict()

    def state_at(self, next_microbatch: int) -> dict:
        """`state_dict` as it was (or will be) when micro-batch ``next_microbatch`` of this rank
        is next, without moving the loader: the state is a function of the position. For a trainer
        that fetched batches ahead of those it trained (a prefetch) and checkpoints the position it
        trained up to. ``next_microbatch`` must be at or after the position the loader was built or
        restored at (the blend and plans before it are not known); with ``loader.balance`` a later
        position plans every global batch up to it, so keep it near the current one."""
        now = self.next_microbatch
        self.next_microbatch = next_microbatch
        try:
            return self.state_dict()
        finally:
            self.next_microbatch = now

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue from a saved position. Raises
        [`StateMismatchError`][energon_platform.loader.train_loader.StateMismatchError] for other
        data or config, [`LayoutError`][energon_platform.loader.train_loader.LayoutError] for a
        layout that cannot continue the same global batches."""
        state = LoaderState.from_dict(state_dict)
        self.close()  # workers already started would produce the old position
        self.plan.resume(state)
        self.adapter = self._adapter(start=state.next_global_batch)
        if self.adapter is not None and state.blend_adapt is not None:
            self.adapter.load_state_dict(state.blend_adapt, state.next_global_batch)
        if self._feed is not None:  # its lines belong to the blend before the resume
            self._feed.close()
            self._feed = None
        self.maker = self._maker()
        self.next_microbatch = state.next_global_batch * self.accumulation + (
            state.next_microbatch % state.accumulation if state.mid_step else 0
        )


def _summed_over_ranks(group: Any):
    """A function that sums a list of floats over the ranks of ``group`` (``all_reduce`` in
    float64, on the GPU for NCCL), or None outside ``torch.distributed`` or on one rank."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return None

    def summed(values: list[float]) -> list[float]:
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend(group) == "nccl"
            else torch.device("cpu")
        )
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, group=group)
        return t.tolist()

    return summed


@contextlib.contextmanager
def _sigchld_ignored():
    """SIGCHLD at its default (discarded) inside the block, in the main thread. PyTorch installs a
    SIGCHLD handler the first time any DataLoader of the process starts workers outside
    `_without_sigchld_handler` (Energon's validation loader, a user's own loader); that
    handler raises "DataLoader worker ... is killed by signal" for every registered worker that
    dies, including one the loader kills on purpose (a stuck worker)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def _without_sigchld_handler(start):
    """Start DataLoader workers but keep the SIGCHLD handler that was there before. PyTorch's own
    handler raises "DataLoader worker ... is killed" at whatever line the main process is running
    (inside the model, the optimizer, a checkpoint write); without it a dead worker is found by
    the iterator itself within seconds, inside `TrainLoader.__next__`, which names the worker
    and the micro-batch ([`LoaderWorkerError`][energon_platform.loader.train_loader.LoaderWorkerError])."""
    if threading.current_thread() is not threading.main_thread():
        return start()
    previous = signal.getsignal(signal.SIGCHLD)
    try:
        return start()
    finally:
        signal.signal(signal.SIGCHLD, previous)


def _worker_init():
    """The DataLoader's ``worker_init_fn``: each worker keeps its freed memory for the next samples
    (`keep_freed_memory`), and workers forked by the main thread die with this process
    (`die_with_parent`), so a SIGKILLed trainer leaves none behind. Workers started from another
    thread keep PyTorch's own check of their parent (within seconds): the kernel's rule follows the
    forking thread, which may end before the workers."""
    parent = os.getpid() if threading.current_thread() is threading.main_thread() else None

    def init(worker_id: int) -> None:
        if parent is not None:
            die_with_parent(parent)
        keep_freed_memory()

    return init


class LoaderWorkerError(RuntimeError):
    """A DataLoader worker process died (e.g. killed for memory); names the worker and micro-batch."""


def check_layout(cfg: RunConfig, world_size: int) -> None:
    """Refuse, before anything runs, a world size that cannot reproduce the run's global batches."""
    Schedule.check_split(cfg.loader.global_batch_size, 1, world_size, cfg.loader.micro_batch_size)


def gradient_accumulation_steps(cfg: RunConfig, world_size: int = 1) -> int:
    """Micro-batches per global batch on each of ``world_size`` data-parallel ranks: the
    ``TrainLoader.accumulation`` that ``TrainLoader(cfg, world_size=world_size)`` will have, known
    before any loader (or trainer) exists, e.g. for ``Accelerator(gradient_accumulation_steps=...)``
    or ``Trainer(accumulate_grad_batches=...)``.
    [`LayoutError`][energon_platform.loader.train_loader.LayoutError] for a world size that cannot
    split the global batch."""
    per_rank = Schedule.check_split(
        cfg.loader.global_batch_size, 1, world_size, cfg.loader.micro_batch_size
    )
    return per_rank // (cfg.loader.micro_batch_size or per_rank)


def _refuse_lightning_without_hooks(loader: TrainLoader) -> None:
    """Lightning saves a stateful loader's ``state_dict()`` in its checkpoint after fetching one
    batch ahead: resumed from that record a run skips a batch. ``EnergonHooks`` replaces the record
    with the state at the batches trained (and sets ``loader.lightning_hooks``); without it, the
    call of Lightning's code (two frames up: the caller of ``state_dict``) is refused."""
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if caller.split(".")[0] in ("lightning", "pytorch_lightning") and not loader.lightning_hooks:
        raise RuntimeError(
            "Lightning is checkpointing a TrainLoader one prefetched batch ahead (a resume would skip "
            "a batch): mix energon_platform.integrations.lightning.EnergonHooks into the "
            "LightningModule, before it (class Model(EnergonHooks, L.LightningModule))"
        )


def _val_splits(path: str) -> list[str]:
    """The splits ``data.val_split`` may name for ``path``: a metadataset's ``splits`` keys, or
    the split parts of a dataset's ``.nv-meta/split.yaml`` that list at least one shard."""
    if is_metadataset(path):
        return list((yaml.safe_load(Path(path).read_text()) or {}).get("splits", {}))
    return split_parts(path)  # a folder or msc:// URL


def _warn_no_val_split(cfg: RunConfig, splits: list[str]) -> None:
    """One line on stderr: the run names a validation split its dataset lacks, so it validates
    nothing (logs no ``val_loss``)."""
    print(
        f"warning: data.val_split {cfg.data.val_split!r} is not a split of {cfg.data.path} "
        f"(it has: {', '.join(splits) or 'none'}); the run skips validation (set data.val_split "
        f"to one of them, or to null to skip it without this warning)",
        file=sys.stderr,
        flush=True,
    )


def build_val_loader(cfg: RunConfig, batch_size: int, rank: int = 0, world_size: int = 1):
    """Energon's own validation loader over ``data.val_split`` (no shuffling, no state), or None
    when ``data.val_split`` is null or the dataset has no such split (then rank 0 warns on stderr,
    naming the split, the dataset and the splits it has). A metadataset validates over its own
    ``val_split`` split (Energon concatenates its datasets, weights ignored), when it defines one.

    The loader reads in the caller's process (no workers) and leaves garbage collection to it:
    ``get_loader`` would wrap the dataset in Energon's ``GcDataset``, whose full ``gc.collect()``
    at the start of every pass scans the whole trainer's heap (about 0.2 s per evaluation on
    CPU, most of a small run's evaluation time)."""
    if not cfg.data.val_split:
        return None
    splits = _val_splits(str(cfg.data.path))
    if cfg.data.val_split not in splits:
        if rank == 0:
            _warn_no_val_split(cfg, splits)
        return None
    encoder = build_encoder(cfg, training=False)
    wc = encoder.worker_config(rank=rank, world_size=world_size, num_workers=0)
    ds = get_val_dataset(
        str(cfg.data.path),
        split_part=cfg.data.val_split,
        batch_size=batch_size,
        worker_config=wc,
        task_encoder=encoder,
        packing_buffer_size=encoder.packing_buffer_size,
    )
    loader = BasicDataLoader(ds, gc_collect_every_n_steps=0)
    # Energon always asks for it; without CUDA torch warns at each pass
    loader.pin_memory = torch.cuda.is_available()
    return loader


__all__ = ["TrainLoader", "build_val_loader", "build_encoder", "LayoutError", "StateMismatchError"]
