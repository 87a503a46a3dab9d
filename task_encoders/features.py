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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: The cost features, in the order cost models store their coefficients.
FEATURES: tuple[str, ...] = (
    "samples",
    "llm_tokens",
    "llm_attention",
    "vision_tiles",
    "audio_frames",
    "points",
)

#: The model module each feature's cost is spent in (per-module cost statistics): the language
#: model (per sample, per position, attention), the vision tower, the audio encoder, the points one.
MODULES: dict[str, tuple[str, ...]] = {
    "llm": ("samples", "llm_tokens", "llm_attention"),
    "vision": ("vision_tiles",),
    "audio": ("audio_frames",),
    "points": ("points",),
}


def features(**values: float) -> dict[str, float]:
    """A full feature vector: every name of `FEATURES`, the ones not given 0.0; an unknown
    name is a ``KeyError`` naming it."""
    unknown = sorted(set(values) - set(FEATURES))
    if unknown:
        raise KeyError(f"unknown cost feature(s) {unknown}; known: {list(FEATURES)}")
    return {name: float(values.get(name, 0.0)) for name in FEATURES}


def text_features(length: int) -> dict[str, float]:
    """The language model's part of a document of ``length`` positions (one sample)."""
    return features(samples=1, llm_tokens=length, llm_attention=length * length)


def summed(vectors: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The element-wise sum of feature vectors (a batch's features from its documents'); a full
    vector. An unknown name is a ``KeyError`` naming it (`features`)."""
    total = features()
    for vector in vectors:
        for name, value in features(**vector).items():
            total[name] += value
    return total
