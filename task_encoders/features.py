"""Cost features: what a sample makes each module of a model spend, known before decoding.

A sample's cost to a multimodal model is not one number: the vision tower runs once per tile, the
audio encoder once per frame, the language model once per position (linear and quadratic terms).
Every encoder states, for a sample, a small named vector over `FEATURES`:

* ``samples``: 1 per sample (a constant per-sample cost);
* ``llm_tokens``: positions the language model sees for the sample (its row length, L: text tokens
  plus the image embedding positions spliced in for the placeholders, where an encoder splices);
* ``llm_attention``: L², the causal attention term (documents are masked to themselves);
* ``vision_tiles``: what goes through the vision tower: tiles, or whole images and video frames
  where the encoder does not tile;
* ``audio_frames``: frames through the audio encoder: log-mel feature frames, or waveform samples
  for an encoder that feeds the waveform itself;
* ``points``: points through the point-cloud encoder.

The contract, per encoder (the same three views of one sample must agree exactly):

* ``sample_features(facts, key, epoch) -> dict``: from the length index's facts (no decoding);
* ``encoded_features(doc) -> dict``: from the encoded document;
* ``batch_features(batch) -> dict``: the sum over the documents a batch holds, read from the
  batch's tensors (what a micro-batch costs, for timing a model in ``calibrate``).

A feature an encoder does not produce is 0. Values are floats >= 0 (integers, exact as floats).
The shared logic is `task_encoders.documents.DocumentTaskEncoder`'s; a modality states only
its media's part (see there).

A micro-batch's cost is not always the sum of its samples'. A model pads the rows of an unpacked
micro-batch to one width and the clips to the longest, and runs each tower once per micro-batch
that has any of its media. `micro_batch_features` states a micro-batch *as it runs*, over
`MICRO_BATCH_FEATURES` (`FEATURES` plus ``vision_calls`` and ``audio_calls``: 1 when a tower runs
at all), from its samples' vectors; `Shape` is the same, grown one sample at a time (what a
planner weighing where a sample goes asks for, many times per global batch).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: The cost features, in the order cost models store their coefficients.
FEATURES: tuple[str, ...] = (
    "samples",
    "llm_tokens",
    "llm_attention",
    "vision_tiles",
    "audio_frames",
    "points",
)

#: What a micro-batch costs besides its samples' features: 1 when the vision tower (any tile) or
#: the audio encoder (any frame) runs at all, its fixed cost per call.
CALL_FEATURES: tuple[str, ...] = ("vision_calls", "audio_calls")
#: A micro-batch's features as it runs (`micro_batch_features`), in the order cost files store them.
MICRO_BATCH_FEATURES: tuple[str, ...] = FEATURES + CALL_FEATURES

#: The model module each feature's cost is spent in (per-module cost statistics): the language
#: model (per sample, per position, attention), the vision tower, the audio encoder, the points one.
MODULES: dict[str, tuple[str, ...]] = {
    "llm": ("samples", "llm_tokens", "llm_attention"),
    "vision": ("vision_tiles", "vision_calls"),
    "audio": ("audio_frames", "audio_calls"),
    "points": ("points",),
}

#: ``width`` of a micro-batch whose rows are padded to its longest sample (`micro_batch_features`)
LONGEST = "longest"


_KNOWN = frozenset(FEATURES)


def features(**values: float) -> dict[str, float]:
    """A full feature vector: every name of `FEATURES`, the ones not given 0.0; an unknown
    name is a ``KeyError`` naming it."""
    _check_names(values)
    return {name: float(values.get(name, 0.0)) for name in FEATURES}


def _check_names(vector: Mapping[str, float]) -> None:
    """``KeyError`` naming the names of ``vector`` that are not cost features."""
    if not vector.keys() <= _KNOWN:
        unknown = sorted(set(vector) - _KNOWN)
        raise KeyError(f"unknown cost feature(s) {unknown}; known: {list(FEATURES)}")


def text_features(length: int) -> dict[str, float]:
    """The language model's part of a document of ``length`` positions (one sample)."""
    return features(samples=1, llm_tokens=length, llm_attention=length * length)


