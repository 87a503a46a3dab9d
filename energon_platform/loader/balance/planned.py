"""``loader.balance: tokens | attention | encoder | measured``: global batches planned from sample
lengths and costs.

The `Planner` plans each global batch from a pool of
upcoming positions (lengths from the length index, `lengths`):
``global_batch_size`` packed rows of ``seq_len`` with a packing encoder, else that many samples (or
a ``global_batch_tokens`` budget) whose costs (`costs`) are
dealt evenly to the ranks (``measured``: a calibrated cost model's predicted time of each sample's
cost features, `cost_file`). Its state at a batch (next position, carried samples) is the
``LoaderState.plan``; the fingerprint's ``balance`` entry names what changes the plans.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from energon_platform.loader.balance.cost_file import CostModel, load_cost_model
from energon_platform.loader.balance.cost_history import CostEntry, CostHistory
from energon_platform.loader.balance.costs import COST_MODELS, SampleCost, feature_work
from energon_platform.loader.balance.dealing import (
    deal_plan,
    outlier_anchored,
    plan_bound,
    rank_costs,
)
from energon_platform.loader.balance.index_command import index_command
from energon_platform.loader.balance.length_store import (
    IndexedEncoder,
    LengthIndexMissing,
    open_index,
)
from energon_platform.loader.balance.lengths import SampleLengths
from energon_platform.loader.balance.planner import (
    PLANNER_VERSION,
    Planner,
)
from energon_platform.loader.balance.plans import PlanState
from energon_platform.loader.fingerprint import encoder_digest
from energon_platform.loader.state import StateMismatchError
from task_encoders.abilities import StatesFeatures, StatesLengths, missing
from task_encoders.config_parser import ConfigError
from task_encoders.features import FEATURES

if TYPE_CHECKING:
    from energon_platform.config import RunConfig
    from energon_platform.loader.datasets import DatasetSet
    from energon_platform.loader.schedule import Schedule
    from task_encoders.base import SeededTaskEncoder


log = logging.getLogger(__name__)

#: ``balance.samples`` in the fingerprint of plans whose global batches take samples of like row
#: length (`PlannedBatching.like_lengths`) and, with a cost model of the micro-batch as it runs,
#: of the oldest one's towers (`Planner._same_towers`); absent where they take samples of like cost
LIKE_LENGTHS = "like-length-same-towers"


def plans_like_lengths(mode: str, fixed_samples: bool) -> bool:
    """Whether a plan takes samples of like row length into a global batch rather than samples of
    like cost (`Planner.like_lengths`): a cost function that asks for it (`CostFunction.like_lengths`:
    ``measured``) with a fixed number of samples per global batch, since a micro-batch is padded to
    its longest sample, which no per-sample predicted time sees."""
    return COST_MODELS[mode].like_lengths and fixed_samples


@dataclass
class PlannedBatching:
    """Planned global batches (see the module docstring). Built by `from_config`; the
    planner by `start`, for each schedule (at the start and at resume)."""

    mode: str  #: the cost model (``loader.balance``)
    window: int  #: ``loader.balance.window``
    lookahead: float  #: ``loader.balance.lookahead``
    budget: float | None  #: ``loader.balance.global_batch_tokens``
    linear: float  #: the attention cost's linear weight
    global_batch_size: int  #: rows (packed) or samples per global batch
    packed_rows: bool  #: fixed rows of ``seq_len``, packed across the global batch
    encoder: StatesLengths
    cost: SampleCost
    length_indexes: list  #: per dataset, its length index
    prefixes: list[str]  #: per dataset, the prefix of its keys
    #: ``measured``: the cost models by global batch (the config's from the start, or the resume)
    history: CostHistory | None = None
    #: ``loader.blend_adapt.lag`` (0 without): the mixer has batches planned this far ahead of
    #: training (`RunPlan.unit_at`), and the planner keeps that many plans more
    ahead: int = 0
    planner: Planner | None = field(default=None)
    #: what `resume_from` changed (another cost model), with its global batch
    changes: list[str] = field(default_factory=list)

    name = "planned"
    planned = True  #: global batches are planned (``planner``, ``LoaderState.plan``)
    sorts_logged_keys = True  #: which rank holds which row depends on the world size
    epoch_guard = 0  #: the planner never repeats a sample in a global batch on its own
    schedule_group = 1  #: the schedule is read sample by sample

    @classmethod
    def from_config(
        cls,
        cfg: RunConfig,
        encoder: SeededTaskEncoder,
        pack_group: int,
        datasets: DatasetSet,
        workers: int,
    ):
        """The mode for run config ``cfg``, whose encoder
        `energon_platform.config_checks.check_with_encoder` has found able to plan: opens (or
        builds, with ``workers`` processes) each dataset's length index. The one place the
        ``loader.balance`` group is read."""
        lc, balance = cfg.loader, cfg.loader.balance
        if not isinstance(encoder, StatesLengths):  # check_with_encoder refuses it, naming the key
            raise TypeError(
                f"{type(encoder).__name__} has no {', '.join(missing(encoder, StatesLengths))}"
            )
        linear = float(balance.linear if balance.linear is not None else encoder.seq_len)
        cost_model = _cost_model(cfg, encoder)
        cost = SampleCost(balance.mode, encoder, linear, cfg.source, cost_model)
        return cls(
            mode=balance.mode,
            window=balance.window,
            lookahead=balance.lookahead,
            budget=balance.global_batch_tokens,
            linear=linear,
            global_batch_size=lc.global_batch_size,
            packed_rows=pack_group > 1,
            encoder=encoder,
            cost=cost,
            length_indexes=_length_indexes(
                cfg, encoder, encoder_digest(encoder), datasets, workers
            ),
            prefixes=[datasets.key_prefix(d) for d in range(len(datasets.entries))],
            history=CostHistory([CostEntry(0, cost_model, cost)]) if cost_model else None,
            ahead=lc.blend_adapt.lag if lc.blend_adapt is not None else 0,
        )

    @property
    def packed(self) -> bool:
        """Whether micro-batches hold packed sequences (the planned rows)."""
        return self.packed_rows

    @property
    def fixed_samples(self) -> bool:
        """Whether every global batch holds a fixed number of samples (unpacked, no budget)."""
        return not self.packed_rows and self.budget is None

    @property
    def like_lengths(self) -> bool:
        """`plans_like_lengths` for this mode and layout."""
        return plans_like_lengths(self.mode, self.fixed_samples)

    def start(self, schedule: Schedule, plan_state: PlanState | None = None) -> None:
        """(Re)build the planner over ``schedule``, continuing from ``plan_state`` (None: where the
        current planner starts, or the start of the run)."""
        if plan_state is None:
            plan_state = self.planner.start if self.planner is not None else PlanState()
        self.planner = Planner(
            self._lengths(schedule),
            self.history or self.cost,
            self.global_batch_size,
            capacity=self.encoder.seq_len if self.packed_rows else 0,
            budget=self.budget,
            window=self.window,
            fill=self.lookahead,
            like_lengths=self.like_lengths,
            start=plan_state,
            keep=16 + self.ahead,
        )

    @property
    def built(self) -> Planner:
        """The planner `start` built (a `RuntimeError` before it)."""
        if self.planner is None:
            raise RuntimeError("the planned batching has no planner yet: start() builds it")
        return self.planner

    def extend(self, schedule: Schedule, before: int) -> None:
        """Go on over ``schedule``, the same stream before position ``before`` (a blend extended
        there): the planner keeps what it planned from earlier positions (`Planner.extend`)."""
        self.built.extend(self._lengths(schedule), before)

    def _lengths(self, schedule: Schedule) -> SampleLengths:
        if self.cost.function.work == "features":
            work, none = feature_work(cast(StatesFeatures, self.encoder))
            return SampleLengths(
                schedule, self.length_indexes, self.encoder, self.prefixes, work, none
            )
        return SampleLengths(schedule, self.length_indexes, self.encoder, self.prefixes)

    def fingerprint(self) -> dict:
        """``{"balance": ...}``: what changes the rows and batches of a planned run (with
        ``measured``, the cost features: the cost model itself may change at resume, and is kept
        in the state's cost history)."""
        balance = {
            "mode": self.mode,
            "window": self.window,
            "lookahead": self.lookahead,
            "global_batch_tokens": self.budget,
            "linear": self.linear,
            "planner": PLANNER_VERSION,
        }
        if self.history is not None:
            balance["cost_model"] = _cost_features()
        if self.like_lengths:
            balance["samples"] = LIKE_LENGTHS
        return {"balance": balance}

    def state_at(self, batch: int) -> dict:
        """The planner's state at global batch ``batch`` (``LoaderState.plan``); ``measured``
        adds the cost history (``costs``)."""
        plan = self.built.state_at(batch).to_json()
        return plan if self.history is None else {**plan, "costs": self.history.to_json()}

    def resume_from(self, state: Any) -> PlanState:
        """The plan state a saved [`LoaderState`][energon_platform.loader.state.LoaderState] continues
        from; `StateMismatchError` when it has none for its next global batch.
        ``measured`` continues the saved cost history (`changes`: another cost model from
        the resume on)."""
        if state.plan is None or state.plan["batch"] != state.next_global_batch:
            raise StateMismatchError(
                "the checkpoint's loader state has no plan for global batch "
                f"{state.next_global_batch} (saved without loader.balance?)"
            )
        if self.history is not None:
            self.history, self.changes = self.history.continued(
                self._saved_costs(state), state.next_global_batch, self._cost_with
            )
        return PlanState.from_json(state.plan)

    def _saved_costs(self, state: Any) -> list[dict]:
        """The cost history of ``state`` (`StateMismatchError` for a state without one)."""
        if "costs" not in state.plan:
            raise StateMismatchError(
                "the checkpoint's plan has no cost history (saved by an earlier build of "
                "loader.balance: measured); a checkpoint of that format is not read"
            )
        return state.plan["costs"]

    def _cost_with(self, model: Any) -> SampleCost:
        """The planner's cost with cost model ``model`` (an earlier one, from a saved history)."""
        return SampleCost(self.mode, self.encoder, self.linear, self.cost.source, model)

    def resume_unit(self, plan_state: PlanState) -> int:
        """The blend unit the next planned batch starts reading at."""
        return plan_state.position

    def consumed(self, batch: int, schedule: Schedule, names: list[str]) -> dict:
        """Per dataset name: ``{"samples", "epochs"}`` before global batch ``batch``: positions
        read before it, less those still waiting (carried)."""
        state = self.built.state_at(batch)
        taken = schedule.blend.consumed(state.position).astype(int)
        for d in schedule.samples(list(state.carried))[0] if state.carried else ():
            taken[int(d)] -= 1
        return {
            n: {"samples": int(t), "epochs": round(int(t) / o.num_samples, 6)}
            for n, t, o in zip(names, taken, schedule.orders)
        }

    def stats(self, batch: int, world_size: int, accumulation: int) -> dict:
        """Global batch ``batch``: per-rank cost max/mean beside its lower bound (`bound_stats`),
        padding, samples and carried samples (for logs and the resume check)."""
        plan = self.built.plan(batch)
        dealt = deal_plan(plan, world_size, accumulation, fixed=self.built.fixed_counts)
        stats = {
            "rank_cost": _spread(rank_costs(plan, dealt)),
            **self.bound_stats(plan, world_size),
            "padding": round(plan.padding, 4),
            "samples": sum(len(i) for i in plan.items),
            "carried": len(plan.next_state.carried),
        }
        if self.history is not None:
            model = self.history.at(batch).cost_model
            stats["rank_cost_by_module"] = self.module_spreads(plan, dealt, model)
        return stats

    def bound_stats(self, plan: Any, world_size: int) -> dict:
        """``rank_cost_bound``: the least max/mean any dealing of the batch's items reaches
        (`plan_bound`; absent for a grouped plan), and ``outlier_anchored`` where one item
        costs more than a rank's fair share (no dealing reaches 1.0: the batch, not the dealing)."""
        bound = plan_bound(plan, world_size, fixed=self.built.fixed_counts)
        out = {} if bound is None else {"rank_cost_bound": round(bound, 4)}
        if outlier_anchored(plan, world_size):
            out["outlier_anchored"] = True
        return out

    def module_spreads(self, plan: Any, dealt: list, model: CostModel) -> dict[str, float]:
        """Per model module (``llm``, ``vision``, ...), the max/mean over ranks of the predicted
        cost of that module's features by ``model`` (the cost model that planned the batch; 1.0
        for a module nothing costs in)."""
        if plan.grouped is not None:  # each micro-batch as it runs
            per_rank = [
                _summed(
                    model.predict_modules(plan.grouped.shape(m).named(model.row_width))
                    for m in rank
                )
                for rank in dealt
            ]
        else:
            works = [self.built.lengths(item) for item in plan.items]
            per_item = [
                _summed(model.predict_modules(_named(w)) for _, w in work) for work in works
            ]
            per_rank = [_summed(per_item[i] for m in rank for i in m) for rank in dealt]
        return {module: _spread([r[module] for r in per_rank]) for module in per_rank[0]}

    def step_done(self, batch: int) -> None:
        """Keep this process's plans current at the end of a global batch (state, stats): O(1)."""
        self.built.plan(batch)


def _cost_features() -> dict:
    """The fingerprint's ``cost_model`` entry: the cost features a cost model is a function of
    (the model itself may change at resume)."""
    return {"features": list(FEATURES)}


def _spread(costs: list[float]) -> float:
    """max/mean of per-rank costs, rounded (1.0 when they are all 0)."""
    mean = sum(costs) / len(costs)
    return round(max(costs) / mean, 4) if mean else 1.0


def _named(work: tuple[float, ...]) -> dict[str, float]:
    """A feature tuple (FEATURES order) as a mapping."""
    return dict(zip(FEATURES, work))


def _summed(parts: Any) -> dict[str, float]:
    """The key-wise sum of mappings of equal keys."""
    total: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0.0) + value
    return total


