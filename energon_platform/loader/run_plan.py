"""The pure plan of a training run's data: which samples every global batch holds.

A `RunPlan` is built from the run config, the task encoder (only what planning asks of it:
its pack group, ``seq_len``, sample lengths for the length index, its config digest) and the
data-parallel world size. It holds the datasets, each dataset's order
(`orders`), the blend and its history segments
(`blend_history`), the ``loader.exclude`` history
(`exclusions`), the schedule (`schedule`),
the batching mode (`batching`) and the fingerprint, which it
assembles from its components' parts. No DataLoader, no workers, no sample is read.

[`TrainLoader`][energon_platform.loader.train_loader.TrainLoader] adds the workers, their supervision,
iteration and the ``Stateful`` protocol; `Tracer` answers
provenance questions from the plan alone. Both continue a saved
[`LoaderState`][energon_platform.loader.state.LoaderState] with `RunPlan.resume`.
"""

from __future__ import annotations

import hashlib
import logging
from fractions import Fraction
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from energon_platform.config_checks import check_with_encoder, pack_group
from energon_platform.loader.balance.planner import check_distinct
from energon_platform.loader.batching import Batching, PlannedBatching, batching_for
from energon_platform.loader.blend import Blend, Segment
from energon_platform.loader.blend_history import plan_segments, resume_segments
from energon_platform.loader.context_parallel import apply_context_parallel
from energon_platform.loader.datasets import open_datasets
from energon_platform.loader.exclusions import (
    Excluder,
    Exclusion,
    blend_steps,
    check_rules,
    planned,
    resumed,
)
from energon_platform.loader.fingerprint import encoder_part
from energon_platform.loader.orders import DatasetOrder
from energon_platform.loader.permutation import derive_key
from energon_platform.loader.schedule import SCHEDULE_VERSION, LayoutError, Schedule
from energon_platform.loader.state import LoaderState, StateMismatchError, check_fingerprint
from task_encoders.registry import get_encoder

if TYPE_CHECKING:
    from energon_platform.config import RunConfig
    from task_encoders.base import SeededTaskEncoder


log = logging.getLogger(__name__)


def build_encoder(cfg: RunConfig, training: bool = True) -> Any:
    """The task encoder named by the config, seeded with the loader's seed, checked against the
    loader config (`check_with_encoder`: one-line `ConfigError`), its segments padded for
    ``loader.context_parallel`` (`apply_context_parallel`)."""
    encoder = get_encoder(cfg.encoder, seed=cfg.loader.seed, training=training)
    check_with_encoder(cfg, encoder)
    apply_context_parallel(cfg, encoder)
    return encoder


