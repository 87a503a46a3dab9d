"""The train loader built from a run config.

[`TrainLoader`][energon_platform.loader.train_loader.TrainLoader] is an iterator of micro-batches
with the ``Stateful`` protocol of ``torch.distributed.checkpoint``
(``state_dict``/``load_state_dict``). Its state is a
[`LoaderState`][energon_platform.loader.state.LoaderState] as a plain dict. Restoring costs the same
as starting (no replay), works with another number of workers (or another executor), and with
another data-parallel world size when that world size divides the global batch.

``data.path`` is one Energon dataset or a metadataset (`datasets`).
The state records the blend's history (`blend_history`); its
fingerprint splits into what must match (encoder config, seed, global batch, pack group, shuffle
mode, blend unit, schedule version) and the identity of each saved dataset by name, which must be
the same data now; datasets may be added at resume, not removed.

Who makes the micro-batches is an [executor][energon_platform.loader.executors.base.Executor]:
this process (``num_workers: 0``), forked worker processes, or a pool of Ray actors
(``loader.executor: ray``). A worker that dies (killed for memory) stops the run with
[`LoaderWorkerError`][energon_platform.loader.train_loader.LoaderWorkerError]; with
``loader.sample_timeout`` a worker on one sample for longer than the limit is killed, the sample
becomes a failed sample (its stand-in is used, as for a corrupt one) and the workers restart at the
loader's position (`supervision`). Micro-batches are pure functions of their position, so the
restart changes no other batch and the state no field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from energon_platform.config import RunConfig
from energon_platform.loader import executors, on_start
from energon_platform.loader.batches import MicroBatchMaker
from energon_platform.loader.executors.base import Executor, WorkerLost
from energon_platform.loader.layout import check_layout, gradient_accumulation_steps
from energon_platform.loader.mixing import BlendAdapter
from energon_platform.loader.mixing.run_mixer import dataset_of, run_adapter, summed_over_ranks
from energon_platform.loader.run_plan import RunPlan, build_encoder
from energon_platform.loader.schedule import LayoutError
from energon_platform.loader.state import STATE_VERSION, LoaderState, StateMismatchError
from energon_platform.loader.supervision import record_timeouts, worker_died
from energon_platform.loader.trace import Tracer
from energon_platform.loader.val_loader import build_val_loader
from storage.outputs import hold_readers


class LoaderWorkerError(RuntimeError):
    """A loader worker died (e.g. killed for memory); names the worker and micro-batch."""


class TrainLoader:
    """Micro-batches of one data-parallel rank; infinite (epochs follow each other).

    The global batches are those of its `RunPlan`
    (`plan`); the loader adds the executor that makes them (`executor`), iteration and the
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
        self.run_config = cfg
        self.rank, self.world_size = rank, world_size
        self.num_workers = lc.num_workers if num_workers is None else num_workers
        self.prefetch_factor = lc.prefetch_factor
        self.encoder = build_encoder(cfg)
        #: the run's pure plan: datasets, orders, blend, schedule, batching mode, fingerprint
        self.plan = RunPlan(cfg, self.encoder, world_size, self.num_workers, rank)
        #: shared locks on the datasets read, for this loader's life: ``convert --overwrite``
        #: refuses to replace a dataset a live run reads (`storage.outputs.hold_readers`)
        self._reading = hold_readers(e.source.path for e in self.plan.datasets.entries)
        self.next_microbatch = 0
        #: ``loader.blend_adapt``: the run's mixer (None: fixed weights)
        self.adapter: BlendAdapter | None = run_adapter(self.plan, lc.blend_adapt, cfg.data.path, 0)
        self._tracer = None  #: for `exclusion_stats`, built at its first use
        #: ``(dataset, index)`` → ``(key, limit)``: samples a worker was replaced for (failed from then on)
        self.timed_out: dict[tuple[int, int], tuple[str, float]] = {}
        #: set by ``energon_platform.integrations.lightning.EnergonHooks``, which corrects the state
        #: Lightning's checkpoint takes; Lightning asking for the state without it is refused
        self.lightning_hooks = False
        self._build()

    def _build(self) -> None:
        """The maker over the plan's current schedule, and the executor that runs it (not started)."""
        plan = self.plan
        self.maker = MicroBatchMaker(
            plan.datasets,
            self.encoder,
            plan.schedule,
            self.rank,
            self.world_size,
            plan.micro_items,
            planner=plan.planner,
            exclusions=plan.excluder,
        )
        #: who makes the micro-batches (`executors.build`); started at the first `next`
        self.executor: Executor = executors.build(self.config, self, self.num_workers)
        self.executor.on_timeout = lambda stuck: record_timeouts(self, stuck)
        self._started = False
        if self.adapter is not None:
            self.executor.publish(self.adapter.decided_before(), None)

    # --- online mixing (loader.blend_adapt) ----------------------------------------------------

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
        datasets = [dataset_of(self.plan.datasets, k) for k in keys]
        segment = self.adapter.report(step, datasets, losses, summed_over_ranks(group))
        if self.adapter.decided_before() == before:
            return
        if segment is not None and segment.weights == self.plan.blend.segments[-1].weights:
            segment = None
        if segment is not None:
            self.plan.extend_blend([segment])
            self.maker.schedule = self.plan.schedule
        self.executor.publish(self.adapter.decided_before(), segment)

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
        """Local worker processes this loader runs: ``num_workers``, but at least one with
        ``loader.sample_timeout`` (a sample stuck in the training process itself could not be stopped)."""
        return max(self.num_workers, 1 if self.config.sample_timeout else 0)

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        if self.adapter is not None and self.next_microbatch % self.accumulation == 0:
            self.adapter.check_batch(self.global_batch)
        if not self._started:
            on_start.run()
            self.executor.start(self.next_microbatch, self.timed_out)
            self._started = True
        try:
            c, batch = self.executor.next()
        except WorkerLost as lost:
            self.close()
            raise LoaderWorkerError(worker_died(self, lost)) from None
        except Exception:  # bad data, a failed store, a bug: no worker goes on after it
            self.close()
            raise
        assert c == self.next_microbatch, (
            f"micro-batch {c} arrived where {self.next_microbatch} was due"
        )
        self.next_microbatch += 1
        if self.next_microbatch % self.accumulation == 0:
            self.plan.batching.step_done(self.global_batch)
        return batch

    def close(self) -> None:
        """Stop the workers now (a new ``next()`` restarts them at the current position)."""
        self.executor.close()
        self._started = False

    # --- Stateful ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The position (plain JSON data; [`LoaderState`][energon_platform.loader.state.LoaderState]).
        Lightning takes it one prefetched batch ahead: with Lightning, mix
        ``energon_platform.integrations.lightning.EnergonHooks`` into the module (without it,
        that integration refuses Lightning's checkpoint)."""
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
        adapt = self.config.blend_adapt
        self.adapter = run_adapter(
            self.plan, adapt, self.run_config.data.path, state.next_global_batch
        )
        if self.adapter is not None and state.blend_adapt is not None:
            self.adapter.load_state_dict(state.blend_adapt, state.next_global_batch)
        self._build()  # a maker over the resumed schedule, and its executor
        self.next_microbatch = state.next_global_batch * self.accumulation + (
            state.next_microbatch % state.accumulation if state.mid_step else 0
        )


__all__ = [
    "LoaderWorkerError",
    "TrainLoader",
    "build_encoder",
    "build_val_loader",
    "check_layout",
    "gradient_accumulation_steps",
    "LayoutError",
    "StateMismatchError",
]
