"""Train and validation loaders built from a run config.

:class:`TrainLoader` is an iterator of micro-batches with the ``Stateful`` protocol of
``torch.distributed.checkpoint`` (``state_dict``/``load_state_dict``). Its state is a
:class:`~energon_platform.loader.state.LoaderState` as a plain dict. Restoring costs the same as starting
(no replay), works with another number of workers, and with another data-parallel world size when
that world size divides the global batch.

``data.path`` is one Energon dataset or a metadataset (:mod:`~energon_platform.loader.datasets`).
The state records the blend's history (:mod:`~energon_platform.loader.blend_history`); its
fingerprint splits into what must match (encoder config, seed, global batch, pack group, shuffle
mode, blend unit, schedule version) and the identity of each saved dataset by name, which must be
the same data now; datasets may be added at resume, not removed.

Worker supervision: a worker that dies (killed for memory) stops the run with
:class:`LoaderWorkerError`; with ``loader.sample_timeout`` a worker on one sample for longer than the
limit is killed, the sample becomes a failed sample (its stand-in is used, as for a corrupt one) and
the workers restart at the loader's position (:meth:`TrainLoader._replace_stuck`). Micro-batches are
pure functions of their position, so the restart changes no other batch and the state no field.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import numbers
import sys
from pathlib import Path
from typing import Any

import torch

from energon_platform.config import RunConfig
from energon_platform.loader.batches import MicroBatchMaker, MicroBatchStream
from energon_platform.loader.blend import Blend
from energon_platform.loader.blend_history import plan_segments, resume_segments
from energon_platform.loader.datasets import open_datasets
from energon_platform.loader.exclusions import (
    Excluder,
    Exclusion,
    blend_steps,
    check_rules,
    planned,
    resumed,
)
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.permutation import derive_key
from energon_platform.loader.processes import die_with_parent
from energon_platform.loader.sample_watch import SampleWatch, Stuck
from energon_platform.loader.schedule import LayoutError, Schedule
from energon_platform.loader.state import (
    STATE_VERSION,
    LoaderState,
    StateMismatchError,
    check_fingerprint,
)
from storage import DatasetError

log = logging.getLogger(__name__)


def build_encoder(cfg: RunConfig, training: bool = True) -> Any:
    """The task encoder named by the config, seeded with the loader's seed."""
    from task_encoders.registry import get_encoder

    return get_encoder(cfg.encoder, seed=cfg.loader.seed, training=training)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


