"""What a task encoder can do beyond Energon's hooks, as `typing.Protocol`s.

Energon asks every task encoder for the same hooks (``encode_sample``, ``batch``, ...). The loader
asks for more only where the run config does, and each such ability is one protocol here; the
encoders implement them (`task_encoders.documents.DocumentTaskEncoder` and its subclasses all
of them but `CostsItself`), a user's encoder any it likes:

================  =====================================================  ==========================
ability           members                                                asked for by
================  =====================================================  ==========================
`StatesFacts`     ``facts_width``, ``sample_facts``                      the length index
`StatesLengths`   `StatesFacts` + ``sample_length``, ``encoded_length``,  ``loader.balance``
                  ``seq_len``
`StatesFeatures`  ``sample_features``                                    ``balance: measured``
`MeasuresBatches` ``encoded_features``, ``batch_features``               ``calibrate``
`CostsItself`     ``balance_cost``                                       ``balance: encoder``
`Packs`           ``packing_buffer_size``, ``seq_len``,                  packing
                  ``select_samples_to_pack``, ``pack_selected_samples``
`PadsSegments`    ``pads_segments``, ``segment_multiple``                ``loader.context_parallel``
================  =====================================================  ==========================

Each is ``runtime_checkable``: ``isinstance(encoder, StatesLengths)`` says whether the members
are there (and narrows the type); `missing` names the ones an encoder lacks, as a refusal names
them (`energon_platform.config_checks` checks a run's encoder once, when the run is built).
Whether an encoder packs or pads is a value, not only a member: `packing_buffer` and
`pads_segments`.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, TypeGuard, runtime_checkable


@runtime_checkable
class StatesFacts(Protocol):
    """Facts a sample's lengths follow from, read without decoding (the length index's rows).

    ``sample_facts(light)``: ``facts_width`` ints >= 0 from a light sample (media parts as
    file bytes), independent of the epoch (contract: `task_encoders.documents`)."""

    @property
    def facts_width(self) -> int: ...

    def sample_facts(self, sample: Any) -> tuple[int, ...]: ...


@runtime_checkable
class StatesLengths(StatesFacts, Protocol):
    """A sample's ``(row_length, work_length)`` at an epoch from its facts, equal to what its
    encoding takes (``encoded_length``); rows of at most ``seq_len`` positions."""

    @property
    def seq_len(self) -> int: ...

    def sample_length(self, facts: tuple[int, ...], key: str, epoch: int) -> tuple[int, int]: ...

    def encoded_length(self, doc: Any) -> tuple[int, int]: ...


@runtime_checkable
class StatesFeatures(Protocol):
    """A sample's cost features (`task_encoders.features.FEATURES`) from its facts, key and epoch,
    without decoding (``lengths``: its `StatesLengths.sample_length` where the caller has it; an
    encoder may leave it out of its signature, `task_encoders.features.with_lengths`)."""

    def sample_features(self, facts: tuple[int, ...], key: str, epoch: int) -> dict[str, float]: ...


@runtime_checkable
class MeasuresBatches(Protocol):
    """The cost features of what was encoded: of one encoded document and summed over a batch,
    read from its tensors (equal to `StatesFeatures.sample_features` of the same samples)."""

    def encoded_features(self, doc: Any) -> dict[str, float]: ...

    def batch_features(self, batch: Any) -> dict[str, float]: ...


@runtime_checkable
class CostsItself(Protocol):
    """The encoder's own cost of a sample of work length ``length``: a finite number >= 0."""

    def balance_cost(self, length: int) -> float: ...


@runtime_checkable
class Packs(Protocol):
    """Documents packed into rows of ``seq_len``: Energon's packing hooks, and the buffer Energon
    packs from (``packing_buffer_size``: None where the encoder's config turns packing off)."""

    @property
    def packing_buffer_size(self) -> int | None: ...

    @property
    def seq_len(self) -> int: ...

    def select_samples_to_pack(self, samples: list[Any]) -> list[list[Any]]: ...

    def pack_selected_samples(self, samples: list[Any]) -> Any: ...


@runtime_checkable
class PadsSegments(Protocol):
    """Every document's segment padded to a multiple of ``segment_multiple`` in a packed row (``2N``
    for ``N`` context-parallel ranks, set by the loader); ``pads_segments``: whether that is exact
    (the row lengths are the row's token positions)."""

    @property
    def pads_segments(self) -> bool: ...

    segment_multiple: int


def members(ability: type) -> tuple[str, ...]:
    """The names ``ability`` (a protocol of this module) asks for, its bases' first."""
    names: dict[str, None] = {}
    for cls in reversed(ability.__mro__):
        if cls is object or cls is Protocol or Protocol not in cls.__bases__:
            continue
        for name in [*vars(cls), *vars(cls).get("__annotations__", {})]:
            if not name.startswith("_"):
                names[name] = None
    return tuple(names)


def missing(encoder: object, ability: type) -> tuple[str, ...]:
    """The members of ``ability`` that ``encoder`` lacks, each as a refusal names it: a method
    with its parameters (``balance_cost(length)``), an attribute by its name. A method the encoder
    has as something not callable is missing."""
    gone = []
    for name in members(ability):
        declared = inspect.getattr_static(ability, name, None)
        found = getattr(encoder, name, _ABSENT)
        if found is _ABSENT or (inspect.isfunction(declared) and not callable(found)):
            gone.append(_described(name, declared))
    return tuple(gone)


def packing_buffer(encoder: object) -> int | None:
    """The encoder's packing buffer (`Packs.packing_buffer_size`), None where it does not pack."""
    return encoder.packing_buffer_size if isinstance(encoder, Packs) else None


def packs(encoder: object) -> TypeGuard[Packs]:
    """Whether ``encoder`` packs (a `Packs` whose config turns packing on)."""
    return packing_buffer(encoder) is not None


def pads_segments(encoder: object) -> TypeGuard[PadsSegments]:
    """Whether ``encoder`` pads every segment exactly to its ``segment_multiple``."""
    return isinstance(encoder, PadsSegments) and bool(encoder.pads_segments)


def segment_multiple(encoder: object) -> int:
    """The multiple the encoder pads segments to (1 for one that does not pad)."""
    return encoder.segment_multiple if isinstance(encoder, PadsSegments) else 1


_ABSENT = object()


def _described(name: str, declared: Any) -> str:
    """``name(parameters)`` for a method (``self`` left out), else ``name``."""
    if not inspect.isfunction(declared):
        return name
    params = list(inspect.signature(declared).parameters.values())[1:]
    return f"{name}({', '.join(p.name for p in params)})"
