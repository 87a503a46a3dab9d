"""Context parallel, the loader's part: rows laid out with every document padded to ``2N``
positions split into equal causal attention work on each of the ``N`` CP ranks (the load-balanced
chunks ``r`` and ``2N - 1 - r`` of each segment)."""

from __future__ import annotations

import random

import pytest
import torch

from energon_platform.loader.context_parallel import (
    chunk_attention_work,
    rank_attention_work,
    rank_chunks,
    segment_multiple,
)
from task_encoders.sequences import (
    first_fit_decreasing,
    layout_row,
    padded_length,
    row_segments,
)

SEQ_LEN = 96


def _rows(cp: int, seed: int) -> list[dict]:
    """Random documents packed into rows of SEQ_LEN with the segment multiple of ``cp`` ranks."""
    rng = random.Random(seed)
    multiple = segment_multiple(cp)
    docs = [torch.arange(rng.randint(2, 60)) + 3 for _ in range(40)]
    padded = [padded_length(int(d.numel()), multiple) for d in docs]
    packs = first_fit_decreasing(padded, [f"k{i:02d}" for i in range(len(docs))], SEQ_LEN)
    return [layout_row([docs[i] for i in p], SEQ_LEN, 0, multiple=multiple) for p in packs]


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_every_segment_is_a_multiple_of_2n_and_each_rank_gets_equal_attention_work(cp):
    for seed in range(5):
        for row in _rows(cp, seed):
            segments = row_segments(row["position_ids"])
            assert all(s % (2 * cp) == 0 for s in segments), segments
            work = rank_attention_work(segments, cp)
            assert max(work) == min(work), (segments, work)


def test_the_ranks_hold_every_chunk_once_and_work_sums_to_causal_attention():
    for cp in (1, 2, 4):
        chunks = sorted(c for pair in rank_chunks(cp) for c in pair)
        assert chunks == list(range(2 * cp))
    segment = 48
    total = sum(chunk_attention_work(segment, 8, c) for c in range(8))
    assert total == segment * (segment + 1) // 2
    with pytest.raises(ValueError, match="does not split into 8 chunks"):
        chunk_attention_work(50, 8, 0)


def test_without_the_multiple_a_document_does_not_split_into_chunks():
    row = layout_row([torch.arange(7) + 3, torch.arange(5) + 3], 16, 0)
    with pytest.raises(ValueError):
        rank_attention_work(row_segments(row["position_ids"]), 2)
