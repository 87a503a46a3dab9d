"""Lengths and cost features without decoding: for every shipped encoder config and the embedded
corpus it applies to, the length and the cost features (:mod:`task_encoders.features`) an encoder
derives from a *light* sample (media as file bytes) equal those of the sample it encodes, at several
epochs, for the final key the loader gives it; and a batch of those documents, packed or not, costs
the sum of its documents.

``sample_length(sample_facts(light), key, epoch) == encoded_length(encode(decoded))`` and
``sample_features(...) == encoded_features(...)`` for a subset of each corpus; a sample the encoder
rejects (``ValueError``: e.g. a conversation whose answer does not fit) must be rejected by
``sample_length`` and ``sample_features`` too. ``batch_features(batch) ==
summed(encoded_features(doc) for its docs)``. Configs whose lengths the encoders cannot derive
without decoding are pinned to raise ``NotImplementedError``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scripts.bench.data import coco_dataset, librispeech_dataset
from tests.helpers import REPO

ENCODERS = REPO / "configs" / "encoders"
EPOCHS = (0, 1, 2)
PREFIX = "ds:"  # the loader's "{dataset}:" key prefix in metadataset runs


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    from converters.convert import ConvertOptions, run_conversion

    base = tmp_path_factory.mktemp("lengths")
    out = {"coco": coco_dataset(base), "speech": librispeech_dataset(base)}
    for name, kind, args in (
        (
            "text",
            "text",
            {
                "manifest": str(REPO / "data/text_mini/documents.jsonl"),
                "text_column": "text",
                "id_column": "id",
                "fmt": None,
            },
        ),
        ("video", "video", {"root": str(REPO / "data/video_mini/clips")}),
        (
            "llava",
            "llava",
            {
                "json_file": str(REPO / "data/coco_mini/conversations.json"),
                "images": str(REPO / "data/coco_mini/images"),
            },
        ),
    ):
        outcome = run_conversion(
            kind, args, ConvertOptions(out=str(base / name), samples_per_shard=64, progress=False)
        )
        assert outcome.ok, outcome.report
        out[name] = base / name
    return out


def _config(name: str, **override) -> dict:
    data = yaml.safe_load((ENCODERS / name).read_text())
    for section, values in override.items():
        data[section] = {**data.get(section, {}), **values}
    return data


#: (case id, encoder config, corpora, samples per corpus). Every config of configs/encoders/ is here;
#: the "cut" cases shrink text.seq_len so documents are cut (and some conversations skipped).
CASES = [
    ("text", _config("text.yaml"), ("speech",), 10),
    ("text_small", _config("text_small.yaml"), ("text",), 24),
    ("text_cut", _config("text_small.yaml", text={"seq_len": 10}), ("text", "coco"), 16),
    ("image_text", _config("image_text.yaml"), ("coco",), 10),
    ("image_text_packed", _config("image_text_packed.yaml"), ("coco",), 6),
    ("image_text_small", _config("image_text_small.yaml"), ("coco",), 12),
    ("image_text_small_packed", _config("image_text_small_packed.yaml"), ("coco",), 12),
    ("image_text_vlm", _config("image_text_vlm.yaml"), ("coco",), 6),
    ("image_text_vlm_small", _config("image_text_vlm_small.yaml"), ("coco",), 24),
    ("image_text_vlm_small_packed", _config("image_text_vlm_small_packed.yaml"), ("coco",), 12),
    (
        "image_text_vlm_cut",
        _config("image_text_vlm_small.yaml", text={"seq_len": 96}),
        ("coco",),
        24,
    ),
    ("conversation", _config("conversation.yaml"), ("llava",), 6),
    ("conversation_small", _config("conversation_small.yaml"), ("llava",), 24),
    ("conversation_small_packed", _config("conversation_small_packed.yaml"), ("llava",), 12),
    ("conversation_cut", _config("conversation_small.yaml", text={"seq_len": 104}), ("llava",), 40),
    ("audio_text", _config("audio_text.yaml"), ("speech",), 12),
    (
        "audio_text_cut",
        _config(
            "audio_text.yaml", text={"seq_len": 8}, audio={"sample_rate": 8000, "max_seconds": 1.2}
        ),
        ("speech",),
        12,
    ),
    ("waveform_text", _config("waveform_text.yaml"), ("speech",), 6),
    (
        "waveform_text_resampled_short",
        _config("waveform_text.yaml", waveform={"sample_rate": 8000, "max_seconds": 1.2}),
        ("speech",),
        6,
    ),
    ("video_text", _config("video_text.yaml"), ("video",), 6),
    ("video_text_small", _config("video_text_small.yaml"), ("video",), 8),
    (
        "video_text_fps",
        _config("video_text_small.yaml", video={"fps": 30.0, "num_frames": 6}),
        ("video",),
        6,
    ),
    ("multimodal", _config("multimodal.yaml"), ("coco", "speech", "text"), 6),
    ("multimodal_packed", _config("multimodal_packed.yaml"), ("coco", "speech", "text"), 6),
]


def _spread(n: int, count: int) -> list[int]:
    """``count`` indices spread over ``range(n)`` (first and last included)."""
    return sorted({round(i * (n - 1) / max(count - 1, 1)) for i in range(min(count, n))})


def _outcome(fn):
    """``("ok", value)`` or ``("rejected", exception type)`` for ValueError."""
    try:
        return "ok", fn()
    except ValueError:
        return "rejected", ValueError


def _derived(encoder, facts: tuple, key: str, epoch: int) -> tuple:
    """``(sample_length, sample_features)`` from the facts; the features handed the lengths (as
    the loader's lookup hands them, `feature_work`) must be the same."""
    lengths = encoder.sample_length(facts, key, epoch)
    values = encoder.sample_features(facts, key, epoch)
    assert encoder.sample_features(facts, key, epoch, lengths=lengths) == values, key
    return lengths, values


def check_lengths(encoder, paths: list[Path], per_corpus: int) -> dict[str, int]:
    """Compare derived and encoded lengths and cost features, then the cost features of a batch of
    each epoch's encoded documents (module doc); returns counts of what was seen (``shared_rows``:
    rows of a packed batch that hold several documents)."""
    from energon_platform.loader.light_sample import light_sample
    from energon_platform.loader.source import SampleSource

    seen = {"ok": 0, "rejected": 0, "cut": 0, "shared_rows": 0}
    docs: dict[int, list] = {epoch: [] for epoch in EPOCHS}
    for path in paths:
        source = SampleSource(str(path), "train")
        for i in _spread(len(source), per_corpus):
            light = light_sample(source, i)
            facts = encoder.sample_facts(light)
            assert len(facts) == encoder.facts_width and all(
                isinstance(f, int) and f >= 0 for f in facts
            ), facts
            for epoch in EPOCHS:
                sample = source[i]  # decoded afresh: encoding must not see another epoch's sample
                key = PREFIX + sample.__key__
                sample.__key__ = key
                sample.__subflavors__ = {
                    **(sample.__subflavors__ or {}),
                    "epoch": epoch,
                    "dataset": "ds",
                }
                doc = _outcome(lambda: encoder.encode(sample))
                encoded = doc[0], doc[1] if doc[0] == "rejected" else encoded_views(encoder, doc[1])
                derived = _outcome(lambda: _derived(encoder, facts, key, epoch))
                assert derived == encoded, (
                    f"{path.name} sample {i} ({key}) epoch {epoch}: derived {derived}, encoded {encoded}"
                )
                seen[encoded[0]] += 1
                if encoded[0] == "ok":
                    seen["cut"] += encoded[1][0][0] >= encoder.seq_len - 1
                    docs[epoch].append(doc[1])
    for epoch_docs in docs.values():
        seen["shared_rows"] += check_batch_features(encoder, epoch_docs)
    return seen


def encoded_views(encoder, doc) -> tuple:
    """``(encoded_length, encoded_features)`` of an encoded document; the features checked against
    what the document holds (:func:`held_features`)."""
    from task_encoders.features import summed, text_features

    lengths, vector = encoder.encoded_length(doc), encoder.encoded_features(doc)
    assert vector == summed([text_features(lengths[0]), held_features(doc.media)]), vector
    return lengths, vector


def held_features(media: dict) -> dict[str, float]:
    """The media features of a document's tensors, read by their names and shapes: an ``image``
    (C, H, W) is one vision tile, ``images`` (T, C, t, t) are T tiles, a ``video`` (F, C, h, w) F
    frames; ``features`` or a clip's ``audio`` (n_mels, A) are A audio frames, a ``waveform`` (S,)
    S; ``points`` (P, C) are P points."""
    from task_encoders.features import features

    shapes = {name: tuple(value.shape) for name, value in media.items() if hasattr(value, "shape")}
    return features(
        vision_tiles=sum(shapes[n][0] for n in ("images", "video") if n in shapes)
        + ("image" in shapes),
        audio_frames=sum(shapes[n][-1] for n in ("features", "audio", "waveform") if n in shapes),
        points=shapes["points"][0] if "points" in shapes else 0,
    )


def check_batch_features(encoder, docs: list) -> int:
    """``batch_features`` of ``docs`` collated one per row and packed equal the sum of their
    ``encoded_features``; returns the packed batch's rows that hold several documents."""
    from task_encoders.features import summed

    if not docs:
        return 0
    expected = summed(encoder.encoded_features(d) for d in docs)
    packs = [encoder.pack_selected_samples(g) for g in encoder.select_samples_to_pack(docs)]
    assert encoder.batch_features(encoder.batch(docs)) == expected
    assert encoder.batch_features(encoder.batch(packs)) == expected
    return sum(len(p.docs) > 1 for p in packs)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_derived_lengths_equal_encoded_lengths(case, corpora, tokenizer_dir):
    from task_encoders.registry import get_encoder

    name, config, corpus_names, per_corpus = case
    encoder = get_encoder(config, training=True)
    seen = check_lengths(encoder, [corpora[c] for c in corpus_names], per_corpus)
    assert seen["ok"] >= 3 * len(EPOCHS), seen
    if name.endswith("_cut"):  # the cut (and, for conversations, the skip) is exercised
        assert seen["cut"] > 0, seen
    if name == "conversation_cut":
        assert seen["rejected"] > 0, seen
    if seen["cut"] == 0:  # no document fills its row: the packed batches share rows
        assert seen["shared_rows"] > 0, seen


def test_evaluation_lengths_equal_encoded_lengths(corpora):
    """training=False (centred clips, eval transforms) derives the same lengths as it encodes."""
    from task_encoders.registry import get_encoder

    for config, corpus in (
        (_config("video_text_small.yaml"), "video"),
        (_config("image_text_vlm_small.yaml"), "coco"),
    ):
        seen = check_lengths(get_encoder(config, training=False), [corpora[corpus]], 6)
        assert seen["ok"] >= 6, seen


def test_prompt_draw_changes_lengths_across_epochs(corpora):
    """The instruction is drawn per (key, epoch) and instructions differ in length: the derived
    lengths of one sample differ between epochs (so the draw is really reproduced, not ignored)."""
    from energon_platform.loader.light_sample import light_sample
    from energon_platform.loader.source import SampleSource
    from task_encoders.registry import get_encoder

    encoder = get_encoder(_config("image_text_vlm_small.yaml"))
    facts = encoder.sample_facts(light_sample(SampleSource(str(corpora["coco"]), "train"), 0))
    assert len({encoder.sample_length(facts, f"{PREFIX}x", e) for e in range(12)}) == 2


def test_light_sample_keeps_media_as_bytes(corpora):
    from megatron.energon import CaptioningSample

    from converters.sample_types import AudioTextSample, ConversationSample, VideoTextSample
    from energon_platform.loader.light_sample import light_sample
    from energon_platform.loader.source import SampleSource

    for corpus, kind, media in (
        ("coco", CaptioningSample, "image"),
        ("speech", AudioTextSample, "audio"),
        ("video", VideoTextSample, "video"),
        ("llava", ConversationSample, "images"),
    ):
        source = SampleSource(str(corpora[corpus]), "train")
        light = light_sample(source, 1)
        assert type(light) is kind and light.__key__ == source[1].__key__
        value = getattr(light, media)
        assert (
            all(isinstance(v, bytes) for v in value)
            if media == "images"
            else isinstance(value, bytes)
        )


def test_video_audio_config_refuses_to_guess():
    from task_encoders.registry import get_encoder

    encoder = get_encoder(_config("video_text_small.yaml", video={"audio": {"n_mels": 16}}))
    with pytest.raises(NotImplementedError, match="video.audio"):
        encoder.sample_length((5, 4), "k", 0)


#: Packing encoders whose rows are token positions, on corpora with documents shorter than a row.
SEGMENT_CASES = [
    ("text_small", _config("text_small.yaml", text={"seq_len": 256}), ("text",)),
    ("image_text_small_packed", _config("image_text_small_packed.yaml"), ("coco",)),
    ("multimodal_packed", _config("multimodal_packed.yaml"), ("coco", "speech", "text")),
]


@pytest.mark.parametrize("case", SEGMENT_CASES, ids=[c[0] for c in SEGMENT_CASES])
def test_with_a_segment_multiple_packed_rows_hold_the_padded_derived_lengths(case, corpora):
    """With ``segment_multiple`` 4 (``loader.context_parallel: 2``) the derived and encoded
    lengths stay the document's own; packing gives each document ``padded_length(row, 4)``
    positions of its row (what the planner plans from the derived length), and the cost features
    of a packed batch still count the documents, not the padding."""
    from energon_platform.loader.light_sample import light_sample
    from energon_platform.loader.source import SampleSource
    from task_encoders.features import summed
    from task_encoders.registry import get_encoder
    from task_encoders.sequences import padded_length, row_segments

    _, config, corpus_names = case
    encoder = get_encoder(config, training=True)
    encoder.segment_multiple = 4
    docs, derived = [], []
    for name in corpus_names:
        source = SampleSource(str(corpora[name]), "train")
        for i in _spread(len(source), 8):
            sample = source[i]
            key = sample.__key__
            sample.__subflavors__ = {**(sample.__subflavors__ or {}), "epoch": 0}
            docs.append(encoder.encode(sample))
            derived.append(
                encoder.sample_length(encoder.sample_facts(light_sample(source, i)), key, 0)
            )
    assert [encoder.encoded_length(d) for d in docs] == derived
    slots = {id(d): padded_length(row, 4) for d, (row, _) in zip(docs, derived)}
    packs = [encoder.pack_selected_samples(g) for g in encoder.select_samples_to_pack(docs)]
    for pack in packs:
        segments = row_segments(pack.row["position_ids"])
        assert segments[:-1] == [slots[id(d)] for d in pack.docs[:-1]]
        assert (
            all(s % 4 == 0 for s in segments)
            and sum(slots[id(d)] for d in pack.docs) <= encoder.seq_len
        )
    assert any(row % 4 for row, _ in derived), "no document needed padding"
    assert any(len(p.docs) > 1 for p in packs), "no row shares documents"
    expected = summed(encoder.encoded_features(d) for d in docs)
    assert encoder.batch_features(encoder.batch(packs)) == expected


class _Index:
    """A length index of given facts, keyed ``s0``, ``s1``, ... (what `SampleLengths` reads)."""

    def __init__(self, facts: list[tuple]):
        self._facts = facts

    def facts(self, index: int) -> tuple:
        return self._facts[index]

    def key(self, index: int) -> str:
        return f"s{index}"


@pytest.mark.parametrize(
    "name, corpus, leaf, derive",
    [
        ("audio_text.yaml", "speech", "audio_text:AudioTextTaskEncoder", "sample_length"),
        (
            "image_text_vlm_small.yaml",
            "coco",
            "vision_language:VisionLanguageTaskEncoder",
            "document_layout",
        ),
        ("multimodal.yaml", "speech", "audio_text:AudioTextTaskEncoder", "sample_length"),
    ],
)
def test_the_loaders_feature_lookup_derives_a_samples_lengths_once(
    name, corpus, leaf, derive, corpora, monkeypatch
):
    """`SampleLengths` with `feature_work` (``balance: measured``) derives a sample's lengths once
    and hands them to ``sample_features``: the encoder's derivation (``derive`` of the encoder
    class ``leaf``, ``module:class`` in task_encoders; for the vision-language encoder its seeded
    prompt draw) runs once per lookup,
    and the work equals ``sample_features`` asked alone. It ran three times per lookup before."""
    import importlib

    from energon_platform.loader.balance.costs import feature_work
    from energon_platform.loader.balance.lengths import SampleLengths
    from energon_platform.loader.light_sample import light_sample
    from energon_platform.loader.source import SampleSource
    from task_encoders.features import FEATURES
    from task_encoders.registry import get_encoder

    encoder = get_encoder(_config(name), training=True)
    source = SampleSource(str(corpora[corpus]), "train")
    facts = [encoder.sample_facts(light_sample(source, i)) for i in _spread(len(source), 6)]
    module, _, class_name = leaf.partition(":")
    cls = getattr(importlib.import_module(f"task_encoders.{module}"), class_name)
    calls = []
    original = getattr(cls, derive)
    monkeypatch.setattr(cls, derive, lambda self, *a: calls.append(a) or original(self, *a))
    lookup = SampleLengths(None, [_Index(facts)], encoder, [PREFIX], *feature_work(encoder))
    for epoch in EPOCHS:
        for i, f in enumerate(facts):
            before = len(calls)
            row, work = lookup.length_of(0, epoch, i)
            assert len(calls) - before == 1, f"{name}: sample {i} derived {len(calls) - before}x"
            alone = encoder.sample_features(f, f"{PREFIX}s{i}", epoch)
            assert work == tuple(alone[n] for n in FEATURES) and row == alone["llm_tokens"]


def test_an_encoder_written_without_lengths_is_still_asked():
    """A modality's ``fact_media_features(facts, key, epoch)`` and a user encoder's
    ``sample_features(facts, key, epoch)``, written before ``lengths`` was added, keep working:
    `with_lengths` sees the signature and calls them without it, in the encoder and in the
    loader's lookup (`feature_work`)."""
    from energon_platform.loader.balance.costs import feature_work
    from task_encoders.documents import DocumentTaskEncoder
    from task_encoders.features import FEATURES, features

    class OldMedia(DocumentTaskEncoder):
        def __init__(self):  # only what sample_features reads
            pass

        def sample_length(self, facts, key, epoch):
            return facts[0], facts[0]

        def fact_media_features(self, facts, key, epoch):
            return features(points=facts[1])

    class OldUser:
        def sample_features(self, facts, key, epoch):
            return features(samples=1, llm_tokens=facts[0])

    expected = features(samples=1, llm_tokens=7, llm_attention=49, points=3)
    for lengths in (None, (7, 7)):
        assert OldMedia().sample_features((7, 3), "k", 0, lengths=lengths) == expected
    work, _ = feature_work(OldMedia())
    assert work((7, 3), "k", 0, (7, 7)) == tuple(expected[n] for n in FEATURES)
    work, _ = feature_work(OldUser())
    assert work((5,), "k", 0, (5, 5)) == tuple(
        features(samples=1, llm_tokens=5)[n] for n in FEATURES
    )
