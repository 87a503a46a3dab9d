"""MultimodalTaskEncoder: dispatch, one batch type for image-text, audio-text and text documents,
mixed packing, bit-identity with each modality's own encoder, Energon's blend and the project's hook order."""

import copy
import itertools
import json
from pathlib import Path

import pytest
import torch
import yaml
from megatron.energon import (
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_train_dataset,
    get_val_dataset,
)
from megatron.energon.errors import FatalSampleError

from energon_platform.tools.preview import preview_batch
from task_encoders.config_parser import ConfigError
from task_encoders.multimodal import MultimodalBatch, MultimodalTaskEncoder, UnknownModality
from task_encoders.registry import get_encoder
from tests.conftest import SMALL_AUDIO, SMALL_IMAGE, caption_for
from tests.encoders.test_text import assert_consistent
from tests.helpers import REPO

MEDIA = {"image_text": "image", "audio_text": "features"}


# --- a text-only Energon dataset (TextSample from text.json) -------------------------------------


def write_text_dataset(out: Path, n: int) -> Path:
    """``n`` TextSamples with keys ``doc-0000``..., 8 per shard, all in ``train``."""
    import webdataset
    from megatron.energon import BaseWebdatasetFactory

    (out / "train").mkdir(parents=True)
    tars = []
    for shard, start in enumerate(range(0, n, 8)):
        tars.append(f"train/shard-{shard:06d}.tar")
        with webdataset.TarWriter(str(out / tars[-1])) as writer:
            for i in range(start, min(n, start + 8)):
                text = caption_for(100 + i) + " " + caption_for(200 + i)
                writer.write(
                    {"__key__": f"doc-{i:04d}", "text.json": json.dumps({"text": text}).encode()}
                )
    BaseWebdatasetFactory.prepare_dataset(
        out, tars, split_parts_patterns=[("train", "train/.*")], workers=1
    )
    (out / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\nfield_map:\n  text: text.json[text]\n"
    )
    return out


@pytest.fixture(scope="module")
def text_shards(tmp_path_factory) -> Path:
    return write_text_dataset(tmp_path_factory.mktemp("text") / "shards", 16)