class RunPlan:
    """The global batches of run config ``cfg`` on ``world_size`` data-parallel ranks.

    Args:
        cfg: run config (``data``, ``encoder``, ``loader``).
        encoder: the run's task encoder ([`build_encoder`][energon_platform.loader.run_plan.build_encoder]).
        world_size: data-parallel ranks (the global batch must split over them).
        workers: processes that build a missing length index (planned runs).
        rank: warnings about the config are logged by rank 0 only (once per job).
    """

    def __init__(
        self,
        cfg: RunConfig,
        encoder: SeededTaskEncoder,
        world_size: int = 1,
        workers: int = 0,
        rank: int = 0,
    ):
        lc = self.config = cfg.loader
        self.source, self.encoder = cfg.source, encoder
        self.world_size, self.rank = world_size, rank
        self.datasets = open_datasets(str(cfg.data.path), cfg.data.train_split)
        self.pack_group = pack_group(lc.pack_group, encoder)
        per_rank = Schedule.check_split(
            lc.global_batch_size, self.pack_group, world_size, lc.micro_batch_size
        )
        self.micro_items = lc.micro_batch_size or per_rank
        #: micro-batches per global batch on each rank (gradient-accumulation steps)
        self.accumulation = per_rank // self.micro_items
        self.unit = self._blend_unit_samples(cfg)
        self.batching: Batching = batching_for(
            cfg, encoder, self.pack_group, self.datasets, workers
        )
        self.orders = self._orders(self.batching.epoch_guard)
        #: ``loader.exclude``'s history (`exclusions`)
        self.exclusions = planned(lc.exclude)
        for warning in check_rules(lc.exclude, self.datasets, rank == 0) if lc.exclude else ():
            log.warning("%s", warning)
        #: what `resume` changed in the blend and the exclusions, with steps
        self.blend_changes: list[str] = []
        self._identities: dict | None = None
        self._set_blend(
            plan_segments(
                self.datasets,
                blend_steps(self.datasets, lc.blend_schedule, self.exclusions),
                self.units_per_batch,
            )
        )
        self.fingerprint = self._fingerprint()

    def _blend_unit_samples(self, cfg: RunConfig) -> int:
        """Samples per blend unit: 1, or a micro-batch's with ``blend_unit: batch`` (whose fixed
        ``micro_batch_size`` `check_with_encoder` has checked)."""
        if cfg.loader.blend_unit != "batch":
            return 1
        return self.micro_items * self.pack_group

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

    def _fingerprint(self) -> dict:
        """What must match at resume, from each component's part (key order as saved)."""
        lc = self.config
        return {
            "encoder": encoder_part(self.encoder),
            "seed": lc.seed,
            "global_batch_size": lc.global_batch_size,
            "pack_group": self.pack_group,
            "shuffle": self.orders[0].describe(),
            "blend_unit": lc.blend_unit,
            "blend_unit_samples": self.unit,
            "schedule": SCHEDULE_VERSION,
            **self.batching.fingerprint(),
            **({"context_parallel": lc.context_parallel} if lc.context_parallel > 1 else {}),
        }

    @property
    def units_per_batch(self) -> int:
        """Blend units per global batch."""
        return self.config.global_batch_size * self.pack_group // self.unit

    @property
    def planner(self) -> Any:
        """The batching mode's planner (None unplanned)."""
        return self.batching.planner

    def _set_blend(self, segments: list, plan_state: Any = None) -> None:
        """(Re)build the blend, the schedule and the batching mode's planner for the blend
        ``segments``; a planned run continues from ``plan_state`` (None: where its planner is
        now, or the start)."""
        self._schedule_over(Blend(segments, len(self.datasets.entries)), plan_state)
        self.excluder = Excluder(self.exclusions, self.datasets) if self.exclusions else None

    def unit_at(self, batch: int) -> int:
        """The blend unit where global batch ``batch`` starts reading the stream:
        ``batch x units_per_batch``, or in a planned run the stream position its planning starts
        at (the planner's pool reads ahead of its batches by a varying amount, so plans up to
        ``batch - 1`` are made; ``batch`` at or after the planner's start). A segment starting
        here changes no global batch before ``batch`` (`mixing`: a weight decided at step ``s``
        applies from batch ``s + 1 + lag``)."""
        if self.planner is None:
            return batch * self.units_per_batch
        return self.planner.state_at(batch).position

    def weights_from(self, batch: int) -> int:
        """The unit where weights that apply from global batch ``batch`` start (the mixer's new
        segments): `unit_at`, or one unit after the blend's last segment starts when a planned
        run read nothing since (its pool can plan batches from the samples it holds), so
        segments start at increasing units."""
        return max(self.unit_at(batch), self.blend.segments[-1].start + 1)

    def extend_blend(self, segments: list) -> None:
        """Append ``segments`` (starting after the blend's last, at increasing units) to the blend
        (`mixing`: weights decided during training) and rebuild the schedule over it: every
        global batch that reads only units before the first new segment stays as it was. A
        planned run's planner (the same object) keeps its plans of those batches
        (`Planner.extend`) and plans the later ones again."""
        self._schedule_over(self.blend.extended(segments), new=segments)

    def _schedule_over(self, blend: Blend, plan_state: Any = None, new: list | None = None) -> None:
        """``blend`` becomes the run's, with its schedule; with a fixed number of samples per
        batch, a blend whose segments (``new``: only those, the others were checked) would place
        a sample twice in one global batch is refused first (`check_distinct`)."""
        if self.batching.fixed_samples:
            check_distinct(
                blend if new is None else SimpleNamespace(segments=new),
                [o.num_samples for o in self.orders],
                self.datasets.names,
                self.units_per_batch,
                self.unit,
            )
        self.blend = blend
        self.schedule = Schedule(
            self.orders,
            self.config.global_batch_size,
            self.batching.schedule_group,
            self.blend,
            self.unit,
        )
        if new and isinstance(self.batching, PlannedBatching):
            self.batching.extend(self.schedule, new[0].start)
        else:
            self.batching.start(self.schedule, plan_state)

    def blend_weights(self, batch: int) -> dict[str, float]:
        """The blend's weights in force at global batch ``batch``: dataset name → share (of
        the samples it reads: `unit_at`; a planned run's batches before its planner's start, as
        read at ``batch x units_per_batch``)."""
        planned = self.planner is not None and batch >= self.planner.start.batch
        unit = self.unit_at(batch) if planned else batch * self.units_per_batch
        weights = [s for s in self.blend.segments if s.start <= unit][-1].weights
        total = sum(Fraction(w) for w in weights)
        return {n: float(Fraction(w) / total) for n, w in zip(self.datasets.names, weights)}

    def dataset_identities(self) -> dict:
        """Per dataset name: what makes it *this* data (may not change at resume); read once."""
        if self._identities is None:
            self._identities = {e.name: e.source.identity() for e in self.datasets.entries}
        return self._identities

    def consumed(self, batch: int) -> dict:
        """Per dataset name: ``{"samples", "epochs"}`` taken before global batch ``batch``."""
        return self.batching.consumed(batch, self.schedule, self.datasets.names)

    # --- resume -----------------------------------------------------------------------------

    def resume(self, state: LoaderState, announce: bool = True) -> None:
        """Continue from ``state``: its orders, exclusion and blend history and (planned) its plan
        state (``measured``: its cost history). `StateMismatchError` for other data or
        config, `LayoutError` for a state saved in the middle of a global batch that this
        layout cannot continue. Changes (blend, exclusions, cost model) are kept in
        `blend_changes`, and logged by rank 0 as changes at resume unless ``announce`` is False
        (a trace reads a checkpoint without resuming the run)."""
        self._check_datasets(state)
        self._continue_orders(state)
        self._check_fingerprint(state)
        if state.mid_step and (
            state.accumulation != self.accumulation
            or state.layout.get("world_size") != self.world_size
        ):
            raise LayoutError(
                "the state was saved in the middle of a global batch (gradient accumulation); "
                "resume it with the same world size and micro-batch size, or save at a step boundary"
            )
        plan_state = self.batching.resume_from(state)
        self.exclusions, excluded = resumed(
            [Exclusion.from_json(r) for r in state.exclude or ()],
            self.config.exclude,
            state.next_global_batch,
        )
        if self.config.blend_adapt is not None and state.blend_adapt is not None:
            segments, changes = self._adapted_segments(state), []
        else:
            segments, changes = resume_segments(
                state,
                self.datasets,
                blend_steps(self.datasets, self.config.blend_schedule, self.exclusions),
                state.next_global_batch,
                self.units_per_batch,
                resume_unit=self.batching.resume_unit(plan_state),
            )
        speak = self.rank == 0 and announce  # once per job, not once per rank
        for change in changes if speak else ():
            log.warning("blend changed at resume: %s", change)
        for change in excluded if speak else ():
            log.warning("loader.exclude changed at resume: %s", change)
        for change in self.batching.changes if speak else ():
            log.warning("cost model changed at resume: %s", change)
        self.blend_changes = changes + excluded + list(self.batching.changes)
        self._set_blend(segments, plan_state)

    def _adapted_segments(self, state: LoaderState) -> list[Segment]:
        """The saved blend of a run whose weights the mixer sets (``loader.blend_adapt``) and
        goes on setting: every saved segment, those decided for batches after the resume too."""
        if state.datasets != self.datasets.names:
            raise StateMismatchError(
                f"loader.blend_adapt: the saved run blends {state.datasets}, this config "
                f"{self.datasets.names}; a mixer continues over the same datasets only (set "
                f"loader.blend_adapt to null to change the blend at resume)"
            )
        return [Segment(s["start"], tuple(s["weights"])) for s in state.blend]

    def _check_datasets(self, state: LoaderState) -> None:
        """Datasets may be added at resume, not removed."""
        current = self.dataset_identities()
        missing = [n for n in state.datasets if n not in current]
        if missing:
            raise StateMismatchError(
                f"the checkpoint's blend has dataset(s) {missing} that this run does not "
                f"(this run: {self.datasets.names}); datasets may be added at resume, not removed"
            )

    def _continue_orders(self, state: LoaderState) -> None:
        """A state saved before epoch boundaries were guarded continues unguarded, as saved."""
        shuffle = state.fingerprint.get("shuffle")
        if isinstance(shuffle, dict) and "guard" not in shuffle and self.orders[0].guard:
            self.orders = self._orders(0)
            self.fingerprint["shuffle"] = self.orders[0].describe()

    def _check_fingerprint(self, state: LoaderState) -> None:
        """Every saved dataset must be the same data (datasets added since are not compared), and
        the rest of the fingerprint the same."""
        current = self.dataset_identities()
        try:
            check_fingerprint(
                state.fingerprint,
                {**self.fingerprint, "datasets": {n: current[n] for n in state.datasets}},
            )
        except StateMismatchError as e:  # a dataset added with an existing entry's folder name
            raise StateMismatchError(f"{e}{self.datasets.clash_note(state.datasets)}") from None


def _stream_id(name: str) -> tuple[int, int]:
    """Two 64-bit integers from a dataset name: the key of its sample order (independent per entry)."""
    h = hashlib.blake2b(name.encode(), digest_size=16).digest()
    return int.from_bytes(h[:8], "little"), int.from_bytes(h[8:], "little")