class TrainLoader:
    """Micro-batches of one data-parallel rank; infinite (epochs follow each other).

    Args:
        cfg: run config (``data``, ``encoder``, ``loader``).
        rank, world_size: this rank's data-parallel coordinates.
        num_workers: overrides ``cfg.loader.num_workers`` (may differ from the saved run).
    """

    def __init__(
        self, cfg: RunConfig, rank: int = 0, world_size: int = 1, num_workers: int | None = None
    ):
        lc = self.config = cfg.loader
        self._source = cfg.source
        self.rank, self.world_size = rank, world_size
        self.num_workers = lc.num_workers if num_workers is None else num_workers
        self.prefetch_factor = lc.prefetch_factor
        self.datasets = open_datasets(str(cfg.data.path), cfg.data.train_split)
        self.source = self.datasets.entries[
            0
        ].source  # the first (for one-dataset runs: the) dataset
        self.encoder = build_encoder(cfg)
        pack_group = _pack_group(lc.pack_group, self.encoder, cfg.source)
        self.pack_group = pack_group
        #: ``loader.balance`` set: global batches are planned (:mod:`~energon_platform.loader.planner`)
        self.planned = lc.balance.planned
        self.packed_rows = self.planned and pack_group > 1  # fixed rows of seq_len, packed globally
        per_rank = Schedule.check_split(
            lc.global_batch_size, pack_group, world_size, lc.micro_batch_size
        )
        self.micro_items = lc.micro_batch_size or per_rank
        if lc.blend_unit == "batch" and lc.micro_batch_size is None:
            from task_encoders.config import ConfigError

            raise ConfigError(
                cfg.source,
                "loader.micro_batch_size",
                "blend_unit: batch takes whole micro-batches "
                "from one dataset, so the micro-batch size must be fixed (set micro_batch_size)",
            )
        self.unit = self.micro_items * pack_group if lc.blend_unit == "batch" else 1
        self.planner = None
        if self.planned:
            _check_balance(cfg, self.encoder, self.packed_rows)
        self.length_indexes = self._length_indexes(cfg) if self.planned else None
        # unplanned, a global batch is consecutive positions: guard each dataset's epoch boundaries
        # against a sample at the end of one epoch and the start of the next in one batch (orders.py)
        self.orders = self._orders(0 if self.planned else lc.global_batch_size * pack_group)
        self.exclusions = planned(
            lc.exclude
        )  #: ``loader.exclude``'s history (:mod:`~energon_platform.loader.exclusions`)
        for warning in check_rules(lc.exclude, self.datasets) if lc.exclude else ():
            if rank == 0:
                log.warning("%s", warning)
        self._set_blend(
            plan_segments(
                self.datasets,
                blend_steps(self.datasets, lc.blend_schedule, self.exclusions),
                self._units_per_batch,
            )
        )
        self.fingerprint = {
            "encoder": {
                # an encoder class may record another class's name (a mode split into a subclass)
                "name": getattr(
                    type(self.encoder), "fingerprint_name", type(self.encoder).__name__
                ),
                "config_sha": _digest(_encoder_config(self.encoder)),
            },
            "seed": lc.seed,
            "global_batch_size": lc.global_batch_size,
            "pack_group": pack_group,
            "shuffle": self.orders[0].describe(),
            "blend_unit": lc.blend_unit,
            "blend_unit_samples": self.unit,
            "schedule": "feistel-chairman-v1",
        }
        if self.planned:  # what changes the rows and batches of a planned run
            self.fingerprint["balance"] = {
                "mode": lc.balance.mode,
                "window": lc.balance.window,
                "lookahead": lc.balance.lookahead,
                "global_batch_tokens": lc.balance.global_batch_tokens,
                "linear": self._linear,
                "planner": "pool-led-v2",
            }
        self.next_microbatch = 0
        self._identities = None
        self._tracer = None  #: for :meth:`exclusion_stats`, built at its first use
        self.blend_changes: list[
            str
        ] = []  #: what :meth:`load_state_dict` changed in the blend, with steps
        self._iter = None
        self._watch: SampleWatch | None = (
            None  #: with ``loader.sample_timeout``: the running workers' watch
        )
        #: ``(dataset, index)`` → ``(key, limit)``: samples a worker was replaced for (failed from then on)
        self.timed_out: dict[tuple[int, int], tuple[str, float]] = {}
        #: set by ``energon_platform.integrations.lightning.EnergonHooks``, which corrects the state
        #: Lightning's checkpoint takes; Lightning asking for the state without it is refused
        self.lightning_hooks = False

    def _orders(self, guard: int) -> tuple[DatasetOrder, ...]:
        """Each dataset's epochs, keyed by the seed and the entry's name (entries are independent)."""
        lc = self.config
        return tuple(
            DatasetOrder(
                len(e.source),
                derive_key(lc.seed, *_stream_id(e.name)),
                lc.shuffle_buffer,
                run=lc.shuffle_run,
                guard=guard,
            )
            for e in self.datasets.entries
        )

    @property
    def _units_per_batch(self) -> int:
        return self.config.global_batch_size * self.pack_group // self.unit

    @property
    def _linear(self) -> float:
        """The linear term's weight in ``balance: attention`` (default: the encoder's ``seq_len``)."""
        linear = self.config.balance.linear
        return float(linear if linear is not None else getattr(self.encoder, "seq_len", 0))

    def _length_indexes(self, cfg: RunConfig) -> list:
        """Each dataset's :class:`~energon_platform.loader.lengths.LengthIndex` (built if missing)."""
        from energon_platform.loader.lengths import open_length_index

        digest = _digest(_encoder_config(self.encoder))
        cache = Path(cfg.loader.length_cache) if cfg.loader.length_cache else None
        try:
            return [
                open_length_index(
                    e.source, self.encoder, digest, cache, workers=max(1, self.num_workers)
                )
                for e in self.datasets.entries
            ]
        except NotImplementedError as e:  # the encoder cannot state this config's lengths
            from task_encoders.config import ConfigError

            raise ConfigError(cfg.source, "loader.balance", str(e)) from None

    def _cost(self, work_length: int) -> float:
        """A sample's balance cost: a finite number >= 0, else :class:`ConfigError` naming where it came from."""
        from energon_platform.loader.packer import sample_cost

        if self.config.balance.mode == "encoder":
            cost = self.encoder.balance_cost(work_length)
            where = f"{type(self.encoder).__name__}.balance_cost({work_length})"
        else:
            cost = sample_cost(work_length, self.config.balance.mode, self._linear)
            where = f"balance {self.config.balance.mode!r} with balance.linear={self._linear!r}"
        if (
            isinstance(cost, bool)
            or not isinstance(cost, numbers.Real)
            or not math.isfinite(cost)
            or cost < 0
        ):
            from task_encoders.config import ConfigError

            raise ConfigError(
                self._source,
                "loader.balance",
                f"{where} returned {cost!r}; a cost must be a finite number >= 0",
            )
        return float(cost)

    def _set_blend(self, segments, plan_state=None) -> None:
        """(Re)build the schedule, planner and micro-batch maker for the blend ``segments``;
        a planned run continues from ``plan_state`` (None: where its planner is now, or the start)."""
        self.blend = Blend(segments, len(self.datasets.entries))
        if (
            not self.packed_rows and self.config.balance.global_batch_tokens is None
        ):  # a fixed number of samples per batch
            from energon_platform.loader.planner import check_distinct

            check_distinct(
                self.blend,
                [o.num_samples for o in self.orders],
                self.datasets.names,
                self._units_per_batch,
                self.unit,
            )
        group = 1 if self.planned else self.pack_group
        self.schedule = Schedule(
            self.orders, self.config.global_batch_size, group, self.blend, self.unit
        )
        if self.planned:
            from energon_platform.loader.lengths import SampleLengths
            from energon_platform.loader.planner import Planner, PlanState

            if plan_state is None:
                plan_state = self.planner.start if self.planner is not None else PlanState()
            prefixes = [self.datasets.key_prefix(d) for d in range(len(self.datasets.entries))]
            self.planner = Planner(
                SampleLengths(self.schedule, self.length_indexes, self.encoder, prefixes),
                self._cost,
                self.config.global_batch_size,
                capacity=self.encoder.seq_len if self.packed_rows else 0,
                budget=self.config.balance.global_batch_tokens,
                window=self.config.balance.window,
                fill=self.config.balance.lookahead,
                start=plan_state,
            )
        self.maker = MicroBatchMaker(
            self.datasets,
            self.encoder,
            self.schedule,
            self.rank,
            self.world_size,
            self.micro_items,
            planner=self.planner,
            exclusions=Excluder(self.exclusions, self.datasets) if self.exclusions else None,
        )

    def balance_stats(self, batch: int) -> dict:
        """Global batch ``batch`` of a planned run: per-rank cost max/mean, padding, samples and
        carried samples (for logs and the resume check); ``{}`` unplanned."""
        if not self.planned:
            return {}
        from energon_platform.loader.planner import deal_plan, rank_costs

        plan = self.planner.plan(batch)
        costs = rank_costs(
            plan,
            deal_plan(plan, self.world_size, self.accumulation, fixed=self.planner.fixed_counts),
        )
        mean = sum(costs) / len(costs)
        return {
            "rank_cost": round(max(costs) / mean, 4) if mean else 1.0,
            "padding": round(plan.padding, 4),
            "samples": sum(len(i) for i in plan.items),
            "carried": len(plan.next_state.carried),
        }

    def exclusion_stats(self, batch: int) -> dict:
        """``{"excluded": {dataset: n}}``: samples of global batch ``batch`` (all ranks) that
        ``loader.exclude`` replaced, computed as ``trace`` computes them (keys from Energon's
        index, no data read); ``{}`` when none (for the trainer's log row)."""
        if not self.exclusions or not any(ex.active(batch) for ex in self.exclusions):
            return {}
        if self._tracer is None:
            from energon_platform.loader.trace import Tracer

            self._tracer = Tracer(self)
        counts = self._tracer.excluded_counts(batch + 1)
        return {"excluded": counts} if counts else {}

    def dataset_identities(self) -> dict:
        """Per dataset name: what makes it *this* data (may not change at resume); read once."""
        if self._identities is None:
            self._identities = {e.name: e.source.identity() for e in self.datasets.entries}
        return self._identities

    def consumed(self) -> dict:
        """Per dataset name: ``{"samples", "epochs"}`` taken before the next global batch."""
        if self.planned:  # positions read before the batch, less those still waiting (carried)
            state = self.planner.state_at(self.global_batch)
            taken = self.blend.consumed(state.position).astype(int)
            for d in self.schedule.samples(list(state.carried))[0] if state.carried else ():
                taken[int(d)] -= 1
            return {
                n: {"samples": int(t), "epochs": round(int(t) / o.num_samples, 6)}
                for n, t, o in zip(self.datasets.names, taken, self.orders)
            }
        return dict(zip(self.datasets.names, self.schedule.consumed(self.global_batch)))

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
        stream = MicroBatchStream(self.maker, self.next_microbatch)
        kwargs = {}
        if workers > 0:
            kwargs = {
                "prefetch_factor": self.prefetch_factor,
                "multiprocessing_context": "fork",
                "worker_init_fn": _worker_init(),
            }
        if (
            self._watch is not None
        ):  # wake up to look at the workers while waiting for a micro-batch
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
        longer than the limit are replaced (:meth:`_replace_stuck`) and the wait goes on."""
        while True:
            try:
                return next(self._iter)
            except (
                RuntimeError
            ) as e:  # torch's words for its `timeout` (no worker died: that is checked first)
                if self._watch is None or not str(e).startswith("DataLoader timed out"):
                    raise
            stuck = self._watch.stuck(self.config.sample_timeout)
            if stuck:
                self._replace_stuck(stuck)

    def _replace_stuck(self, stuck: list[Stuck]) -> None:
        """Kill the workers in ``stuck``, make their samples failed samples (stand-ins from now on,
        in every epoch of this process) and restart the workers at the loader's position: every
        micro-batch not yet returned is made again, the same but for those samples' stand-ins."""
        import os
        import signal

        limit = self.config.sample_timeout
        for s in stuck:
            os.kill(self._iter._workers[s.worker].pid, signal.SIGKILL)
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
                self.datasets.entries[s.dataset].name,
                s.micro_batch,
                limit,
                self.next_microbatch,
            )
        self.close()
        self._iter = self._start()

    def _key_of(self, dataset: int, index: int) -> str:
        """The key of sample ``index`` of ``dataset`` from Energon's index, without reading the sample
        (its read may be what hangs); as in batches, a metadataset's keys carry the dataset name."""
        import sqlite3

        from energon_platform.loader.key_index import KeyIndex

        prefix = self.datasets.key_prefix(dataset)
        try:
            return prefix + KeyIndex(self.datasets.entries[dataset].source).keys([index])[0]
        except (DatasetError, sqlite3.Error, OSError):  # no usable index: the position names it
            return f"{prefix}#{index}"

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        if self._iter is None:
            self._iter = self._start()
        try:
            c, batch = self._next_from_workers()
        except (RuntimeError, ConnectionError, EOFError) as e:
            dead = self._dead_workers(wait=0 if isinstance(e, RuntimeError) else 1.0)
            workers = self.worker_processes
            if not (
                workers and (dead or "DataLoader worker (pid" in str(e))
            ):  # not "Caught X in ..."
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
                f"{self.next_microbatch} (global batch {self.global_batch}): {(str(e).splitlines() or [type(e).__name__])[0]}. "
                f"Out of memory? Lower loader.num_workers or prefetch_factor; resume from the latest "
                f"checkpoint and the data continues exactly"
            ) from None
        except (
            DatasetError
        ):  # bad data or a failed store: stop the other workers, so this error is the last line
            self.close()
            raise
        assert c == self.next_microbatch, (
            f"micro-batch {c} arrived where {self.next_microbatch} was due"
        )
        self.next_microbatch += 1
        if self.planned and self.next_microbatch % self.accumulation == 0:
            self.planner.plan(
                self.global_batch
            )  # keep this process's plans current (state_dict, stats): O(1) a step
        return batch

    def _dead_workers(self, wait: float) -> list[tuple[int, int]]:
        """``(worker id, pid)`` of the DataLoader workers that have exited; waits up to ``wait``
        seconds for one (a transfer cut by a kill can surface just before the exit is visible)."""
        import time

        deadline = time.monotonic() + wait
        while True:
            dead = [
                (i, w.pid)
                for i, w in enumerate(getattr(self._iter, "_workers", []))
                if not w.is_alive()
            ]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.02)

    def close(self) -> None:
        """Stop the worker processes now (a new ``next()`` restarts them at the current position)."""
        shutdown = getattr(self._iter, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._iter = self._watch = None

    # --- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The position (plain JSON data; :class:`~energon_platform.loader.state.LoaderState`).
        Refused (``RuntimeError`` naming ``EnergonHooks``) when Lightning's checkpointing asks for it
        and the module lacks that mixin: Lightning takes it one prefetched batch ahead."""
        _refuse_lightning_without_hooks(self)
        return LoaderState(
            version=STATE_VERSION,
            fingerprint={**self.fingerprint, "datasets": self.dataset_identities()},
            next_microbatch=self.next_microbatch,
            accumulation=self.accumulation,
            layout={
                "rank": self.rank,
                "world_size": self.world_size,
                "num_workers": self.num_workers,
                "micro_items": self.maker.micro_items,
            },
            datasets=self.datasets.names,
            blend=self.blend.to_json(),
            consumed=list(self.consumed().values()),
            plan=self.planner.state_at(self.global_batch).to_json() if self.planned else None,
            exclude=[ex.to_json() for ex in self.exclusions] or None,
        ).to_dict()

    def state_at(self, next_microbatch: int) -> dict:
        """:meth:`state_dict` as it was (or will be) when micro-batch ``next_microbatch`` of this rank
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
        """Continue from a saved position. Raises :class:`StateMismatchError` for other data or
        config, :class:`LayoutError` for a layout that cannot continue the same global batches."""
        state = LoaderState.from_dict(state_dict)
        current = self.dataset_identities()
        missing = [n for n in state.datasets if n not in current]
        if missing:
            raise StateMismatchError(
                f"the checkpoint's blend has dataset(s) {missing} that this run does not "
                f"(this run: {self.datasets.names}); datasets may be added at resume, not removed"
            )
        shuffle = state.fingerprint.get("shuffle")
        if isinstance(shuffle, dict) and "guard" not in shuffle and self.orders[0].guard:
            self.orders = self._orders(
                0
            )  # saved before epoch boundaries were guarded: continue as saved
            self.fingerprint["shuffle"] = self.orders[0].describe()
        saved = state.fingerprint
        balance = saved.get("balance")
        if isinstance(balance, dict) and balance.get("planner") == "pool-led-v1" and self.planned:
            # the previous planner could place a small dataset's sample twice in a global batch; its
            # saved position and carried samples mean the same to this one, which continues from them
            saved = {
                **saved,
                "balance": {**balance, "planner": self.fingerprint["balance"]["planner"]},
            }
            if self.rank == 0:
                log.warning(
                    "the checkpoint was planned by the previous planner (pool-led-v1); global batches "
                    "from here on are planned by %s, which never repeats a sample in one",
                    self.fingerprint["balance"]["planner"],
                )
        # every saved dataset must be the same data; datasets added since are not compared
        try:
            check_fingerprint(
                saved, {**self.fingerprint, "datasets": {n: current[n] for n in state.datasets}}
            )
        except (
            StateMismatchError
        ) as e:  # a dataset added with an existing entry's folder name: say so
            raise StateMismatchError(f"{e}{self.datasets.clash_note(state.datasets)}") from None
        if state.mid_step and (
            state.accumulation != self.accumulation
            or state.layout.get("world_size") != self.world_size
        ):
            raise LayoutError(
                "the state was saved in the middle of a global batch (gradient accumulation); "
                "resume it with the same world size and micro-batch size, or save at a step boundary"
            )
        self.close()  # workers already started would produce the old position
        plan_state = None
        if self.planned:
            from energon_platform.loader.planner import PlanState

            if state.plan is None or state.plan["batch"] != state.next_global_batch:
                raise StateMismatchError(
                    "the checkpoint's loader state has no plan for global batch "
                    f"{state.next_global_batch} (saved without loader.balance?)"
                )
            plan_state = PlanState.from_json(state.plan)
        self.exclusions, excluded = resumed(
            [Exclusion.from_json(r) for r in state.exclude or ()],
            self.config.exclude,
            state.next_global_batch,
        )
        segments, changes = resume_segments(
            state,
            self.datasets,
            blend_steps(self.datasets, self.config.blend_schedule, self.exclusions),
            state.next_global_batch,
            self._units_per_batch,
            resume_unit=plan_state.position if plan_state else None,
        )
        for change in changes if self.rank == 0 else ():  # once per job, not once per rank
            log.warning("blend changed at resume: %s", change)
        for change in excluded if self.rank == 0 else ():
            log.warning("loader.exclude changed at resume: %s", change)
        self.blend_changes = changes + excluded
        self._set_blend(segments, plan_state)
        self.next_microbatch = state.next_global_batch * self.accumulation + (
            state.next_microbatch % state.accumulation if state.mid_step else 0
        )


def _without_sigchld_handler(start):
    """Start DataLoader workers but keep the SIGCHLD handler that was there before. PyTorch's own
    handler raises "DataLoader worker ... is killed" at whatever line the main process is running
    (inside the model, the optimizer, a checkpoint write); without it a dead worker is found by
    the iterator itself within seconds, inside :meth:`TrainLoader.__next__`, which names the worker
    and the micro-batch (:class:`LoaderWorkerError`)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return start()
    previous = signal.getsignal(signal.SIGCHLD)
    try:
        return start()
    finally:
        signal.signal(signal.SIGCHLD, previous)


def _worker_init():
    """The DataLoader's ``worker_init_fn``: workers forked by the main thread die with this process
    (:func:`~energon_platform.loader.processes.die_with_parent`), so a SIGKILLed trainer leaves none
    behind. Workers started from another thread keep PyTorch's own check of their parent (within
    seconds): the kernel's rule follows the forking thread, which may end before the workers."""
    import os
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()
    return lambda worker_id: die_with_parent(parent)


