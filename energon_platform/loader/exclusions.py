"""``loader.exclude``: skip keys, shards or whole datasets from a given global batch on, exactly.

A run's exclusions are a history of `Exclusion` records (first global batch, end or None,
what they match), planned from the config and continued at resume the way the blend is
(`blend_history`):

* a sample matched by a rule active at global batch ``b`` is never trained on in ``b``: the
  micro-batch maker treats it like a sample that failed to load, so it is replaced by its keyed
  stand-in (`replacement`, a pure function of
  the sample; stand-ins that are excluded too are passed over). Batches stay full and identical
  on every layout; steps before the rule's start are untouched;
* a whole dataset (``datasets``) gets weight 0 in the blend from the rule's start (a change of
  the blend, kept in the blend history), so no stand-in is needed;
* at resume, a rule added to the config takes effect from the resume batch (from its own step
  when that is later), and a saved rule no longer in the config ends there; the saved history
  before the resume stays as it was, so a later resume, and ``energon-platform trace``, replay it.

Keys are matched as training logs them (``"{dataset}:{key}"`` in a blend, else the bare key),
shards as ``"{dataset}:{shard name}"`` in a blend, else the shard name; both take ``fnmatch``
patterns.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from fractions import Fraction
from itertools import accumulate
from typing import Any

from energon_platform.loader.key_index import KeyIndex
from storage import DatasetError

_PATTERN = set("*?[")


@dataclass(frozen=True)
class Exclusion:
    """From global batch ``start`` until ``end`` (exclusive; None: open), skip what the lists match."""

    start: int
    end: int | None
    keys: tuple[str, ...] = ()
    shards: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()

    @property
    def what(self) -> tuple:
        return self.keys, self.shards, self.datasets

    def active(self, batch: int) -> bool:
        return self.start <= batch and (self.end is None or batch < self.end)

    def describe(self) -> str:
        parts = [
            f"{name} {list(v)}" for name, v in zip(("keys", "shards", "datasets"), self.what) if v
        ]
        return ", ".join(parts)

    def to_json(self) -> dict:
        return {
            "start": self.start,
            "end": self.end,
            "keys": list(self.keys),
            "shards": list(self.shards),
            "datasets": list(self.datasets),
        }

    @classmethod
    def from_json(cls, data: Any) -> Exclusion:
        """A saved rule, checked (``ValueError`` naming what is wrong)."""
        if not isinstance(data, dict) or set(data) != {
            "start",
            "end",
            "keys",
            "shards",
            "datasets",
        }:
            raise ValueError("each rule must be {start, end, keys, shards, datasets}")
        start, end = data["start"], data["end"]
        if (
            isinstance(start, bool)
            or not isinstance(start, int)
            or start < 0
            or (
                end is not None
                and (isinstance(end, bool) or not isinstance(end, int) or end <= start)
            )
        ):
            raise ValueError(
                f"start {start!r} / end {end!r} must be integers with 0 <= start < end (or end null)"
            )
        lists = [data[k] for k in ("keys", "shards", "datasets")]
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in lists):
            raise ValueError("keys, shards and datasets must be lists of strings")
        return cls(start, end, *(tuple(v) for v in lists))


def planned(rules: Sequence[Any]) -> list[Exclusion]:
    """The history of a fresh run: one open `Exclusion` per ``loader.exclude`` entry."""
    return [
        Exclusion(r.step, None, tuple(r.keys), tuple(r.shards), tuple(r.datasets)) for r in rules
    ]


def check_rules(rules: Sequence[Any], datasets: Any, warn: bool = True) -> list[str]:
    """Refuse (``DatasetError``, one line naming the rule and the value) what ``loader.exclude``'s
    ``rules`` can be seen to get wrong without a scan: a pattern with an unclosed ``[``, a blend key
    or shard without its ``DATASET:`` prefix, an exact key no dataset has, a shard (or shard
    pattern) that matches no shard, and rules that together exclude every sample of a dataset by
    exact keys and shards: every rank refuses the same (a lookup per exact key, nothing that grows
    with the samples). With ``warn`` (rank 0: once per job), also one warning per rule whose key
    patterns match no sample: a range of the key index's sorted keys for a pattern with a literal
    head, a scan that stops at the first match for one that starts with a wildcard."""
    indexes = [KeyIndex(e.source) for e in datasets.entries] if any(r.keys for r in rules) else []
    warnings, covered = [], []
    for rule in rules:
        covered.append(_check_rule(rule, datasets, indexes))
        patterns = _patterns(rule.keys)
        if (
            warn
            and patterns
            and not any(
                indexes[d].matching(p, prefix, limit=1)
                for p in patterns
                for d, prefix in enumerate(_prefixes(datasets))
            )
        ):
            warnings.append(
                f"loader.exclude rule from step {rule.step}: key pattern(s) {_patterns(rule.keys)} "
                f"match no sample; the rule skips nothing by key"
            )
    _check_not_everything(rules, datasets, covered)
    return warnings


def _unclosed_bracket(pattern: str) -> bool:
    """Whether ``pattern`` has a ``[`` that ``fnmatch`` reads as a literal (no closing ``]``)."""
    i, n = 0, len(pattern)
    while i < n:
        if pattern[i] == "[":
            j = i + 1
            j += j < n and pattern[j] == "!"
            j += j < n and pattern[j] == "]"
            j = pattern.find("]", j)
            if j < 0:
                return True
            i = j
        i += 1
    return False


def _patterns(items: Sequence[str]) -> list[str]:
    return [x for x in items if _PATTERN & set(x)]


def _prefixes(datasets: Any) -> list[str]:
    """Per dataset, what its keys and shard names carry in front in a rule (``"NAME:"`` in a blend)."""
    return [f"{n}:" if datasets.metadataset else "" for n in datasets.names]


def _check_rule(rule: Any, datasets: Any, indexes: Sequence[Any]) -> list[set]:
    """Refuses what is wrong with one rule; per dataset, the indices its exact keys and shards
    match."""
    where = f"loader.exclude rule from step {rule.step}"
    prefixes = _prefixes(datasets)
    for value in (*rule.keys, *rule.shards):
        if _unclosed_bracket(value):
            raise DatasetError(
                f"{where}: pattern {value!r} has a '[' without its ']'; write '[[]' for a literal '['"
            )
        head = value[: min([value.find(c) for c in _PATTERN if c in value] or [len(value)])]
        if datasets.metadataset and not any(
            head.startswith(p) or (head != value and p.startswith(head)) for p in prefixes
        ):
            raise DatasetError(
                f"{where}: {value!r} names no dataset of the blend; write DATASET:KEY or "
                f"DATASET:SHARD with DATASET one of {datasets.names}"
            )
    matched = [set() for _ in datasets.entries]
    for value in rule.shards:
        hits = [
            (d, k)
            for d, e in enumerate(datasets.entries)
            for k, name in enumerate(e.source.shard_names)
            if fnmatchcase(prefixes[d] + name, value)
        ]
        if not hits:
            example = prefixes[0] + datasets.entries[0].source.shard_names[0]
            raise DatasetError(
                f"{where}: shard {value!r} matches no shard of the run (shards are named like "
                f"{example!r})"
            )
        for d, k in hits:
            start = sum(datasets.entries[d].source.shard_counts[:k])
            matched[d].update(range(start, start + datasets.entries[d].source.shard_counts[k]))
    for value in rule.keys:
        if _PATTERN & set(value):
            continue
        d = next((d for d, p in enumerate(prefixes) if value.startswith(p)), None)
        index = None if d is None else indexes[d].index(value[len(prefixes[d]) :])
        if d is None or index is None:
            raise DatasetError(
                f"{where}: no sample has key {value!r} (keys as logged"
                + (": DATASET:KEY)" if datasets.metadataset else ")")
            )
        matched[d].add(index)
    return matched


def _check_not_everything(
    rules: Sequence[Any], datasets: Any, covered: Sequence[list[set]]
) -> None:
    """Refuses rules whose exact keys and shards, from the step where they are all in effect,
    match every sample of a dataset (every stand-in would be excluded too)."""
    for step in sorted({r.step for r in rules}):
        active = [(r, c) for r, c in zip(rules, covered) if r.step <= step]
        for d, entry in enumerate(datasets.entries):
            if any(entry.name in r.datasets for r, _ in active):
                continue
            if len(set().union(*(c[d] for _, c in active))) >= len(entry.source):
                steps = sorted({r.step for r, c in active if c[d]})
                instead = (
                    f"exclude the dataset instead (datasets: [{entry.name}]; with loader.balance, give it "
                    f"weight 0 in loader.blend_schedule)"
                    if datasets.metadataset
                    else "nothing would be left to train on"
                )
                which = f"dataset {entry.name!r}" if datasets.metadataset else "the dataset"
                raise DatasetError(
                    f"loader.exclude rule(s) from step(s) {steps} exclude every sample of {which} "
                    f"from step {step} by keys and shards; {instead}"
                )


def resumed(
    saved: Sequence[Exclusion], rules: Sequence[Any], resume_batch: int
) -> tuple[list[Exclusion], list[str]]:
    """``(history, changes)`` continuing the ``saved`` history at ``resume_batch`` with the config's ``rules``."""
    wanted = {(tuple(r.keys), tuple(r.shards), tuple(r.datasets)): r.step for r in rules}
    out, changes, open_now = [], [], set()
    for ex in saved:
        if ex.start >= resume_batch:  # not yet in effect: the config decides again
            continue
        if ex.end is None and ex.what not in wanted:
            changes.append(f"from global batch {resume_batch}: exclusion of {ex.describe()} ended")
            ex = Exclusion(ex.start, resume_batch, *ex.what)
        elif ex.end is None:
            open_now.add(ex.what)
        out.append(ex)
    for what, step in wanted.items():
        if what in open_now:
            continue
        ex = Exclusion(max(step, resume_batch), None, *what)
        if step < resume_batch:
            changes.append(
                f"from global batch {resume_batch}: exclusion of {ex.describe()} added "
                f"(configured from step {step})"
            )
        out.append(ex)
    return out, changes


@dataclass(frozen=True)
class PlannedStep:
    """A ``BlendStep``-like entry of `blend_steps`: from global step ``step`` on, ``weights``
    (dataset name → an exact fraction as text, ``"1/3"``; `plan_segments` reads either)."""

    step: int
    weights: dict[str, str]


def blend_steps(
    datasets: Any, blend_schedule: Sequence[Any], history: Sequence[Exclusion]
) -> tuple:
    """``blend_schedule`` with the dataset exclusions of ``history`` folded in: at every step where
    the planned weights or an exclusion change, the planned weights with excluded datasets at 0
    (`PlannedStep`s, for `plan_segments`; ``blend_schedule`` as it is without such exclusions)."""
    dropping = [ex for ex in history if ex.datasets]
    if not dropping:
        return tuple(blend_schedule)
    names = datasets.names
    unknown = sorted({n for ex in dropping for n in ex.datasets} - set(names))
    if unknown:
        raise DatasetError(
            f"loader.exclude names dataset(s) {unknown} that the run does not have "
            f"(its datasets: {names})"
        )
    for entry in blend_schedule:
        if set(entry.weights) - set(names):
            raise DatasetError(
                f"loader.blend_schedule names dataset(s) {sorted(set(entry.weights) - set(names))} "
                f"that the blend does not have (its datasets: {list(names)})"
            )
    base = dict(zip(names, (Fraction(w) for w in datasets.weights())))
    points = sorted(
        {b.step for b in blend_schedule}
        | {ex.start for ex in dropping}
        | {ex.end for ex in dropping if ex.end is not None}
    )
    steps = []
    for step in points:
        planned_now = [b for b in blend_schedule if b.step <= step]
        weights = (
            {n: Fraction(str(planned_now[-1].weights.get(n, 0))) for n in names}
            if planned_now
            else dict(base)
        )
        for ex in dropping:
            if ex.active(step):
                weights.update({n: Fraction(0) for n in ex.datasets})
        if not any(weights.values()):
            raise DatasetError(
                f"loader.exclude leaves no dataset with a weight above 0 from global batch {step}"
            )
        steps.append(PlannedStep(step, {n: str(w) for n, w in weights.items()}))
    return tuple(steps)


class Excluder:
    """``excluded(batch, dataset, index, key)``: whether the history skips that sample at ``batch``.

    ``key`` is the sample's key as logged; shards are found from ``index`` (no read)."""

    def __init__(self, history: Sequence[Exclusion], datasets: Any):
        self.history = list(history)
        self.names = datasets.names
        self._prefixes = [f"{n}:" if datasets.metadataset else "" for n in self.names]
        self._shard_names = [e.source.shard_names for e in datasets.entries]
        self._shard_starts = [[0, *accumulate(e.source.shard_counts)] for e in datasets.entries]
        self._rules = [
            (ex, *_matcher(ex.keys), *_matcher(ex.shards), set(ex.datasets)) for ex in self.history
        ]

    def __bool__(self) -> bool:
        return bool(self.history)

    def shard(self, dataset: int, index: int) -> str:
        """The name of the shard that holds sample ``index`` of ``dataset`` (``train/shard-000003.tar``)."""
        return self._shard_names[dataset][bisect_right(self._shard_starts[dataset], index) - 1]

    def rule(self, batch: int, dataset: int, index: int, key: str) -> Exclusion | None:
        """The first rule active at ``batch`` that matches the sample, or None."""
        shard = None
        for ex, key_set, key_patterns, shard_set, shard_patterns, names in self._rules:
            if not ex.active(batch):
                continue
            if (
                self.names[dataset] in names
                or key in key_set
                or any(fnmatchcase(key, p) for p in key_patterns)
            ):
                return ex
            if shard_set or shard_patterns:
                shard = shard or self._prefixes[dataset] + self.shard(dataset, index)
                if shard in shard_set or any(fnmatchcase(shard, p) for p in shard_patterns):
                    return ex
        return None

    def excluded(self, batch: int, dataset: int, index: int, key: str) -> bool:
        return self.rule(batch, dataset, index, key) is not None


def _matcher(items: Sequence[str]) -> tuple[set, list]:
    """Exact strings as a set, patterns as a list."""
    return {x for x in items if not _PATTERN & set(x)}, [x for x in items if _PATTERN & set(x)]
