"""Provenance without logs: which samples global step N trained on, and which steps used key K.

The schedule (:mod:`~energon_platform.loader.schedule`) is a pure function of the config, the
blend history and the ``loader.exclude`` history, so both questions are answered by computing,
never by reading logs or data (only Energon's key index, :mod:`~energon_platform.loader.key_index`):

* **a step**: its stream positions → ``(dataset, epoch, index)`` (:meth:`Schedule.samples`) →
  keys; rank ``r`` of ``R`` holds the ``r``-th contiguous slice of the global batch, cut into
  micro-batches of ``micro_batch_size`` items. A sample that ``loader.exclude`` skips is
  replaced by its keyed stand-in, as the loader does. O(batch size) per step at any corpus size.
* **a key**: key → dataset index (Energon's index) → per epoch of its dataset, its position by
  the inverse permutation (:meth:`DatasetOrder.positions`) → the blend's inverse
  (:meth:`Blend.unit_of`) → stream position → step. O(1) per epoch, no scan of the steps.

Steps are numbered as the trainer logs them (``log.jsonl``'s ``step``, from 1): step ``N`` is
global batch ``N - 1``. What this cannot know without reading the data: samples that fail to
decode are replaced at run time (the log names them); with packing, the packer orders the keys
inside each pack group. Balanced runs (``loader.balance``) are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from energon_platform.loader.batches import MAX_REPLACEMENTS
from energon_platform.loader.key_index import KeyIndex
from energon_platform.loader.schedule import Schedule


class TraceError(ValueError):
    """A trace that cannot be answered (one line: a balanced run, an unknown key, a bad checkpoint)."""


def step_layout(schedule: Schedule, batch: int, world_size: int, micro_items: int) -> dict[str, np.ndarray]:
    """Every sample of global batch ``batch`` in logged order: ``dataset, epoch, index, rank,
    micro_batch`` as ``int64`` arrays (no data needed)."""
    spb, group = schedule.samples_per_batch, schedule.group_size
    pos = np.arange(batch * spb, (batch + 1) * spb, dtype=np.int64)
    d, e, i = schedule.samples(pos)
    item = (pos - batch * spb) // group
    per_rank = schedule.check_world_size(world_size, micro_items)
    rank, within = np.divmod(item, per_rank)
    return {"dataset": d, "epoch": e, "index": i, "rank": rank, "micro_batch": within // micro_items}


def uses(schedule: Schedule, dataset: int, index: int, num_batches: int) -> list[tuple[int, int, int]]:
    """``(global batch, epoch, stream position)`` of every use of sample ``index`` of ``dataset`` in
    the first ``num_batches`` global batches, by inverting the schedule: O(1) per epoch."""
    spb, unit = schedule.samples_per_batch, schedule.unit
    order = schedule.orders[dataset]
    taken = int(schedule.blend.consumed(num_batches * spb // unit)[dataset]) * unit  # samples of it read
    out = []
    for epoch in range(-(-taken // order.num_samples)):
        j = epoch * order.num_samples + int(order.positions(epoch, [index])[0])
        if j >= taken:
            continue
        ju, offset = divmod(j, unit)
        u = int(schedule.blend.unit_of(dataset, [ju])[0])
        if u >= 0:
            pos = u * unit + offset
            out.append((pos // spb, epoch, pos))
    return out


class Tracer:
    """Trace of a run built as a :class:`~energon_platform.loader.train_loader.TrainLoader` (not
    iterated; after ``load_state_dict`` when a checkpoint gives the history)."""

    def __init__(self, loader: Any):
        if loader.planned:
            raise TraceError(f"trace follows unbalanced runs only; this config sets loader.balance: "
                             f"{loader.config.balance!r}, whose batches come from the planner")
        self.loader, self.schedule = loader, loader.schedule
        self.names = loader.datasets.names
        self._prefixes = [f"{n}:" if loader.datasets.metadataset else "" for n in self.names]
        self._keys = [KeyIndex(e.source) for e in loader.datasets.entries]
        self.excluder = loader.maker.exclusions

    def key(self, dataset: int, index: int) -> str:
        """The key training logs for sample ``index`` of ``dataset``."""
        return self._prefixes[dataset] + self._keys[dataset].keys([index])[0]

    def shard(self, dataset: int, index: int) -> str:
        keys = self._keys[dataset]
        return keys.shard_names[keys.shard(index)[0]]

    def _stand_in(self, batch: int, dataset: int, epoch: int, index: int) -> int:
        order = self.schedule.orders[dataset]
        for attempt in range(1, MAX_REPLACEMENTS + 1):
            candidate = order.replacement(epoch, index, attempt)
            if not self.excluder.excluded(batch, dataset, candidate, self.key(dataset, candidate)):
                return candidate
        raise TraceError(f"global batch {batch}: sample {self.key(dataset, index)} and its {MAX_REPLACEMENTS} "
                         f"stand-ins are all excluded; the run stops there")

    def step(self, step: int) -> dict:
        """``{"step", "global_batch", "keys", "samples", "excluded"}`` of logged step ``step``."""
        if step < 1:
            raise TraceError(f"steps are numbered from 1 (as log.jsonl), got {step}")
        batch = step - 1
        lay = step_layout(self.schedule, batch, self.loader.world_size, self.loader.micro_items)
        samples, excluded = [], []
        for d, e, i, r, m in zip(*(lay[k].tolist() for k in ("dataset", "epoch", "index", "rank", "micro_batch"))):
            key = self.key(d, i)
            if self.excluder is not None and self.excluder.excluded(batch, d, i, key):
                stand_in = self._stand_in(batch, d, e, i)
                excluded.append({"key": key, "stand_in": self.key(d, stand_in)})
                i, key = stand_in, self.key(d, stand_in)
            samples.append({"key": key, "dataset": self.names[d], "epoch": e, "index": i,
                            "shard": self.shard(d, i), "rank": r, "micro_batch": m})
        return {"step": step, "global_batch": batch, "world_size": self.loader.world_size,
                "keys": [s["key"] for s in samples], "samples": samples, "excluded": excluded}

    def find(self, key: str, steps: int) -> dict:
        """``{"key", "steps", "uses", "excluded_steps"}``: the steps among the first ``steps`` that used ``key``."""
        dataset, raw = self._parse_key(key)
        index = self._keys[dataset].index(raw)
        if index is None:
            raise TraceError(f"{key}: no such sample in dataset {self.names[dataset]!r} "
                             f"(split {self.loader.datasets.entries[dataset].source.split!r})")
        found, skipped = [], []
        per_rank = self.schedule.check_world_size(self.loader.world_size)
        for batch, epoch, pos in uses(self.schedule, dataset, index, steps):
            if self.excluder is not None and self.excluder.excluded(batch, dataset, index, key):
                skipped.append(batch + 1)
                continue
            rank, within = divmod((pos - batch * self.schedule.samples_per_batch) // self.schedule.group_size,
                                  per_rank)
            found.append({"step": batch + 1, "epoch": epoch, "rank": rank,
                          "micro_batch": within // self.loader.micro_items})
        return {"key": key, "dataset": self.names[dataset], "index": index, "shard": self.shard(dataset, index),
                "within_steps": steps, "steps": [u["step"] for u in found], "uses": found, "excluded_steps": skipped}

    def _parse_key(self, key: str) -> tuple[int, str]:
        if not self.loader.datasets.metadataset:
            return 0, key
        name, sep, raw = key.partition(":")
        if not sep or name not in self.names:
            raise TraceError(f"{key}: a key of a blend is DATASET:KEY with DATASET one of {self.names}")
        return self.names.index(name), raw


def checkpoint_state(path: str | Path) -> dict:
    """Rank 0's loader state of a checkpoint folder (``step_000020``), or of the newest complete
    checkpoint under a run's output folder or its ``checkpoints`` folder."""
    from energon_platform.training import checkpoint

    path = Path(path)
    if not (path / "meta.json").is_file():
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        found = checkpoint.latest(root) if root.is_dir() else None
        if found is None:
            raise TraceError(f"{path}: no checkpoint there (a step_NNNNNN folder, or a run's output folder)")
        path = found
    checkpoint.verify(path)
    return json.loads((path / "loader_rank0.json").read_text())