class LoaderWorkerError(RuntimeError):
    """A DataLoader worker process died (e.g. killed for memory); names the worker and micro-batch."""


def check_layout(cfg: RunConfig, world_size: int) -> None:
    """Refuse, before anything runs, a world size that cannot reproduce the run's global batches."""
    Schedule.check_split(cfg.loader.global_batch_size, 1, world_size, cfg.loader.micro_batch_size)


def gradient_accumulation_steps(cfg: RunConfig, world_size: int = 1) -> int:
    """Micro-batches per global batch on each of ``world_size`` data-parallel ranks: the
    ``TrainLoader.accumulation`` that ``TrainLoader(cfg, world_size=world_size)`` will have, known
    before any loader (or trainer) exists, e.g. for ``Accelerator(gradient_accumulation_steps=...)``
    or ``Trainer(accumulate_grad_batches=...)``. :class:`LayoutError` for a world size that cannot
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


def _stream_id(name: str) -> tuple[int, int]:
    """Two 64-bit integers from a dataset name: the key of its sample order (independent per entry)."""
    h = hashlib.blake2b(name.encode(), digest_size=16).digest()
    return int.from_bytes(h[:8], "little"), int.from_bytes(h[8:], "little")


def _check_balance(cfg: RunConfig, encoder: Any, packed: bool) -> None:
    """``loader.balance`` needs an encoder that states its lengths (and, for ``encoder``, its cost);
    ``global_batch_tokens`` is a budget of unpacked samples (packed rows are a fixed size already)."""
    from task_encoders.config import ConfigError

    if packed and cfg.loader.balance.global_batch_tokens is not None:
        raise ConfigError(
            cfg.source,
            "loader.balance.global_batch_tokens",
            f"{cfg.loader.balance.global_batch_tokens} with a packing "
            f"encoder, whose global batches are global_batch_size rows of seq_len={encoder.seq_len} "
            "already (null, or an encoder without packing)",
        )

    if not callable(getattr(encoder, "sample_facts", None)):
        raise ConfigError(
            cfg.source,
            "loader.balance",
            f"{cfg.loader.balance.mode!r} needs lengths before decoding, but "
            f"{type(encoder).__name__} has no sample_facts/sample_length (see docs: balance)",
        )
    if cfg.loader.balance.mode == "encoder" and not callable(
        getattr(encoder, "balance_cost", None)
    ):
        raise ConfigError(
            cfg.source,
            "loader.balance",
            f"'encoder' calls the encoder's balance_cost(length), "
            f"which {type(encoder).__name__} does not define",
        )


def _pack_group(configured: int | None, encoder: Any, source: str) -> int:
    """Samples per pack group; checks that loader and encoder agree on whether to pack."""
    from task_encoders.config import ConfigError

    packs = getattr(encoder, "packing_buffer_size", None)
    if configured is None:
        return packs or 1
    if configured > 1 and not packs:
        raise ConfigError(
            source,
            "loader.pack_group",
            f"{configured} asks for packing, but the encoder's "
            "packing.enabled is false (set it, or pack_group: 1)",
        )
    if configured == 1 and packs:
        raise ConfigError(
            source,
            "loader.pack_group",
            "1 disables packing, but the encoder's packing.enabled is "
            "true (use pack_group >= 2 or null)",
        )
    return configured


def _encoder_config(encoder: Any) -> Any:
    from task_encoders.config import to_plain

    config = to_plain(getattr(encoder, "config", {}))
    if isinstance(config, dict):
        config.pop("seed", None)  # the loader's seed is fingerprinted on its own
        config.pop("errors", None)  # skip limits do not change the data
    return config


def build_val_loader(cfg: RunConfig, batch_size: int, rank: int = 0, world_size: int = 1):
    """Energon's own validation loader over ``data.val_split`` (no shuffling, no state), or None
    when the dataset has no such split. A metadataset validates over its own ``val_split`` split
    (Energon concatenates its datasets, weights ignored), when it defines one."""
    import yaml
    from megatron.energon import get_loader, get_val_dataset

    from energon_platform.loader.datasets import is_metadataset
    from storage import dataset_root

    if not cfg.data.val_split:
        return None
    if is_metadataset(str(cfg.data.path)):
        splits = (yaml.safe_load(Path(cfg.data.path).read_text()) or {}).get("splits", {})
        if cfg.data.val_split not in splits:
            return None
    else:
        split = (
            dataset_root(str(cfg.data.path)) / ".nv-meta" / "split.yaml"
        )  # a folder or msc:// URL
        if not yaml.safe_load(split.read_text())["split_parts"].get(cfg.data.val_split):
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
    loader = get_loader(ds)
    loader.pin_memory = (
        torch.cuda.is_available()
    )  # Energon always asks for it; without CUDA torch warns at each pass
    return loader


__all__ = ["TrainLoader", "build_val_loader", "build_encoder", "LayoutError", "StateMismatchError"]