@pytest.fixture(scope="module")
def samples(raw_samples, text_shards):
    """Decoded samples by modality: 24 CaptioningSample, 12 AudioTextSample, 16 TextSample."""
    dataset = get_val_dataset(
        text_shards,
        split_part="train",
        batch_size=None,
        task_encoder=DefaultTaskEncoder(),
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    return {
        "image_text": raw_samples("image_text"),
        "audio_text": raw_samples("audio_text"),
        "text": list(get_loader(dataset)),
    }


@pytest.fixture(scope="module")
def mixed(samples):
    """Image, audio and text samples interleaved (2 + 2 + 2, three times)."""
    return [
        s
        for i in range(3)
        for name in ("image_text", "audio_text", "text")
        for s in samples[name][2 * i : 2 * i + 2]
    ]


@pytest.fixture(scope="module")
def mm_config(tokenizer_dir):
    """``mm_config(**top)``: a multimodal config with the test sizes of conftest's ``make_encoder``."""

    def make(**top):
        config = {
            "encoder": "multimodal",
            "seed": 1234,
            "text": {"tokenizer": str(tokenizer_dir), "seq_len": 32},
            "modalities": {
                "image_text": {"image": SMALL_IMAGE},
                "audio_text": {"audio": SMALL_AUDIO},
                "text": {},
            },
        }
        return {**config, **top}

    return make


@pytest.fixture(scope="module")
def own(make_encoder):
    """Each modality's own encoder, configured as in ``mm_config`` (same seed, text, media sections)."""
    return {
        "image_text": make_encoder("image_text"),
        "audio_text": make_encoder("audio_text"),
        "text": make_encoder("text"),
    }


def with_epoch(sample, epoch, **subflavors):
    sample = copy.copy(sample)
    sample.__subflavors__ = {**(sample.__subflavors__ or {}), "epoch": epoch, **subflavors}
    return sample


def docs_of(batch: MultimodalBatch) -> dict:
    """key → (modality, unpadded tokens, its image / unpadded features or None), from the batch alone."""
    flat = batch.tokens.flatten()
    media = {int(j): batch.images[i] for i, j in enumerate(batch.image_docs)}
    media.update(
        {
            int(j): batch.features[i, :, : int(batch.feature_lengths[i])]
            for i, j in enumerate(batch.audio_docs)
        }
    )
    # at most one medium per document
    assert len(media) == len(batch.image_docs) + len(batch.audio_docs)
    out = {}
    for j, key in enumerate(batch.keys):
        start = int(batch.cu_seqlens[j])
        out[key] = (
            batch.modalities[j],
            flat[start : start + int(batch.doc_lengths[j])],
            media.get(j),
        )
    return out


def assert_docs_match_own_encoders(batch, own, by_key, epoch=0):
    """Every document of ``batch`` is bit-identical to its modality's own encoder's output."""
    for key, (modality, tokens, media) in docs_of(batch).items():
        ref = own[modality].encode_sample(with_epoch(by_key[key], epoch))
        assert torch.equal(tokens, ref.tokens), key
        if modality == "text":
            assert media is None and ref.media == {}
        else:
            expected = ref.media[MEDIA[modality]]
            assert media.dtype == expected.dtype and torch.equal(media, expected), key


def encode_as_project_loader(encoder, samples, packing):
    """The hooks in Energon's (and energon_platform's MicroBatchMaker's) order."""
    encoded = [encoder.encode_sample(s) for s in samples]
    if packing:
        encoded = [
            encoder.pack_selected_samples(group)
            for group in encoder.select_samples_to_pack(encoded)
        ]
    return encoder.encode_batch(encoder.batch(encoded))


# --- tests ---------------------------------------------------------------------------------------


def test_mixed_batch_fields_shapes_dtypes_and_counts(mm_config, mixed):
    encoder = get_encoder(mm_config())
    assert isinstance(encoder, MultimodalTaskEncoder) and encoder.packing_buffer_size is None
    batch = encode_as_project_loader(encoder, mixed, packing=False)
    d = len(mixed)
    assert (
        isinstance(batch, MultimodalBatch)
        and batch.keys == [s.__key__ for s in mixed] == batch.__key__
    )
    assert batch.tokens.shape == (d, 32) and batch.num_docs.tolist() == [1] * d
    assert_consistent(batch, 32, encoder.tokenizer.special.pad)
    assert (
        batch.modalities
        == ["image_text"] * 2 + ["audio_text"] * 2 + ["text"] * 2 + batch.modalities[6:]
    )
    assert batch.num_images.dtype == batch.num_audio.dtype == torch.int32
    assert batch.num_images.tolist() == [int(m == "image_text") for m in batch.modalities]
    assert batch.num_audio.tolist() == [int(m == "audio_text") for m in batch.modalities]
    assert batch.images.shape == (6, 3, 16, 16) and batch.images.dtype == torch.float32
    assert batch.features.dtype == torch.float32 and batch.features.shape[:2] == (6, 32)
    assert batch.feature_lengths.dtype == torch.int64 and batch.feature_lengths.shape == (6,)
    assert int(batch.feature_lengths.max()) == batch.features.shape[2]
    assert batch.image_docs.tolist() == [
        j for j, m in enumerate(batch.modalities) if m == "image_text"
    ]
    assert batch.audio_docs.tolist() == [
        j for j, m in enumerate(batch.modalities) if m == "audio_text"
    ]
    assert "num_images: int32 (18,)" in preview_batch(encoder, batch)
    for hook in ("encode_sample", "batch", "pack_selected_samples"):
        assert getattr(getattr(encoder, hook), "__stateless__", False), hook


def test_absent_media_are_empty_tensors(mm_config, samples):
    encoder = get_encoder(mm_config())
    batch = encode_as_project_loader(encoder, samples["text"][:3], packing=False)
    assert batch.images.shape == (0, 3, 16, 16) and batch.features.shape == (0, 32, 0)
    assert batch.feature_lengths.shape == (
        0,
    ) and batch.num_images.tolist() == batch.num_audio.tolist() == [0, 0, 0]


@pytest.mark.parametrize("epoch", [0, 3])
def test_documents_are_bit_identical_to_their_own_encoders(mm_config, own, mixed, epoch):
    encoder = get_encoder(mm_config())
    batch = encode_as_project_loader(encoder, [with_epoch(s, epoch) for s in mixed], packing=False)
    assert_docs_match_own_encoders(batch, own, {s.__key__: s for s in mixed}, epoch)
    # The batch-level media equal the own encoders' batches of the same samples, padding included.
    for name, fields in (
        ("image_text", ("images",)),
        ("audio_text", ("features", "feature_lengths")),
    ):
        group = [
            with_epoch(s, epoch)
            for s in mixed
            if s.__key__ in {k for k, m in zip(batch.keys, batch.modalities) if m == name}
        ]
        ref = own[name].batch([own[name].encode_sample(s) for s in group])
        for field in fields:
            assert torch.equal(getattr(batch, field), getattr(ref, field)), field


def test_packed_rows_mix_modalities_and_never_exceed_seq_len(mm_config, own, samples, mixed):
    encoder = get_encoder(mm_config(packing={"enabled": True, "buffer_size": 18}))
    batch = encode_as_project_loader(encoder, mixed, packing=True)
    assert_consistent(batch, 32, encoder.tokenizer.special.pad)
    assert sorted(batch.keys) == sorted(s.__key__ for s in mixed) and batch.tokens.shape[0] < len(
        mixed
    )
    rows = torch.split(batch.doc_lengths, batch.num_docs.tolist())
    assert all(int(r.sum()) <= 32 for r in rows)
    kinds = [set(m) for m in _split(batch.modalities, batch.num_docs.tolist())]
    assert any(len(k) >= 2 for k in kinds), kinds
    assert int(batch.num_images.sum()) == batch.images.shape[0] == 6
    assert int(batch.num_audio.sum()) == batch.features.shape[0] == 6
    assert_docs_match_own_encoders(batch, own, {s.__key__: s for s in mixed})


def _split(items, counts):
    out, start = [], 0
    for n in counts:
        out.append(items[start : start + n])
        start += n
    return out


def test_subflavor_dispatch(mm_config, own, samples):
    encoder = get_encoder(mm_config(dispatch="subflavor", subflavor_key="kind"))
    image, audio = samples["image_text"][0], samples["audio_text"][0]
    # An image-caption sample dispatched to the text modality is a plain text document.
    picked = [
        with_epoch(image, 0, kind="text"),
        with_epoch(samples["image_text"][1], 0, kind="image_text"),
        with_epoch(audio, 0, kind="audio_text"),
    ]
    batch = encode_as_project_loader(encoder, picked, packing=False)
    assert batch.modalities == ["text", "image_text", "audio_text"]
    assert batch.num_images.tolist() == [0, 1, 0] and batch.num_audio.tolist() == [0, 0, 1]
    assert torch.equal(
        batch.tokens[0], own["text"].batch([own["text"].encode_sample(image)]).tokens[0]
    )
    # sample_types maps class names before the built-in rules.
    by_class = get_encoder(mm_config(sample_types={"CaptioningSample": "text"}))
    assert by_class.modality_of(image) == "text" and by_class.modality_of(audio) == "audio_text"


def test_unknown_modality_is_fatal_and_names_key_and_type(mm_config, samples):
    config = mm_config()
    config["modalities"] = {"image_text": config["modalities"]["image_text"]}
    encoder = get_encoder(config)
    audio = samples["audio_text"][3]
    with pytest.raises(
        UnknownModality, match=r"'9001-1-0003' of type AudioTextSample.*'audio_text'.*image_text"
    ) as e:
        encoder.encode_sample(audio)
    assert isinstance(e.value, FatalSampleError)  # not skipped by Energon's error handler
    by_flavor = get_encoder(mm_config(dispatch="subflavor"))
    with pytest.raises(
        UnknownModality,
        match=r"'doc-0000' of type TextSample: __subflavors__\['modality'\] is None",
    ):
        by_flavor.encode_sample(samples["text"][0])
    with pytest.raises(UnknownModality, match=r"__subflavors__\['modality'\] is 'video'"):
        by_flavor.encode_sample(with_epoch(samples["text"][0], 0, modality="video"))


def test_config_errors_name_the_key(mm_config, tmp_path):
    def error(**top):
        with pytest.raises(ConfigError) as e:
            get_encoder(mm_config(**top))
        return e.value

    mods = mm_config()["modalities"]
    e = error(modalities={**mods, "image_text": {"seed": 7, "image": SMALL_IMAGE}})
    assert e.key == "modalities.image_text.seed" and "shared seed 1234" in e.problem
    e = error(modalities={**mods, "text": {"text": {"seq_len": 64}}})
    assert e.key == "modalities.text.text" and "seq_len" in e.problem
    e = error(
        modalities={
            **mods,
            "wave": {"encoder": "waveform_text", "module": "task_encoders.examples.waveform_text"},
        }
    )
    assert e.key == "modalities.wave.encoder" and "WaveformTextBatch" in e.problem
    e = error(
        modalities={
            **mods,
            "speech": {"encoder": "audio_text", "audio": {**SMALL_AUDIO, "n_mels": 40}},
        }
    )
    assert e.key == "modalities.speech.audio.n_mels" and "40 differs" in e.problem
    e = error(modalities={**mods, "nested": {"encoder": "multimodal"}})
    assert e.key == "modalities.nested.encoder"
    e = error(modalities={"video": {}})
    assert e.key == "modalities.video.encoder" and "unknown encoder 'video'" in e.problem
    assert error(modalities={}).key == "modalities"
    assert error(sample_types={"CaptioningSample": "images"}).key == "sample_types.CaptioningSample"
    assert error(dispatch="random").key == "dispatch"
    # Equal shared sections are accepted; a modality may be a YAML path (relative to the top file).
    sub = tmp_path / "image.yaml"
    sub.write_text(
        yaml.safe_dump(
            {
                "encoder": "image_text",
                "seed": 1234,
                "image": SMALL_IMAGE,
                "text": mm_config()["text"],
                "packing": {"enabled": True},
            }
        )
    )
    top = tmp_path / "mm.yaml"
    top.write_text(yaml.safe_dump(mm_config(modalities={**mods, "image_text": "image.yaml"})))
    encoder = get_encoder(top)
    assert encoder.encoders["image_text"].config.packing.enabled is False  # the top level's packing
    assert encoder.encoders["image_text"].config.image.size == (16, 16)


@pytest.mark.parametrize("name", ["multimodal.yaml", "multimodal_packed.yaml"])
def test_shipped_configs(name, samples):
    encoder = get_encoder(REPO / "configs" / "encoders" / name)
    assert set(encoder.encoders) == {"image_text", "audio_text", "text"}
    assert all(
        enc.seed == encoder.seed and enc.seq_len == encoder.seq_len
        for enc in encoder.encoders.values()
    )
    picked = samples["image_text"][:2] + samples["audio_text"][:2] + samples["text"][:2]
    batch = encode_as_project_loader(
        encoder, picked, packing=encoder.packing_buffer_size is not None
    )
    assert batch.images.shape == (2, 3, 64, 64) and batch.features.shape[:2] == (2, 80)


def write_blend(tmp_path: Path, paths: dict, subflavors: bool) -> Path:
    blend = [
        {"weight": 1, "path": str(p), **({"subflavors": {"modality": name}} if subflavors else {})}
        for name, p in paths.items()
    ]
    meta = tmp_path / "blend.yaml"
    meta.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {"train": {"blend": blend}},
            }
        )
    )
    return meta


