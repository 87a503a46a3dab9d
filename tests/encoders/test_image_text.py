"""ImageTextTaskEncoder through Energon's loader: shapes, dtypes, masks, tokens, seeding, packing."""

import dataclasses

import pytest
import torch
from megatron.energon import get_savable_loader, get_train_dataset

from task_encoders.image_text import ImageTextBatch


def test_batch_fields_shapes_dtypes_and_masks(
    image_text_encoder, image_text_shards, one_pass, caption_of
):
    batches = one_pass(image_text_encoder, image_text_shards, batch_size=5)
    assert [len(b.keys) for b in batches] == [5, 5, 5, 5, 4]
    batch = batches[0]
    assert isinstance(batch, ImageTextBatch) and batch.keys == batch.__key__
    n, s = 5, image_text_encoder.seq_len
    assert batch.images.shape == (n, 3, 16, 16) and batch.images.dtype == torch.float32
    for name in ("tokens", "labels", "position_ids"):
        assert getattr(batch, name).shape == (n, s) and getattr(batch, name).dtype == torch.int64
    assert batch.loss_mask.shape == (n, s) and batch.loss_mask.dtype == torch.float32
    assert (
        batch.cu_seqlens.tolist() == [i * s for i in range(n + 1)]
        and batch.cu_seqlens.dtype == torch.int32
    )
    assert batch.num_docs.tolist() == [1] * n and batch.max_seqlen == s
    special = image_text_encoder.tokenizer.special
    for i, key in enumerate(batch.keys):
        length = int(batch.doc_lengths[i])
        row = batch.tokens[i]
        assert (
            row[0] == special.bos
            and row[length - 1] == special.eos
            and (row[length:] == special.pad).all()
        )
        assert torch.equal(batch.labels[i, : length - 1], row[1:length])
        assert batch.loss_mask[i].sum() == length - 1 and batch.loss_mask[i, : length - 1].all()
        assert torch.equal(batch.position_ids[i], torch.arange(s))
        # token round trip
        assert image_text_encoder.tokenizer.decode(row[:length]) == caption_of(key)


def test_all_samples_seen_once_and_every_map_function_is_stateless(
    image_text_encoder, image_text_shards, one_pass
):
    keys = [k for b in one_pass(image_text_encoder, image_text_shards) for k in b.keys]
    assert sorted(keys) == [f"{i:012d}" for i in range(24)]
    for hook in ("encode_sample", "batch", "pack_selected_samples"):
        assert getattr(getattr(image_text_encoder, hook), "__stateless__", False), hook


@pytest.mark.parametrize("world_size, num_workers", [(1, 1), (1, 2), (2, 1)])
def test_augmented_tensors_per_key_do_not_depend_on_the_layout(
    image_text_encoder, image_text_shards, one_pass, doc_digests, world_size, num_workers
):
    def digests(world_size, workers):
        return {
            k: v
            for rank in range(world_size)
            for b in one_pass(
                image_text_encoder,
                image_text_shards,
                num_workers=workers,
                rank=rank,
                world_size=world_size,
            )
            for k, v in doc_digests(b).items()
        }

    reference = digests(1, 0)
    assert len(reference) == 24 and digests(world_size, num_workers) == reference


def test_augmentation_depends_on_seed_and_epoch_only(make_encoder, raw_samples):
    samples = raw_samples("image_text")[:4]
    encoder, other_seed = make_encoder("image_text"), make_encoder("image_text", seed=99)

    def images(enc, epoch=None):
        out = []
        for s in samples:
            if epoch is not None:
                s = dataclasses.replace(s, __subflavors__={"epoch": epoch})
            out.append(enc.encode_sample(s).media["image"])
        return out

    epoch0 = images(encoder)
    assert all(torch.equal(a, b) for a, b in zip(epoch0, images(encoder)))
    assert all(torch.equal(a, b) for a, b in zip(epoch0, images(encoder, epoch=0)))
    assert all(not torch.equal(a, b) for a, b in zip(epoch0, images(encoder, epoch=1)))
    assert all(not torch.equal(a, b) for a, b in zip(epoch0, images(other_seed)))
    # Evaluation transforms: deterministic, the same in every epoch.
    evaluation = make_encoder("image_text", training=False)
    assert all(
        torch.equal(a, b) for a, b in zip(images(evaluation, epoch=0), images(evaluation, epoch=5))
    )


def test_epoch_subflavor_from_a_metadataset_changes_augmentation(
    image_text_encoder, image_text_shards, tmp_path, one_pass, doc_digests
):
    meta = tmp_path / "epoch1.yaml"
    meta.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n"
        f"    path: {image_text_shards}\n    subflavors:\n      epoch: 1\n"
    )
    plain = {
        k: v
        for b in one_pass(image_text_encoder, image_text_shards)
        for k, v in doc_digests(b).items()
    }
    epoch1 = {k: v for b in one_pass(image_text_encoder, meta) for k, v in doc_digests(b).items()}
    assert plain.keys() == epoch1.keys() and all(plain[k] != epoch1[k] for k in plain)


def test_packed_image_text_rows(make_encoder, image_text_shards):
    encoder = make_encoder(
        "image_text",
        text={"seq_len": 48},
        packing={"enabled": True, "buffer_size": 12, "max_docs": 4},
    )
    dataset = get_train_dataset(
        image_text_shards,
        worker_config=encoder.worker_config(),
        batch_size=2,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        task_encoder=encoder,
        packing_buffer_size=encoder.packing_buffer_size,
    )
    batch = next(iter(get_savable_loader(dataset)))
    docs = int(batch.num_docs.sum())
    assert (
        batch.tokens.shape == (2, 48)
        and docs > 2
        and all(1 <= n <= 4 for n in batch.num_docs.tolist())
    )
    assert batch.images.shape == (docs, 3, 16, 16) and len(batch.keys) == docs == len(
        batch.doc_lengths
    )
    assert batch.cu_seqlens[-1] == 2 * 48 and len(batch.cu_seqlens) == docs + 1
    assert (batch.position_ids.flatten()[batch.cu_seqlens[:-1].long()] == 0).all()
    assert batch.loss_mask.sum() == (batch.doc_lengths - 1).sum()


def test_packing_setting_must_match_the_config(image_text_encoder, image_text_shards):
    with pytest.raises(
        ValueError, match="packing.enabled is False but Energon got packing_buffer_size=8"
    ):
        get_train_dataset(
            image_text_shards,
            worker_config=image_text_encoder.worker_config(),
            batch_size=2,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            task_encoder=image_text_encoder,
            packing_buffer_size=8,
        )


def test_preview_lists_fields_and_decodes_tokens(
    image_text_encoder, image_text_shards, one_pass, caption_of
):
    from energon_platform.tools.preview import preview_batch

    batch = one_pass(image_text_encoder, image_text_shards)[0]
    text = preview_batch(image_text_encoder, batch, max_chars=1000)
    assert (
        "images: float32 (4, 3, 16, 16)" in text
        and "cu_seqlens: int32 (5,)" in text
        and "max_seqlen: 32" in text
    )
    assert f"{batch.keys[0]}: {caption_of(batch.keys[0])!r}" in text
