"""TextTaskEncoder: packing through Energon, cu_seqlens consistency, and restore of packed state."""

import itertools

import torch
from megatron.energon import TextSample, get_savable_loader, get_train_dataset

from task_encoders.documents import TextBatch


def train_loader(encoder, path, batch_size=2, shuffle=None):
    dataset = get_train_dataset(
        path,
        worker_config=encoder.worker_config(),
        batch_size=batch_size,
        shuffle_buffer_size=shuffle,
        max_samples_per_sequence=None,
        task_encoder=encoder,
        packing_buffer_size=encoder.packing_buffer_size,
    )
    return get_savable_loader(dataset)


def assert_consistent(batch, seq_len, pad_id):
    n = batch.tokens.shape[0]
    cu = batch.cu_seqlens.long()
    assert batch.cu_seqlens.dtype == torch.int32 and cu[0] == 0 and cu[-1] == n * seq_len
    assert len(cu) == len(batch.keys) + 1 == int(batch.num_docs.sum()) + 1
    segments = cu.diff()
    assert batch.max_seqlen == int(segments.max())
    # Each segment lies in one row and holds its document (doc_lengths <= segment).
    row_of = torch.repeat_interleave(torch.arange(n), batch.num_docs.long())
    assert ((cu[:-1] // seq_len) == row_of).all() and (batch.doc_lengths.long() <= segments).all()
    positions, tokens = batch.position_ids.flatten(), batch.tokens.flatten()
    labels, mask = batch.labels.flatten(), batch.loss_mask.flatten()
    for start, length, segment in zip(
        cu[:-1].tolist(), batch.doc_lengths.tolist(), segments.tolist()
    ):
        assert torch.equal(positions[start : start + segment], torch.arange(segment))
        assert torch.equal(labels[start : start + length - 1], tokens[start + 1 : start + length])
        assert (
            mask[start : start + length - 1].all()
            and not mask[start + length - 1 : start + segment].any()
        )
        assert (tokens[start + length : start + segment] == pad_id).all()


def test_packed_rows_are_consistent_and_hold_every_document_once(
    make_encoder, image_text_shards, one_pass
):
    encoder = make_encoder("text", text={"seq_len": 40}, packing={"buffer_size": 10})
    batches = one_pass(encoder, image_text_shards, batch_size=2)
    assert all(isinstance(b, TextBatch) and b.tokens.shape[1] == 40 for b in batches)
    for batch in batches:
        assert_consistent(batch, 40, encoder.tokenizer.special.pad)
    keys = [k for b in batches for k in b.keys]
    assert sorted(keys) == [f"{i:012d}" for i in range(24)]
    assert sum(b.tokens.shape[0] for b in batches) < 24  # several documents share rows


def test_unpacked_text_is_one_document_per_row(make_encoder, image_text_shards, one_pass):
    encoder = make_encoder("text", packing={"enabled": False})
    batch = one_pass(encoder, image_text_shards, batch_size=3)[0]
    assert batch.num_docs.tolist() == [1, 1, 1] and batch.tokens.shape == (3, 32)
    assert_consistent(batch, 32, encoder.tokenizer.special.pad)


def test_text_sample_input_and_truncation_keeps_eos(make_encoder):
    encoder = make_encoder("text", text={"seq_len": 6})
    doc = encoder.encode_sample(
        TextSample(__key__="shard/doc-1", __restore_key__=(), text="one two three four five six")
    )
    special = encoder.tokenizer.special
    assert doc.tokens.dtype == torch.int64 and len(doc.tokens) == 6
    assert doc.tokens[0] == special.bos and doc.tokens[-1] == special.eos


def test_restoring_a_saved_packing_state_continues_with_identical_batches(
    make_encoder, image_text_shards, doc_digests
):
    encoder = make_encoder(
        "image_text", text={"seq_len": 48}, packing={"enabled": True, "buffer_size": 10}
    )
    loader = train_loader(encoder, image_text_shards, shuffle=6)
    it = iter(loader)
    list(itertools.islice(it, 3))
    state = loader.save_state_rank()
    expected = [doc_digests(b) for b in itertools.islice(it, 4)]
    resumed = train_loader(encoder, image_text_shards, shuffle=6)
    resumed.restore_state_rank(state)
    assert [doc_digests(b) for b in itertools.islice(iter(resumed), 4)] == expected


def test_text_encoder_leaves_media_undecoded(make_encoder):
    decoder = make_encoder("text").decoder
    png = b"\x89PNG\r\n\x1a\n not decoded"
    assert decoder.decode("k.image.png", png) == png
    assert decoder.decode("k.text.json", b'{"caption": "hi"}') == {"caption": "hi"}