@pytest.mark.parametrize("dispatch, packing", [("sample_type", False), ("subflavor", True)])
def test_energon_blend_through_get_savable_loader(
    mm_config,
    own,
    samples,
    image_text_shards,
    audio_text_shards,
    text_shards,
    tmp_path,
    dispatch,
    packing,
):
    meta = write_blend(
        tmp_path,
        {"image_text": image_text_shards, "audio_text": audio_text_shards, "text": text_shards},
        subflavors=dispatch == "subflavor",
    )
    encoder = get_encoder(
        mm_config(dispatch=dispatch, packing={"enabled": packing, "buffer_size": 12})
    )

    def loader():
        dataset = get_train_dataset(
            meta,
            batch_size=4,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            worker_config=encoder.worker_config(),
            task_encoder=encoder,
            packing_buffer_size=encoder.packing_buffer_size,
        )
        return get_savable_loader(dataset)

    batches = list(itertools.islice(loader(), 6))
    by_key = {s.__key__: s for group in samples.values() for s in group}
    for batch in batches:
        assert isinstance(batch, MultimodalBatch)
        assert_consistent(batch, 32, encoder.tokenizer.special.pad)
        assert_docs_match_own_encoders(batch, own, by_key)
    assert {m for b in batches for m in b.modalities} == {"image_text", "audio_text", "text"}
    if packing:
        assert any(
            len(set(m)) >= 2 for b in batches for m in _split(b.modalities, b.num_docs.tolist())
        )
        # Energon's own save/restore continues with the same documents (every hook is @stateless).
        first = loader()
        it = iter(first)
        list(itertools.islice(it, 2))
        state = first.save_state_rank()
        expected = [b.keys for b in itertools.islice(it, 2)]
        resumed = loader()
        resumed.restore_state_rank(state)
        assert [b.keys for b in itertools.islice(iter(resumed), 2)] == expected