def summed(vectors: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The element-wise sum of feature vectors (a batch's features from its documents'); a full
    vector. An unknown name is a ``KeyError`` naming it (`features`)."""
    total = dict.fromkeys(FEATURES, 0.0)
    for vector in vectors:
        _check_names(vector)
        for name, value in vector.items():  # a name it leaves out adds 0.0: the same sums
            total[name] += float(value)
    return total


class Shape(tuple):
    """What a micro-batch's cost depends on, grown one sample at a time (`grow`): samples, the
    sums of tokens, attention, tiles, frames and points, the longest sample, clips (samples with
    frames) and the longest clip. A tuple (hashable, cheap); `EMPTY` holds nothing. Grown by a
    vector that is already a sum of several samples' (a packed micro-batch's ``batch_features``),
    it counts their ``samples``, which is all ``as_run(None)`` reads of it."""

    __slots__ = ()

    def grow(self, work: tuple[float, ...]) -> Shape:
        """This shape with one more sample of ``work`` (its features in `FEATURES` order)."""
        n, tokens, attention, tiles, frames, points, longest, clips, longest_clip = self
        s, t, a, v, f, p = work
        return Shape(
            (
                n + s,
                tokens + t,
                attention + a,
                tiles + v,
                frames + f,
                points + p,
                max(longest, t),
                clips + (f > 0),
                max(longest_clip, f),
            )
        )

    def as_run(self, width: int | str | None) -> tuple[float, ...]:
        """The micro-batch's features as it runs, in `MICRO_BATCH_FEATURES` order. ``width``: how
        its rows are laid out. ``None``: the documents' own positions (packed rows, or a model
        that runs every document at its length): tokens and attention are the sums. `LONGEST`:
        every row padded to the longest sample (``n·W`` positions, ``n·W²`` attention). An
        integer ``S``: every row padded to ``S`` positions. Clips are padded to the longest clip
        (``clips x longest`` frames) where rows are padded; tiles and points are their sums."""
        n, tokens, attention, tiles, frames, points, longest, clips, longest_clip = self
        if width is not None:
            w = longest if width == LONGEST else width
            tokens, attention, frames = n * w, n * w * w, clips * longest_clip
        return (
            float(n),
            float(tokens),
            float(attention),
            float(tiles),
            float(frames),
            float(points),
            float(tiles > 0),
            float(clips > 0),
        )

    def named(self, width: int | str | None) -> dict[str, float]:
        """`as_run`, by name over `MICRO_BATCH_FEATURES`."""
        return dict(zip(MICRO_BATCH_FEATURES, self.as_run(width), strict=True))


#: The shape of a micro-batch without samples.
EMPTY = Shape((0,) * 9)

_TILES, _FRAMES = FEATURES.index("vision_tiles"), FEATURES.index("audio_frames")


def towers(work: tuple[float, ...]) -> tuple[bool, ...]:
    """The towers besides the language model that a sample of ``work`` (its features in
    `FEATURES` order) runs, in `CALL_FEATURES` order: the calls of a micro-batch of it alone
    (`Shape.as_run`). Samples of one pattern can share micro-batches without adding a call."""
    return (work[_TILES] > 0, work[_FRAMES] > 0)


def shape_of(vectors: Iterable[Mapping[str, float]]) -> Shape:
    """The `Shape` of a micro-batch of samples with these feature vectors."""
    shape = EMPTY
    for vector in vectors:
        full = features(**vector)
        shape = shape.grow(tuple(full[name] for name in FEATURES))
    return shape


def micro_batch_features(
    vectors: Iterable[Mapping[str, float]], width: int | str | None = None
) -> dict[str, float]:
    """A micro-batch of samples with these feature vectors as it runs (`Shape.as_run` with
    ``width``), by name over `MICRO_BATCH_FEATURES`."""
    return shape_of(vectors).named(width)


@functools.cache
def _takes_lengths(function: Callable) -> bool:
    return "lengths" in inspect.signature(function).parameters


def with_lengths(method: Callable, facts: tuple, key: str, epoch: int, lengths: Any) -> Any:
    """``method(facts, key, epoch, lengths=lengths)`` (an encoder's ``sample_features`` or
    ``fact_media_features``, handed the sample's `sample_length` so that it is not derived
    again), or ``method(facts, key, epoch)`` where the method's signature leaves ``lengths`` out:
    an encoder written before it was added keeps working."""
    if _takes_lengths(getattr(method, "__func__", method)):
        return method(facts, key, epoch, lengths=lengths)
    return method(facts, key, epoch)