def open_tracer(cfg: Any, world_size: int | None = None, checkpoint: str | Path | None = None) -> Tracer:
    """A :class:`Tracer` for run config ``cfg``; ``checkpoint``: take the blend and exclusion history
    (and, unless ``world_size`` is given, the world size) from that checkpoint's loader state."""
    from energon_platform.loader.train_loader import TrainLoader

    state = checkpoint_state(checkpoint) if checkpoint is not None else None
    if world_size is None:
        world_size = (state or {}).get("layout", {}).get("world_size", 1)
    loader = TrainLoader(cfg, rank=0, world_size=world_size, num_workers=0)
    if state is not None:
        loader.load_state_dict(state)
    return Tracer(loader)


def format_step(trace: dict) -> str:
    """A step as text: one header line, one line per sample."""
    lines = [f"step {trace['step']} (global batch {trace['global_batch']}, {len(trace['keys'])} samples, "
             f"{trace['world_size']} rank(s)); {len(trace['excluded'])} excluded"]
    lines += [f"  rank {s['rank']} micro {s['micro_batch']}  {s['dataset']}  epoch {s['epoch']}  {s['shard']}  {s['key']}"
              for s in trace["samples"]]
    lines += [f"  excluded {x['key']} -> stand-in {x['stand_in']}" for x in trace["excluded"]]
    return "\n".join(lines)


def format_key(found: dict) -> str:
    steps = found["steps"]
    head = (f"{found['key']} ({found['dataset']}, index {found['index']}, {found['shard']}): "
            f"{len(steps)} step(s) of the first {found['within_steps']}")
    lines = [head] + [f"  step {u['step']}  epoch {u['epoch']}  rank {u['rank']} micro {u['micro_batch']}"
                      for u in found["uses"]]
    if found["excluded_steps"]:
        lines.append(f"  excluded in step(s) {found['excluded_steps']}")
    return "\n".join(lines)