def test_energon_platform_micro_batch_maker(
    mm_config, own, samples, image_text_shards, audio_text_shards, text_shards, tmp_path
):
    """energon_platform's own path: its metadataset reader and MicroBatchMaker (hook order, dataset-prefixed
    keys, subflavors and epochs from the schedule); the schedule is a stand-in giving mixed pack groups."""
    from energon_platform.loader.batches import MicroBatchMaker
    from energon_platform.loader.datasets import open_datasets

    meta = write_blend(
        tmp_path,
        {"image_text": image_text_shards, "audio_text": audio_text_shards, "text": text_shards},
        subflavors=True,
    )
    datasets = open_datasets(str(meta), "train")
    order = {e.subflavors["modality"]: d for d, e in enumerate(datasets.entries)}

    class Schedule:  # 2 pack groups of 6 samples (2 per modality), epoch 2
        group_size = 6
        groups = [
            [
                (order[m], 2, i)
                for m in ("image_text", "audio_text", "text")
                for i in (2 * g, 2 * g + 1)
            ]
            for g in range(2)
        ]

        def rank_items(self, rank, world_size):
            return range(len(self.groups))

        def items(self, batch, item_ids):
            return [self.groups[i] for i in item_ids]

    encoder = get_encoder(
        mm_config(dispatch="subflavor", packing={"enabled": True, "buffer_size": 6})
    )
    batch = MicroBatchMaker(datasets, encoder, Schedule(), rank=0, world_size=1, micro_items=2)(0)
    assert (
        isinstance(batch, MultimodalBatch) and len(batch.keys) == 12 and batch.tokens.shape[0] < 12
    )
    assert sorted(batch.modalities) == sorted(["image_text", "audio_text", "text"] * 4)
    assert_consistent(batch, 32, encoder.tokenizer.special.pad)
    names = {e.name for e in datasets.entries}
    assert {k.split(":")[0] for k in batch.keys} == names, (
        "keys say which dataset a sample came from"
    )
    # the prefixed key is the sample's identity (and seed): its own encoder, given that key, agrees
    prefixed = {}
    for entry in datasets.entries:
        for s in samples[entry.subflavors["modality"]]:
            prefixed[f"{entry.name}:{s.__key__}"] = copy.copy(s)
            prefixed[f"{entry.name}:{s.__key__}"].__key__ = f"{entry.name}:{s.__key__}"
    assert_docs_match_own_encoders(batch, own, prefixed, epoch=2)
