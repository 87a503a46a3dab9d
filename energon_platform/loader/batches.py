"""Making one micro-batch: schedule positions → Energon samples → task encoder → batch.

Runs the task encoder's hooks in Energon's order: ``encode_sample`` (or ``preencode_sample``),
with packing ``select_samples_to_pack`` → ``postencode_sample`` → ``pack_selected_samples``, then
``batch`` → ``encode_batch``. A sample that fails to load or encode is reported to the encoder's
error handler (``task_encoders.skipping.SkipPolicy``, which counts it by key and stops a flood)
and replaced by its first stand-in that loads (a keyed draw of the same dataset and epoch,
`replacement`), so every micro-batch stays
full. Failures are a function of the sample and stand-ins a function of the failed sample, so the
batches are the same on every layout and every resume. A failing *store* (``StorageError``) is
never skipped: it stops the run. With ``loader.sample_timeout`` a worker marks the sample it is on
in a `SampleWatch`; a sample its worker was replaced
for is a failed sample from then on (`MicroBatchMaker.timed_out`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from megatron.energon import DefaultTaskEncoder
from megatron.energon.errors import FatalSampleError

from energon_platform.loader.balance.dealing import deal_plan
from energon_platform.loader.sample_watch import SampleTimeoutError, SampleWatch
from energon_platform.loader.schedule import Schedule
from energon_platform.loader.source import StorageError
from energon_platform.loader.stand_in import MAX_REPLACEMENTS, row_fits, stand_in
from task_encoders.abilities import StatesLengths
from task_encoders.seeding import single_intra_op_thread

if TYPE_CHECKING:
    from energon_platform.loader.datasets import DatasetSet
    from energon_platform.loader.exclusions import Excluder
    from task_encoders.base import SeededTaskEncoder


log = logging.getLogger(__name__)

#: Micro-batches a worker reads ahead on object storage (their bytes only; encoding stays in order;
#: `energon_platform.loader.executors`).
LOOKAHEAD = 2


def _overridden(encoder: SeededTaskEncoder, name: str) -> bool:

    return getattr(type(encoder), name) is not getattr(DefaultTaskEncoder, name)


def _as_list(result: Any) -> list:
    return list(result) if inspect.isgenerator(result) else [result]


class MicroBatchMaker:
    """``maker(c)`` builds micro-batch ``c`` of one data-parallel rank (a pure function of ``c``).

    Micro-batch ``c`` is part ``c % accumulation`` of the rank's share of global batch
    ``c // accumulation``. With packing (``schedule.group_size > 1``) each item is a group of
    samples that the encoder packs into one or more sequences.

    ``datasets``: the run's `DatasetSet`, in schedule
    order. A sample of a metadataset run gets the key ``"{dataset name}:{key}"`` (so logs, batches
    and per-sample seeds say which dataset it came from) and the entry's subflavors.
    """

    def __init__(
        self,
        datasets: DatasetSet,
        encoder: SeededTaskEncoder,
        schedule: Schedule,
        rank: int,
        world_size: int,
        micro_items: int,
        planner: Any = None,
        exclusions: Excluder | None = None,
    ):
        self.datasets, self.encoder, self.schedule = datasets, encoder, schedule
        #: ``loader.exclude``: an `Excluder`, or None
        self.exclusions = exclusions or None
        #: per dataset name: scheduled samples that loader.exclude replaced, in this process
        self.excluded: dict[str, int] = {}
        #: (global batch, (note, dataset) logged in it)
        self._excluded_logged: tuple[int, set] = (
            -1,
            set(),
        )
        #: the rule that excluded the sample `_load_encoded` last returned None for
        self._rule: Any = None
        #: the rules whose samples this micro-batch leaves as padding (no stand-in fits): to name them
        self._padded_by: list = []
        self.rank, self.world_size = rank, world_size
        #: with ``loader.balance``: the `Planner` of the run
        self.planner = planner
        self.sources = [e.source for e in datasets.entries]
        self.items = schedule.rank_items(rank, world_size)
        if len(self.items) % micro_items:
            raise ValueError(
                f"{len(self.items)} items per rank cannot be cut into micro-batches of {micro_items}"
            )
        self.micro_items = micro_items
        self.accumulation = len(self.items) // micro_items
        self.packing = schedule.group_size > 1 or bool(planner is not None and planner.capacity)
        self._encode = (
            encoder.preencode_sample
            if _overridden(encoder, "preencode_sample")
            else encoder.encode_sample
        )
        self._postencode = (
            encoder.postencode_sample if _overridden(encoder, "postencode_sample") else None
        )
        #: the encoder's error handler (its `SkipPolicy`: counts by key, stops a flood)
        self._handler = encoder.skip_policy
        #: the encoder's Energon decoder (images as bytes for the image encoders), as Energon uses it
        self.decoder = encoder.decoder
        self.replaced: list[dict] = []  #: failed samples and their stand-ins, in this process
        #: ``loader.sample_timeout``: the watch this process marks its samples in (None: unwatched),
        #: and its row there (the worker's number, set by the executor that runs it)
        self.watch: SampleWatch | None = None
        self.watch_row = 0
        #: ``(dataset, index)`` → ``(key, limit)`` of samples that took longer than the limit, for
        #: which a worker was replaced: failed samples (their stand-ins are used), without a wait
        self.timed_out: dict[tuple[int, int], tuple[str, float]] = {}

    def _skip(self, exc: Exception, what: Any) -> None:
        self._handler(exc, what)

    def _load_encoded(self, c: int, dataset: int, epoch: int, index: int) -> list | None:
        """The encoded sample(s) (for micro-batch ``c``); ``[]`` when it failed or timed out before
        (reported to the skip policy), None when ``loader.exclude`` skips it (not a failure)."""
        if (dataset, index) in self.timed_out:
            key, limit = self.timed_out[dataset, index]
            self._skip(
                SampleTimeoutError(f"took longer than loader.sample_timeout ({limit:g} s)"),
                {"__key__": key},
            )
            return []
        if self.watch is None:
            return self._read_and_encode(c, dataset, epoch, index)
        with self.watch.on(self.watch_row, c, dataset, epoch, index):
            return self._read_and_encode(c, dataset, epoch, index)

    def _read_and_encode(self, c: int, dataset: int, epoch: int, index: int) -> list | None:
        """`_load_encoded` of a sample not known to time out."""
        batch = c // self.accumulation
        prefix = self.datasets.key_prefix(dataset)
        try:
            sample = self.sources[dataset].load(index, self.decoder)
        # the store failed, not the sample: skipping would change this run's batches
        except StorageError:
            raise
        except Exception as e:  # undecodable media, missing member: skip and count
            self._skip(e, {"__key__": prefix + (getattr(e, "sample_key", None) or f"#{index}")})
            return []
        sample.__key__ = prefix + sample.__key__
        excluder = self.exclusions
        if excluder is not None and self._exclude(excluder, batch, dataset, index, sample.__key__):
            return None  # replaced by its stand-in like a failed sample, but no failure
        name = self.datasets.entries[dataset].name
        sample.__subflavors__ = {**(sample.__subflavors__ or {}), "epoch": epoch, "dataset": name}
        try:
            return _as_list(self._encode(sample))
        except FatalSampleError:
            raise
        except Exception as e:
            self._skip(e, sample)
            return []

    def _exclude(self, excluder: Excluder, batch: int, dataset: int, index: int, key: str) -> bool:
        """Whether ``loader.exclude`` (``excluder``) skips the sample at global batch ``batch``;
        logged at info level once per dataset and global batch in this process (the trainer's log
        row counts them all: `TrainLoader.exclusion_stats`)."""
        rule = self._rule = excluder.rule(batch, dataset, index, key)
        if rule is not None:
            self._note_once(
                batch,
                dataset,
                "global batch %d: loader.exclude skips samples of %s, first %s "
                "(rule from step %d: %s)",
                key,
                rule.start,
                rule.describe(),
            )
        return rule is not None

    def _note_once(self, batch: int, dataset: int, message: str, *args: Any) -> None:
        """Log ``message % (batch, dataset name, *args)`` at info level, once per message, dataset and
        global batch in this process."""
        name = self.datasets.entries[dataset].name
        if self._excluded_logged[0] != batch:
            self._excluded_logged = (batch, set())
        if (message, name) not in self._excluded_logged[1]:
            self._excluded_logged[1].add((message, name))
            log.info(message, batch, name, *args)

    def _load_or_replace(
        self, c: int, dataset: int, epoch: int, index: int, room: int | None = None
    ) -> list:
        """The encoded sample, or, when it fails (counted by the skip policy), its first stand-in
        that loads (`DatasetOrder.replacement`): micro-batches stay full (fixed shapes for
        Megatron, CUDA graphs, compiled models), the same on every layout and every resume.
        ``room``: in a planned row, stand-ins must be at most this long (by the length index); when
        none of them fits, the row keeps its place empty (padding) and the sample is counted. A sample
        ``loader.exclude`` skips takes its stand-in the same way, but is no failure: no warning, not
        in `replaced` (the record of bad data)."""
        encoded = self._load_encoded(c, dataset, epoch, index)
        excluded = encoded is None  # not a failure: no warning, not in `replaced`
        if encoded:
            return encoded
        rule = self._rule if excluded else None
        if excluded:
            name = self.datasets.entries[dataset].name
            self.excluded[name] = self.excluded.get(name, 0) + 1
        loaded: list = []

        def loads(candidate: int) -> bool:
            loaded[:] = [self._load_encoded(c, dataset, epoch, candidate)]
            return bool(loaded[0])

        order = self.schedule.orders[dataset]
        fits = row_fits(self.planner, dataset, epoch, room)
        chosen = stand_in(order, epoch, index, loads, fits)
        if chosen is None:
            return self._without_stand_in(c, dataset, index, room, rule)
        encoded = loaded[0]
        if not excluded:
            self.replaced.append(
                {
                    "micro_batch": c,
                    "dataset": self.datasets.entries[dataset].name,
                    "failed_index": index,
                    "epoch": epoch,
                    "stand_in": chosen,
                    "key": getattr(encoded[0], "__key__", None),
                }
            )
            log.warning(
                "micro-batch %d: sample %d failed; replaced by sample %d (%s)",
                c,
                index,
                chosen,
                self.replaced[-1]["key"],
            )
        return encoded

    def _without_stand_in(
        self, c: int, dataset: int, index: int, room: int | None, rule: Any
    ) -> list:
        """No stand-in of a failed or excluded (``rule`` not None) sample loads and fits: in a planned
        row its positions stay padding (``[]``), counted and logged; elsewhere the micro-batch fails
        (one line naming the dataset, and a corrupt shard if one was read)."""
        name = self.datasets.entries[dataset].name
        if room is not None and rule is not None:  # not a failure: one line per dataset and batch
            self._padded_by.append(rule)
            self._note_once(
                c // self.accumulation,
                dataset,
                "global batch %d: loader.exclude leaves "
                "positions of %s as padding (no stand-in fits the row), first sample %d",
                index,
            )
            return []
        if room is not None:
            log.warning(
                "micro-batch %d: sample %d of dataset %r failed and no stand-in fits its row; "
                "its positions stay padding",
                c,
                index,
                name,
            )
            return []
        raise self.sources[dataset].samples_failed(
            f"micro-batch {c}: sample {index} of dataset {name!r} "
            + (
                f"is excluded by {_named(rule)} and its {MAX_REPLACEMENTS} stand-ins are excluded "
                f"or failed: the rule leaves (almost) nothing of the dataset; narrow it"
                if rule is not None
                else f"failed and {MAX_REPLACEMENTS} stand-ins failed or are excluded"
            )
        )

    def _pack(self, encoded: list, one_row: bool = False) -> list:
        """Packs of ``encoded``, chosen by the encoder (``one_row``: all of them, as planned)."""
        packs = []
        for selected in [encoded] if one_row else self.encoder.select_samples_to_pack(encoded):
            if self._postencode is not None:
                selected = [s for x in selected for s in _as_list(self._postencode(x))]
            packs.append(self.encoder.pack_selected_samples(selected))
        return packs

    def prefetch(self, c: int) -> None:
        """Start the storage reads of micro-batch ``c`` (object storage; a no-op on local disk)."""
        self._prefetch(self.schedule.items(*self.item_ids(c)))

    def _prefetch(self, items: list) -> None:
        for d, source in enumerate(self.sources):
            source.prefetch([idx for item in items for dd, _, idx in item if dd == d])

    def item_ids(self, c: int) -> tuple[int, Iterable[int]]:
        """``(global batch, item ids)`` of micro-batch ``c``."""
        batch, part = divmod(c, self.accumulation)
        first = self.items.start + part * self.micro_items
        return batch, range(first, first + self.micro_items)

    def __call__(self, c: int) -> Any:
        """Encoding runs with one intra-op thread, as in worker processes (the executors set 1 there):
        float kernels split work by thread count, so this keeps tensors bit-identical with 0 or N
        workers."""
        with single_intra_op_thread():
            return self._make(c)

    def planned_items(self, c: int) -> list[list[int]]:
        """With a planner: the stream positions of each row (packed) or sample of micro-batch ``c``."""
        batch, part = divmod(c, self.accumulation)
        plan = self.planner.plan(batch)
        dealt = deal_plan(plan, self.world_size, self.accumulation, fixed=self.planner.fixed_counts)
        return [plan.items[i] for i in dealt[self.rank][part]]

    def _make_planned(self, c: int) -> Any:
        # a planned run's encoder states its lengths (config_checks refused one that does not)
        encoder = cast(StatesLengths, self.encoder)
        items = [self.schedule.copies(positions) for positions in self.planned_items(c)]
        self._prefetch(items)
        samples, self._padded_by = [], []
        for item in items:
            docs = []
            for d, epoch, idx in item:
                planned = self.planner.length_of(d, epoch, idx)
                got = self._load_or_replace(
                    c, d, epoch, idx, room=planned.row if self.packing else None
                )
                for doc in got:
                    if self.packing and encoder.encoded_length(doc)[0] > planned.row:
                        raise RuntimeError(
                            f"micro-batch {c}: sample {getattr(doc, '__key__', idx)} encodes to "
                            f"{encoder.encoded_length(doc)[0]} positions, its length index says {planned.row}: "
                            f"{type(encoder).__name__}.sample_length is not exact"
                        )
                docs += got
            samples += self._pack(docs, one_row=True) if self.packing and docs else docs
        if not samples and self._padded_by:
            raise RuntimeError(
                f"micro-batch {c}: {_named(self._padded_by[0])} excludes every sample of it and no "
                f"stand-in fits: the rule leaves (almost) nothing of the dataset; narrow it"
            )
        if not samples:
            raise RuntimeError(f"micro-batch {c}: every sample failed; see the log")
        return self._batched(samples)

    def _make(self, c: int) -> Any:
        if self.planner is not None:
            return self._make_planned(c)
        batch, item_ids = self.item_ids(c)
        items = self.schedule.items(batch, item_ids)
        self._prefetch(items)
        samples = []
        for item in items:
            encoded = [e for d, epoch, idx in item for e in self._load_or_replace(c, d, epoch, idx)]
            samples += self._pack(encoded) if self.packing and encoded else encoded
        if not samples:
            raise RuntimeError(
                f"micro-batch {c} (global batch {batch}): every sample failed; see the log"
            )
        return self._batched(samples)

    def _batched(self, samples: list) -> Any:
        """The encoder's ``batch`` then ``encode_batch`` of ``samples`` (packs when packing)."""
        out = self.encoder.encode_batch(self.encoder.batch(samples))
        return next(out) if inspect.isgenerator(out) else out

    def encoded_at(self, positions: Iterable[int]) -> list:
        """The encoded documents of stream ``positions``, in order, as micro-batches hold them (a
        failed sample's stand-in, ``loader.exclude`` applied as in global batch 0), on one intra-op
        thread. For composing micro-batches other than the run's (`batch_of`)."""
        d, epoch, index = self.schedule.samples(list(positions))
        with single_intra_op_thread():
            return [
                doc
                for item in zip(d.tolist(), epoch.tolist(), index.tolist())
                for doc in self._load_or_replace(0, *item)
            ]

    def batch_of(self, docs: list) -> Any:
        """One micro-batch of encoded ``docs`` (`encoded_at`), made as this maker makes the run's:
        packed into rows by the encoder's own selection when the run packs; one intra-op thread."""
        if not docs:
            raise ValueError("a micro-batch needs at least one document")
        with single_intra_op_thread():
            return self._batched(self._pack(docs) if self.packing else list(docs))


def _named(rule: Any) -> str:
    """``loader.exclude``'s ``rule`` for a message: its step and what it lists."""
    return f"the loader.exclude rule from step {rule.start} ({rule.describe()})"
