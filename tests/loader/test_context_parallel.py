"""Context parallel, the loader's part: rows laid out with every document padded to ``2N``
positions split into equal causal attention work on each of the ``N`` CP ranks (the load-balanced
chunks ``r`` and ``2N - 1 - r`` of each segment); ``loader.context_parallel: 2`` gives a loader
whose every segment is a multiple of 4 with loss-masked padding, planned as encoded, resumed
exactly, and refuses the encoders and values it cannot serve."""

from __future__ import annotations

import json
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
#: Text documents of the embedded corpus (about 50 to 110 tokens) packed into rows of 256.
PACKED_TEXT = {
    "encoder": "text",
    "text": {"seq_len": 256},
    "packing": {"enabled": True, "buffer_size": 8},
}


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    from scripts.bench.data import text_dataset

    base = tmp_path_factory.mktemp("context_parallel")
    return base, text_dataset(base)


def _config(base, data, encoder=None, **loader):
    from energon_platform import load_config

    return load_config(
        {
            "data": {"path": str(data), "val_split": None},
            "encoder": encoder or PACKED_TEXT,
            "loader": {
                "global_batch_size": 4,
                "micro_batch_size": 2,
                "num_workers": 0,
                "seed": 5,
                "length_cache": str(base / "lengths"),
                **loader,
            },
        }
    )


def _loader(base, data, **loader):
    from energon_platform import TrainLoader

    return TrainLoader(_config(base, data, **loader), num_workers=0)


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


def _check_padded_rows(batch, multiple: int, pad: int) -> list[int]:
    """Every segment of every row is a multiple of ``multiple``; each document's padding (its
    last token and the positions after it up to its padded length) is loss-masked and holds
    ``pad``. Returns each row's padded document positions (what the planner plans)."""
    used, first = [], 0
    for row, n in enumerate(batch.num_docs.tolist()):
        segments = row_segments(batch.position_ids[row])
        assert all(s % multiple == 0 for s in segments), segments
        lengths = batch.doc_lengths[first : first + n].tolist()
        start = 0
        for length in lengths:
            end = start + padded_length(length, multiple)
            assert batch.loss_mask[row, start + length - 1 : end].sum() == 0
            assert batch.loss_mask[row, start : start + length - 1].all()
            assert (batch.tokens[row, start + length : end] == pad).all()
            start = end
        used.append(start)
        first += n
    return used


@pytest.mark.parametrize("balance", ["tokens", "none"])
def test_a_context_parallel_2_loader_pads_every_segment_to_4_and_plans_what_it_encodes(
    text_data, balance
):
    base, data = text_data
    loader = _loader(base, data, balance=balance, context_parallel=2)
    pad = loader.encoder.tokenizer.special.pad
    padded_docs = 0
    for b in range(2):
        used = []
        for _ in range(loader.accumulation):
            batch = next(loader)
            used += _check_padded_rows(batch, 4, pad)
            padded_docs += sum(n % 4 != 0 for n in batch.doc_lengths.tolist())
        if loader.plan.batching.planned:
            assert sorted(used) == sorted(loader.plan.planner.plan(b).used)
    loader.close()
    assert padded_docs, "no document needed padding: the check above proved nothing"


def test_a_context_parallel_run_resumes_exactly_and_only_with_the_same_setting(text_data):
    from energon_platform.loader.state import StateMismatchError

    base, data = text_data
    loader = _loader(base, data, balance="attention", context_parallel=2)
    for _ in range(3):
        next(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [next(loader) for _ in range(3)]
    loader.close()
    assert state["fingerprint"]["context_parallel"] == 2
    resumed = _loader(base, data, balance="attention", context_parallel=2)
    resumed.load_state_dict(state)
    for want in expected:
        got = next(resumed)
        assert got.keys == want.keys
        for name in ("tokens", "position_ids", "loss_mask", "cu_seqlens"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    resumed.close()
    without = _loader(base, data, balance="attention")
    assert "context_parallel" not in without.plan.fingerprint
    with pytest.raises(StateMismatchError, match="context_parallel"):
        without.load_state_dict(state)
    without.close()


@pytest.mark.parametrize(
    "value, encoder, message",
    [
        (0, None, "loader.context_parallel: got 0"),
        (True, None, "loader.context_parallel"),
        (2, {**PACKED_TEXT, "packing": {"enabled": False}}, "2: TextTaskEncoder does not pack"),
        (3, {**PACKED_TEXT, "text": {"seq_len": 256}}, "seq_len 256 is not a multiple of 6"),
        (2, {**PACKED_TEXT, "text": {"seq_len": 258}}, "seq_len 258 is not a multiple of 4"),
        (2, "configs/encoders/image_text_vlm_small_packed.yaml", "cannot pad its documents"),
    ],
)
def test_context_parallel_refusals_name_the_key(tmp_path, value, encoder, message):
    from energon_platform.loader.run_plan import build_encoder
    from task_encoders.config_parser import ConfigError
    from tests.helpers import REPO

    if isinstance(encoder, str):
        encoder = str(REPO / encoder)
    with pytest.raises(ConfigError, match=message) as refused:
        build_encoder(_config(tmp_path, tmp_path, encoder, context_parallel=value))
    assert "loader.context_parallel" in str(refused.value)
    assert "\n" not in str(refused.value)