def _cost_model(cfg: RunConfig, encoder: SeededTaskEncoder) -> CostModel | None:
    """The cost model of ``loader.balance.cost_model`` for a calibrated cost function
    (`CostFunction.calibrated`: ``measured``), else None; a bad file is a one-line
    `CostFileError`."""
    path = cfg.loader.balance.cost_model
    if not COST_MODELS[cfg.loader.balance.mode].calibrated or path is None:
        return None
    return load_cost_model(path, encoder)


def _length_indexes(
    cfg: RunConfig, encoder: IndexedEncoder, digest: str, datasets: DatasetSet, workers: int
) -> list:
    """Each dataset's `LengthIndex` under ``encoder`` (whose config digests to ``digest``): found
    with the data or in a cache, else built now (after one line naming the ``energon-platform
    index`` command this run needs, its overrides included: `index_command`) or, with
    ``loader.length_index: require``, refused with that line."""
    command = index_command(cfg)
    try:
        return [
            open_index(
                e.source,
                encoder,
                digest,
                cfg.loader.length_cache,
                workers=max(1, workers),
                require=cfg.loader.length_index == "require",
                command=command,
            )
            for e in datasets.entries
        ]
    except NotImplementedError as e:  # the encoder cannot state this config's lengths
        raise ConfigError(cfg.source, "loader.balance", str(e)) from None
    except LengthIndexMissing as e:
        raise ConfigError(cfg.source, "loader.length_index", str(e)) from None
