"""Provenance without logs: which samples global step N trained on, and which steps used key K.

The schedule (`schedule`) is a pure function of the config, the
blend history and the ``loader.exclude`` history, so both questions are answered by computing,
never by reading logs or data (only Energon's key index, `key_index`):

* **a step**: its stream positions → ``(dataset, epoch, index)`` (`Schedule.samples`) →
  keys; rank ``r`` of ``R`` holds the ``r``-th contiguous slice of the global batch, cut into
  micro-batches of ``micro_batch_size`` items. A sample that ``loader.exclude`` skips is
  replaced by its keyed stand-in, as the loader does. O(batch size) per step at any corpus size.
* **a key**: key → dataset index (Energon's index) → per epoch of its dataset, its position by
  the inverse permutation (`DatasetOrder.positions`) → the blend's inverse
  (`Blend.unit_of`) → stream position → step. O(1) per epoch, no scan of the steps. Its
  uses as the stand-in of an excluded sample are found the same way from every sample a rule
  can match (a stand-in is a pure function of the sample it replaces).

**Balanced runs** (``loader.balance``): a global batch is the planner's plan
(`planner`), dealt to ranks and micro-batches by
`deal_plan`. The plan of batch ``b`` depends on the
planner's state at ``b`` (next stream position, carried samples), which only planning batches
``0 .. b-1`` gives (or a checkpoint's saved state, for ``b`` at or after it): a step costs a
replay of the planner up to it (lengths from the length index, no data read). A key's stream
positions still come from the inverse permutation; the step that trained each is found in that
same replay (a position read at batch ``b`` is placed within the planner's bounded wait after
``b``). The trainer logs a balanced step's keys sorted (which rank holds which row depends on the
world size), so ``keys`` is sorted there too.

Steps are numbered as the trainer logs them (``log.jsonl``'s ``step``, from 1): step ``N`` is
global batch ``N - 1``. What this cannot know without reading the data: samples that fail to
decode are replaced at run time (the log names them); with packing (unbalanced), the packer
orders the keys inside each pack group.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import replace
from fnmatch import fnmatchcase
from heapq import heapify, heappop, heappush
from itertools import count, islice, takewhile
from typing import Any

import numpy as np

from energon_platform.loader.balance.dealing import deal_plan
from energon_platform.loader.balance.plans import PlanState
from energon_platform.loader.key_index import KeyIndex
from energon_platform.loader.run_plan import RunPlan, build_encoder
from energon_platform.loader.schedule import Schedule
from energon_platform.loader.stand_in import MAX_REPLACEMENTS, candidates, row_fits, stand_in
from energon_platform.loader.state import LoaderState

log = logging.getLogger(__name__)

#: Plans between two progress reports of a planner replay.
PROGRESS_EVERY = 500


class TraceError(ValueError):
    """A trace that cannot be answered (one line: an unknown key, a bad checkpoint, all stand-ins excluded)."""


def parse_steps(text: str | None, step: int | None, key: str | None, default: int) -> range | int:
    """``trace``'s ``--step``/``--steps``: without ``key``, the logged steps to trace (``--step N``
    or ``--steps A:B``, both ends given, ``1 <= A <= B``); with ``key``, the count ``M`` of first
    steps to search (``--steps M``, else ``default``). ``TraceError`` (one line) for anything else."""
    if key is not None:
        if text is None:
            return default
        if not text.isdigit() or int(text) < 1:
            raise TraceError(
                f"--steps {text!r}: with --key, --steps takes a count M (search the first M steps), "
                f"e.g. --steps 100"
            )
        return int(text)
    if text is None:
        if step is None:
            raise TraceError("say which steps to trace: --step N or --steps A:B")
        return range(step, step + 1)
    first, sep, last = text.partition(":")
    if not sep:
        raise TraceError(
            f"--steps {text!r}: without --key, --steps takes a range A:B (both included); "
            f"for one step use --step {text} or --steps {text}:{text}"
        )
    if not (first.isdigit() and last.isdigit()):
        raise TraceError(
            f"--steps {text!r}: expected A:B with both ends given as step numbers (from 1), "
            f"e.g. --steps 1:10"
        )
    a, b = int(first), int(last)
    if not 1 <= a <= b:
        raise TraceError(
            f"--steps {text!r}: expected 1 <= A <= B (steps are numbered from 1, as log.jsonl)"
        )
    return range(a, b + 1)


def step_layout(
    schedule: Schedule, batch: int, world_size: int, micro_items: int
) -> dict[str, np.ndarray]:
    """Every sample of global batch ``batch`` of an unbalanced run in logged order: ``dataset,
    epoch, index, rank, micro_batch`` as ``int64`` arrays (no data needed)."""
    spb, group = schedule.samples_per_batch, schedule.group_size
    pos = np.arange(batch * spb, (batch + 1) * spb, dtype=np.int64)
    d, e, i = schedule.samples(pos)
    item = (pos - batch * spb) // group
    per_rank = schedule.check_world_size(world_size, micro_items)
    rank, within = np.divmod(item, per_rank)
    return {
        "dataset": d,
        "epoch": e,
        "index": i,
        "rank": rank,
        "micro_batch": within // micro_items,
    }


def stream_uses(schedule: Schedule, dataset: int, index: int) -> Iterator[tuple[int, int]]:
    """``(epoch, stream position)`` of every use of sample ``index`` of ``dataset``, in stream
    order (endless unless the blend gives the dataset weight 0 for good), by inverting the
    schedule: O(1) per epoch of the dataset."""
    unit, order = schedule.unit, schedule.orders[dataset]
    for epoch in count():
        j = epoch * order.num_samples + int(order.positions(epoch, [index])[0])
        ju, offset = divmod(j, unit)
        u = int(schedule.blend.unit_of(dataset, [ju])[0])
        if u < 0:  # the dataset takes no more units
            return
        yield epoch, u * unit + offset


def uses(
    schedule: Schedule, dataset: int, index: int, num_batches: int
) -> list[tuple[int, int, int]]:
    """``(global batch, epoch, stream position)`` of every use of sample ``index`` of ``dataset`` in
    the first ``num_batches`` global batches of an unbalanced run: O(1) per epoch."""
    spb = schedule.samples_per_batch
    below = takewhile(lambda use: use[1] < num_batches * spb, stream_uses(schedule, dataset, index))
    return [(pos // spb, epoch, pos) for epoch, pos in below]


class Tracer:
    """Trace of a run's `RunPlan` (after
    `resume` when a checkpoint gives the history).
    ``progress(done, total)``: called during a long planner replay (balanced runs)."""

    def __init__(self, plan: Any, progress: Callable[[int, int], None] | None = None):
        self.plan, self.progress = plan, progress
        self.names = plan.datasets.names
        self._prefixes = [f"{n}:" if plan.datasets.metadataset else "" for n in self.names]
        self._keys = [KeyIndex(e.source) for e in plan.datasets.entries]
        #: balanced runs: a planner from the start, for batches before the plan's
        self._replay = None
        #: the batching mode's answers: a step's samples, and a sample's uses
        self._layout, self._placed = {
            "stream": (self._stream_layout, self._stream_uses),
            "planned": (self._planned_layout, self._planned_uses),
        }[plan.batching.name]

    @property
    def schedule(self) -> Schedule:
        return self.plan.schedule

    @property
    def excluder(self) -> Any:
        return self.plan.excluder

    def key(self, dataset: int, index: int) -> str:
        """The key training logs for sample ``index`` of ``dataset``."""
        return self._prefixes[dataset] + self._keys[dataset].keys([index])[0]

    def shard(self, dataset: int, index: int) -> str:
        keys = self._keys[dataset]
        return keys.shard_names[keys.shard(index)[0]]

    # --- balanced runs: the planner's plans ----------------------------------------------------

    def batch_plan(self, batch: int) -> Any:
        """The planner's `BatchPlan` of global batch
        ``batch``: from the loader's planner at or after its start (a checkpoint's state), else
        replayed from the start of the run; sequential, with progress."""
        planner = self.plan.planner
        if batch < planner.start.batch:
            if self._replay is None or self._replay.lengths is not planner.lengths:
                self._replay = replace(planner, start=PlanState(), _cache=OrderedDict())
            planner = self._replay
        # behind the plans it keeps: from its start
        if batch <= planner.newest and not planner.kept(batch):
            planner.restart(planner.start)
        first = planner.newest + 1
        total = batch - first + 1
        report = self.progress if self.progress is not None and total > PROGRESS_EVERY else None
        for b in range(first, batch):
            planner.plan(b)
            if report is not None and (b - first + 1) % PROGRESS_EVERY == 0:
                report(b - first + 1, total)
        plan = planner.plan(batch)
        if report is not None:
            report(total, total)
        return plan

    def _planned_layout(self, batch: int) -> list[tuple[int, int, int, int, int, int, int | None]]:
        """``(dataset, epoch, index, rank, micro_batch, row, room)`` of every sample of a planned
        global batch, in rank, micro-batch, row order (``room``: a packed row's stand-ins must be
        at most this long, as the loader requires; None unpacked)."""
        run, planner = self.plan, self.plan.planner
        plan = self.batch_plan(batch)
        out = []
        for rank, parts in enumerate(
            deal_plan(plan, run.world_size, run.accumulation, planner.fixed_counts)
        ):
            for micro, rows in enumerate(parts):
                for row, item in enumerate(rows):
                    for d, e, i in zip(
                        *(a.tolist() for a in self.schedule.samples(plan.items[item]))
                    ):
                        room = planner.length_of(d, e, i)[0] if planner.capacity else None
                        out.append((d, e, i, rank, micro, row, room))
        return out

    # --- exclusions -----------------------------------------------------------------------------

    def _stand_in(
        self, batch: int, dataset: int, epoch: int, index: int, room: int | None
    ) -> int | None:
        """The stand-in the loader trains on for an excluded sample (None: no stand-in fits the
        planned row ``room``, which keeps its positions as padding)."""
        chosen = stand_in(
            self.schedule.orders[dataset],
            epoch,
            index,
            lambda c: not self.excluder.excluded(batch, dataset, c, self.key(dataset, c)),
            row_fits(self.plan.planner, dataset, epoch, room),
        )
        if chosen is not None:
            return chosen
        if room is not None:
            return None
        raise TraceError(
            f"global batch {batch}: sample {self.key(dataset, index)} and its {MAX_REPLACEMENTS} "
            f"stand-ins are all excluded; the run stops there"
        )

    def _trained(
        self, batch: int, d: int, e: int, i: int, room: int | None
    ) -> tuple[int | None, dict | None]:
        """``(index trained, exclusion record or None)`` for scheduled sample ``i`` of dataset ``d``."""
        key = self.key(d, i)
        if self.excluder is None or not self.excluder.excluded(batch, d, i, key):
            return i, None
        stand_in = self._stand_in(batch, d, e, i, room)
        return stand_in, {
            "key": key,
            "dataset": self.names[d],
            "stand_in": None if stand_in is None else self.key(d, stand_in),
        }

    def excluded_counts(self, step: int) -> dict[str, int]:
        """Per dataset name: samples of logged step ``step`` (all ranks) that ``loader.exclude``
        replaced; datasets with none are left out."""
        if self.excluder is None or not any(ex.active(step - 1) for ex in self.excluder.history):
            return {}
        return dict(Counter(x["dataset"] for x in self.step(step)["excluded"]))

    # --- the two questions ----------------------------------------------------------------------

    def step(self, step: int) -> dict:
        """``{"step", "global_batch", "world_size", "keys", "samples", "excluded"}`` of logged step
        ``step``; ``keys`` as training logs them (sorted for a balanced run)."""
        if step < 1:
            raise TraceError(f"steps are numbered from 1 (as log.jsonl), got {step}")
        batch = step - 1
        layout = self._layout(batch)
        samples, excluded = [], []
        for d, e, i, r, m, *rest in layout:
            i, record = self._trained(batch, d, e, i, rest[1] if rest else None)
            if record is not None:
                excluded.append(record)
            if i is None:  # no stand-in fits the planned row: padding
                continue
            sample = {
                "key": self.key(d, i),
                "dataset": self.names[d],
                "epoch": e,
                "index": i,
                "shard": self.shard(d, i),
                "rank": r,
                "micro_batch": m,
            }
            samples.append({**sample, "row": rest[0]} if rest else sample)
        keys = [s["key"] for s in samples]
        return {
            "step": step,
            "global_batch": batch,
            "world_size": self.plan.world_size,
            "keys": sorted(keys) if self.plan.batching.sorts_logged_keys else keys,
            "samples": samples,
            "excluded": excluded,
        }

    def find(self, key: str, steps: int) -> dict:
        """``{"key", "steps", "uses", "excluded_steps"}``: the steps among the first ``steps`` that used ``key``."""
        dataset, raw = self._parse_key(key)
        index = self._keys[dataset].index(raw)
        if index is None:
            raise TraceError(
                f"{key}: no such sample in dataset {self.names[dataset]!r} "
                f"(split {self.plan.datasets.entries[dataset].source.split!r})"
            )
        found, skipped = [], []
        for use in self._placed(dataset, [index], steps)[index]:
            if self.excluder is not None and self.excluder.excluded(
                use["step"] - 1, dataset, index, key
            ):
                skipped.append(use["step"])
            else:
                found.append(use)
        found = sorted(found + self._stand_in_uses(dataset, index, steps), key=_use_order)
        return {
            "key": key,
            "dataset": self.names[dataset],
            "index": index,
            "shard": self.shard(dataset, index),
            "within_steps": steps,
            "steps": [u["step"] for u in found],
            "uses": found,
            "excluded_steps": skipped,
        }

    def _excludable(self, dataset: int) -> list[int]:
        """The indices of ``dataset`` that a key or shard rule of the history matches (at any batch):
        exact keys by the index, shards by their ranges, key patterns by a scan of the index."""
        prefix, keys, found = self._prefixes[dataset], self._keys[dataset], set()
        for ex in self.excluder.history if self.excluder is not None else ():
            for key in ex.keys:
                if set("*?[") & set(key):
                    found.update(keys.matching(key, prefix))
                elif key.startswith(prefix) and keys.index(key[len(prefix) :]) is not None:
                    found.add(keys.index(key[len(prefix) :]))
            for k, name in enumerate(keys.shard_names):
                if any(fnmatchcase(prefix + name, p) for p in ex.shards):
                    found.update(range(keys.shard_start(k), keys.shard_start(k + 1)))
        return sorted(found)

    def _stand_in_uses(self, dataset: int, index: int, steps: int) -> list[dict]:
        """The uses of sample ``index`` as the stand-in of an excluded sample in the first ``steps``
        steps, each with ``"stand_in_for"``: the excluded sample's key. Each use of every sample a
        rule can match is checked (its stand-in is a pure function of it): O(those samples x epochs)."""
        order, planner = self.schedule.orders[dataset], self.plan.planner
        others = [x for x in self._excludable(dataset) if x != index]
        out = []
        for x, placed in self._placed(dataset, others, steps).items() if others else ():
            for use in placed:
                batch, epoch = use["step"] - 1, use["epoch"]
                if index not in set(candidates(order, epoch, x)):
                    continue  # cannot be its stand-in in this epoch
                if not self.excluder.excluded(batch, dataset, x, self.key(dataset, x)):
                    continue
                room = (
                    planner.length_of(dataset, epoch, x).row
                    if planner is not None and planner.capacity
                    else None
                )
                if self._stand_in(batch, dataset, epoch, x, room) == index:
                    out.append({**use, "stand_in_for": self.key(dataset, x)})
        return out

    def _stream_layout(self, batch: int) -> Iterator[tuple[int, int, int, int, int]]:
        """Unbalanced: ``(dataset, epoch, index, rank, micro_batch)`` of every sample of global
        batch ``batch`` (`step_layout`)."""
        lay = step_layout(self.schedule, batch, self.plan.world_size, self.plan.micro_items)
        return zip(*(lay[k].tolist() for k in ("dataset", "epoch", "index", "rank", "micro_batch")))

    def _stream_uses(self, dataset: int, indices: list[int], steps: int) -> dict[int, list[dict]]:
        """Unbalanced: per index of ``dataset``, its uses in the first ``steps`` steps."""
        return {i: self._uses(dataset, i, steps) for i in indices}

    def _uses(self, dataset: int, index: int, steps: int) -> list[dict]:
        """Unbalanced: the uses by the inverse schedule, O(1) per epoch."""
        spb, group = self.schedule.samples_per_batch, self.schedule.group_size
        per_rank = self.schedule.check_world_size(self.plan.world_size)
        out = []
        for batch, epoch, pos in uses(self.schedule, dataset, index, steps):
            rank, within = divmod((pos - batch * spb) // group, per_rank)
            out.append(
                {
                    "step": batch + 1,
                    "epoch": epoch,
                    "rank": rank,
                    "micro_batch": within // self.plan.micro_items,
                }
            )
        return out

    def _planned_uses(self, dataset: int, indices: list[int], steps: int) -> dict[int, list[dict]]:
        """Balanced: per index of ``dataset``, its uses in the first ``steps`` steps. The samples'
        stream positions come by the inverse schedule (merged in stream order), each looked for in
        the plans from the one that read it (a position read by batch ``b`` is placed in ``b`` or a
        later plan: the planner's wait is bounded) until it is placed: one replay of the planner
        through ``steps``, each plan checked with a set lookup."""
        run, planner = self.plan, self.plan.planner
        streams = {i: stream_uses(self.schedule, dataset, i) for i in indices}
        ahead = [
            (pos, epoch, i) for i, stream in streams.items() for epoch, pos in islice(stream, 1)
        ]
        heapify(ahead)
        # stream position read, not yet placed -> (epoch, index)
        pending: dict[int, tuple[int, int]] = {}
        out: dict[int, list[dict]] = {i: [] for i in indices}
        for batch in range(steps):
            plan = self.batch_plan(batch)
            while ahead and ahead[0][0] < plan.next_state.position:  # read by this plan
                pos, epoch, i = heappop(ahead)
                pending[pos] = (epoch, i)
                for epoch, pos in islice(streams[i], 1):
                    heappush(ahead, (pos, epoch, i))
            hits = [k for k, item in enumerate(plan.items) if pending.keys() & set(item)]
            if hits:
                dealt = deal_plan(plan, run.world_size, run.accumulation, planner.fixed_counts)
                where = {
                    item: (r, m, row)
                    for r, parts in enumerate(dealt)
                    for m, rows in enumerate(parts)
                    for row, item in enumerate(rows)
                }
                for k in hits:
                    r, m, row = where[k]
                    for pos in sorted(pending.keys() & set(plan.items[k])):
                        epoch, i = pending.pop(pos)
                        out[i].append(
                            {
                                "step": batch + 1,
                                "epoch": epoch,
                                "rank": r,
                                "micro_batch": m,
                                "row": row,
                            }
                        )
            if not ahead and not pending:
                break
        return {i: sorted(u, key=_use_order) for i, u in out.items()}

    def _parse_key(self, key: str) -> tuple[int, str]:
        if not self.plan.datasets.metadataset:
            return 0, key
        name, sep, raw = key.partition(":")
        if not sep or name not in self.names:
            raise TraceError(
                f"{key}: a key of a blend is DATASET:KEY with DATASET one of {self.names}"
            )
        return self.names.index(name), raw


def _use_order(use: dict) -> tuple:
    return use["step"], use["rank"], use["micro_batch"], use.get("row", 0)


def open_tracer(
    cfg: Any,
    world_size: int | None = None,
    state: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Tracer:
    """A `Tracer` for run config ``cfg``; ``state``: a checkpoint's loader state (rank 0's,
    `energon_platform.training.checkpoint.loader_state`) that gives the blend and exclusion
    history (and, unless ``world_size`` is given, the world size; for a balanced run, the planner's
    state there). Builds the run's plan and its encoder, no loader. Where ``cfg`` differs from
    the state (blend weights, ``loader.exclude``, the cost model), a note says so and that the
    steps after the checkpoint are traced with ``cfg``'s: reading a checkpoint resumes no run."""
    if world_size is None:
        world_size = int((state or {}).get("layout", {}).get("world_size", 1))
    plan = RunPlan(cfg, build_encoder(cfg), world_size=world_size)
    if state is not None:
        plan.resume(LoaderState.from_dict(state), announce=False)
        for change in plan.blend_changes:
            log.warning(
                "note: the config differs from the checkpoint's state: %s (steps from there on "
                "are traced with the config's)",
                change,
            )
    return Tracer(plan, progress)


