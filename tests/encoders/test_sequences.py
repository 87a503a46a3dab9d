"""task_encoders.sequences: packing choices, row layout and cu_seqlens (pure tensor code)."""

import random

import pytest
import torch

from task_encoders.sequences import collate_rows, first_fit_decreasing, layout_row, pad_stack

PAD = 0


def doc(n, start=10):
    """[BOS=1, start, start+1, ..., EOS=2] of n tokens."""
    return torch.tensor([1, *range(start, start + n - 2), 2], dtype=torch.int64)


def test_first_fit_decreasing_fills_capacity_and_ignores_input_order():
    rng = random.Random(0)
    lengths = [rng.randint(2, 40) for _ in range(200)]
    keys = [f"k{i:03d}" for i in range(200)]
    packs = first_fit_decreasing(lengths, keys, capacity=64)
    assert sorted(i for p in packs for i in p) == list(range(200))
    assert all(sum(lengths[i] for i in p) <= 64 for p in packs)
    assert len(packs) <= -(-sum(lengths) // 64) + 2  # FFD is near optimal on small items
    perm = list(range(200))
    rng.shuffle(perm)
    shuffled = first_fit_decreasing(
        [lengths[i] for i in perm], [keys[i] for i in perm], capacity=64
    )
    assert [[keys[perm[i]] for i in p] for p in shuffled] == [[keys[i] for i in p] for p in packs]
    assert all(len(p) <= 3 for p in first_fit_decreasing(lengths, keys, capacity=64, max_docs=3))
    with pytest.raises(ValueError):
        first_fit_decreasing([65], ["big"], capacity=64)


def test_layout_row_targets_masks_and_positions():
    row = layout_row([doc(4, 10), doc(3, 20)], seq_len=10, pad_id=PAD)
    assert row["tokens"].tolist() == [1, 10, 11, 2, 1, 20, 2, 0, 0, 0]
    assert row["labels"].tolist() == [10, 11, 2, 0, 20, 2, 0, 0, 0, 0]
    # The last token of each document (its target would be the next BOS) and padding: no loss.
    assert row["loss_mask"].tolist() == [1, 1, 1, 0, 1, 1, 0, 0, 0, 0]
    # Positions restart per document; padding continues the last document's segment.
    assert row["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5]
    assert row["doc_lengths"].tolist() == [4, 3] and row["doc_lengths"].dtype == torch.int32
    with pytest.raises(ValueError):
        layout_row([doc(6), doc(6)], seq_len=10, pad_id=PAD)


def test_collate_rows_cu_seqlens_cover_every_token_and_match_positions():
    rows = [
        layout_row([doc(4), doc(3)], 10, PAD),
        layout_row([doc(10)], 10, PAD),
        layout_row([doc(2)], 10, PAD),
    ]
    batch = collate_rows(rows)
    assert (
        batch["cu_seqlens"].tolist() == [0, 4, 10, 20, 30]
        and batch["cu_seqlens"].dtype == torch.int32
    )
    assert batch["max_seqlen"] == 10
    assert batch["num_docs"].tolist() == [2, 1, 1] and batch["num_docs"].dtype == torch.int32
    assert batch["doc_lengths"].tolist() == [4, 3, 10, 2]
    positions = batch["position_ids"].flatten()
    starts = batch["cu_seqlens"][:-1].long()
    assert (positions[starts] == 0).all() and int((positions == 0).sum()) == len(starts)
    assert int(batch["loss_mask"].sum()) == sum(n - 1 for n in batch["doc_lengths"].tolist())
    assert {
        k: v.dtype for k, v in batch.items() if isinstance(v, torch.Tensor) and v.ndim == 2
    } == {
        "tokens": torch.int64,
        "labels": torch.int64,
        "loss_mask": torch.float32,
        "position_ids": torch.int64,
    }


def test_pad_stack_pads_last_dim_and_reports_lengths():
    out, lengths = pad_stack([torch.ones(2, 3), torch.ones(2, 5)])
    assert out.shape == (2, 2, 5) and lengths.tolist() == [3, 5] and lengths.dtype == torch.int64
    assert out[0, :, 3:].abs().sum() == 0


def test_layout_row_pads_each_document_to_the_segment_multiple():
    """Context parallel over 2 ranks: every segment a multiple of 4, the padding after each
    document loss-masked, ``doc_lengths`` unpadded."""
    rows = [
        layout_row([doc(5), doc(3), doc(2)], 16, PAD, multiple=4),
        layout_row([doc(9)], 16, PAD),
    ]
    batch = collate_rows(rows)
    assert batch["cu_seqlens"].tolist() == [0, 8, 12, 16, 32]
    assert batch["doc_lengths"].tolist() == [5, 3, 2, 9]
    assert batch["tokens"][0, :8].tolist() == doc(5).tolist() + [PAD] * 3
    assert batch["tokens"][0, 8:11].tolist() == doc(3).tolist()
    assert int(batch["loss_mask"].sum()) == sum(n - 1 for n in batch["doc_lengths"].tolist())
    assert batch["loss_mask"][0, 4:8].tolist() == [0.0] * 4
    with pytest.raises(ValueError):  # 8 + 8 + 4 positions padded
        layout_row([doc(5), doc(5), doc(2)], 16, PAD, multiple=4)
