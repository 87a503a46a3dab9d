"""Context parallelism, the loader's part: which positions of a packed row each CP rank attends for.

The layout assumed is the load-balanced one of Megatron-LM with TransformerEngine's
context-parallel attention (``--context-parallel-size N``; the ``cp_comm_type`` does not change
it): every attention segment of a row (a document, ``cu_seqlens_padded``) is split into ``2N``
equal chunks, and CP rank ``r`` holds chunks ``r`` and ``2N - 1 - r`` of each. Under causal
attention chunk ``c`` of ``s`` positions attends to ``s·c·s + s(s+1)/2`` (query, key) pairs, so the
two chunks of a rank sum to the same work on every rank: each segment must therefore be a multiple
of ``2N`` positions (`task_encoders.sequences.padded_length`, ``multiple = 2N``).

``loader.context_parallel: N`` sets that multiple on the run's encoder (`apply_context_parallel`):
its packing pads every document's segment, and the planner plans the padded lengths
(`SampleLengths`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from task_encoders.abilities import pads_segments

if TYPE_CHECKING:
    from energon_platform.config import RunConfig


def segment_multiple(context_parallel: int) -> int:
    """The multiple every attention segment is padded to for ``context_parallel`` ranks (``2N``;
    1 without context parallelism)."""
    return 2 * context_parallel if context_parallel > 1 else 1


def rank_chunks(context_parallel: int) -> list[tuple[int, int]]:
    """Per CP rank ``r``, the two chunks of each segment it holds: ``(r, 2N - 1 - r)``."""
    last = 2 * context_parallel - 1
    return [(r, last - r) for r in range(context_parallel)]


def chunk_attention_work(segment: int, chunks: int, chunk: int) -> int:
    """Causal (query, key) pairs of chunk ``chunk`` of a segment of ``segment`` positions cut into
    ``chunks`` equal chunks (``segment`` a multiple of ``chunks``; a ``ValueError`` otherwise)."""
    if segment % chunks:
        raise ValueError(f"a segment of {segment} positions does not split into {chunks} chunks")
    size = segment // chunks
    return size * chunk * size + size * (size + 1) // 2


def rank_attention_work(segments: Sequence[int], context_parallel: int) -> list[int]:
    """Per CP rank, the causal attention work of its chunks of a row's ``segments``."""
    chunks = 2 * context_parallel
    return [
        sum(
            chunk_attention_work(s, chunks, a) + chunk_attention_work(s, chunks, b)
            for s in segments
        )
        for a, b in rank_chunks(context_parallel)
    ]


def apply_context_parallel(cfg: RunConfig, encoder: object) -> None:
    """Give ``encoder`` the segment multiple of ``cfg.loader.context_parallel`` (nothing for 1);
    `energon_platform.config_checks.check_with_encoder` has refused an encoder that cannot pad
    for it (`task_encoders.abilities.PadsSegments`; a `TypeError` for one it has not seen)."""
    n = cfg.loader.context_parallel
    if n == 1:
        return
    if not pads_segments(encoder):
        raise TypeError(f"{type(encoder).__name__} cannot pad its segments for context parallelism")
    encoder.segment_multiple = segment_multiple(n)