def format_step(trace: dict) -> str:
    """A step as text: one header line, one line per sample."""
    lines = [
        f"step {trace['step']} (global batch {trace['global_batch']}, {len(trace['keys'])} samples, "
        f"{trace['world_size']} rank(s)); {len(trace['excluded'])} excluded"
    ]
    lines += [
        f"  rank {s['rank']} micro {s['micro_batch']}"
        + (f" row {s['row']}" if "row" in s else "")
        + f"  {s['dataset']}  epoch {s['epoch']}  {s['shard']}  {s['key']}"
        for s in trace["samples"]
    ]
    lines += [
        f"  excluded {x['key']} -> "
        + (f"stand-in {x['stand_in']}" if x["stand_in"] else "padding (no stand-in fits)")
        for x in trace["excluded"]
    ]
    return "\n".join(lines)


def format_key(found: dict) -> str:
    steps = found["steps"]
    head = (
        f"{found['key']} ({found['dataset']}, index {found['index']}, {found['shard']}): "
        f"{len(steps)} step(s) of the first {found['within_steps']}"
    )
    lines = [head] + [
        f"  step {u['step']}  epoch {u['epoch']}  rank {u['rank']} micro {u['micro_batch']}"
        + (f"  as the stand-in of excluded {u['stand_in_for']}" if "stand_in_for" in u else "")
        for u in found["uses"]
    ]
    if found["excluded_steps"]:
        lines.append(f"  excluded in step(s) {found['excluded_steps']}")
    return "\n".join(lines)
