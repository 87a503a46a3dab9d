"""Each batch class of ``task_encoders`` says which tensors it holds, and the row digest
(`energon_platform.training.digests.row_digests`) reads that declaration: the digests of the
existing batch types are those recorded before the declaration moved onto the batch, and every
tensor a batch holds is either digested (change one element: a row's digest changes) or declared
as left out."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from energon_platform.training.digests import device_fields, row_digests
from task_encoders.audio_text import AudioTextBatch
from task_encoders.documents import TextBatch
from task_encoders.examples.waveform_text import WaveformTextBatch
from task_encoders.image_text import ImageTextBatch
from task_encoders.multimodal import MultimodalBatch
from task_encoders.pointcloud_text import PointCloudTextBatch
from task_encoders.video_text import VideoTextBatch
from task_encoders.vision_language import VisionLanguageBatch

BATCH_TYPES = (
    TextBatch,
    ImageTextBatch,
    AudioTextBatch,
    VisionLanguageBatch,
    VideoTextBatch,
    PointCloudTextBatch,
    MultimodalBatch,
    WaveformTextBatch,
)


def _floats(*shape: int, offset: float = 0.0) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=torch.float32).reshape(shape) / 7 + offset


def _ints(*values: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


#: two packed rows of 6 tokens: row 0 holds documents 0 and 1, row 1 holds document 2
TEXT = dict(
    tokens=torch.arange(12).view(2, 6),
    labels=torch.arange(1, 13).view(2, 6),
    loss_mask=torch.tensor([[1.0, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 0]]),
    position_ids=torch.tensor([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]]),
    cu_seqlens=_ints(0, 3, 6, 12),
    num_docs=_ints(2, 1),
    doc_lengths=_ints(3, 3, 6),
)

#: each type's own fields, so that a medium's items lie in both rows
FIELDS = {
    TextBatch: {},
    ImageTextBatch: dict(images=_floats(3, 3, 2, 2)),
    AudioTextBatch: dict(
        features=_floats(3, 4, 5), feature_lengths=_ints(5, 3, 4, dtype=torch.int64)
    ),
    VisionLanguageBatch: dict(
        images=_floats(6, 3, 2, 2),
        num_tiles=_ints(2, 1, 3),
        num_images=_ints(1, 0, 2),
        spliced_lengths=_ints(4, 3, 9),
        image_token_index=5,
        tokens_per_tile=2,
    ),
    VideoTextBatch: dict(
        videos=_floats(3, 4, 3, 2, 2),
        num_frames=_ints(4, 2, 3),
        audio_features=_floats(3, 4, 5, offset=0.5),
        audio_lengths=_ints(5, 2, 4, dtype=torch.int64),
    ),
    PointCloudTextBatch: dict(
        points=_floats(3, 8, 6), has_colors=torch.tensor([True, False, True])
    ),
    MultimodalBatch: dict(
        modalities=["image_text", "audio_text", "video_text"],
        images=_floats(1, 3, 2, 2),
        num_images=_ints(1, 0, 0),
        features=_floats(1, 4, 5, offset=0.25),
        feature_lengths=_ints(3, dtype=torch.int64),
        num_audio=_ints(0, 0, 1),
        videos=_floats(1, 4, 3, 2, 2, offset=0.75),
        num_frames=_ints(2),
        num_videos=_ints(1, 0, 0),
        points=_floats(1, 8, 3, offset=0.125),
        has_colors=torch.tensor([False]),
        num_clouds=_ints(0, 0, 1),
    ),
    WaveformTextBatch: dict(
        waveforms=_floats(3, 10), waveform_lengths=_ints(10, 4, 7, dtype=torch.int64)
    ),
}


def make_batch(cls: type) -> TextBatch:
    """A batch of ``cls`` with the fields above (fresh tensors each call)."""
    keys = ["a", "b", "c"]
    fields = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in TEXT.items()}
    fields.update(
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in FIELDS[cls].items()}
    )
    return cls(__key__=keys, __restore_key__=(), keys=keys, max_seqlen=6, **fields)


#: `row_digests` of `make_batch` per type, recorded with the reference trainer's digest before
#: the batch types declared their tensors (``training.train.batch_digest`` with its own list of
#: media). The waveform example's batch was digested as text only (its ``waveforms`` missed).
RECORDED = {
    "TextBatch": [
        "3ee94147a74e429d325536547f19040756aa853a467bbea79f83eba7e1237db6",
        "9863bca3cadcc5ed22d841a96e288ea8ad2265238a6848374ca22ca049966b97",
    ],
    "ImageTextBatch": [
        "5f86d040d7d7663f72d3a3adcb49795b351e7c642fdc86b1bee3c3212a0e2961",
        "2126e9557cd7eadd78c850235304f86a9e2a3491d64ffdf90e5fd5cb17e4cc6b",
    ],
    "AudioTextBatch": [
        "ab9289962a653d7faae3d148c7951d5ecf16a2d18e8516e0f7f40afcff61a585",
        "399109ea23f377f10257a175873a1e8970b27283f15d6e23fb2b43548b86708d",
    ],
    "VisionLanguageBatch": [
        "5f86d040d7d7663f72d3a3adcb49795b351e7c642fdc86b1bee3c3212a0e2961",
        "ea94f2b0ecbe664579d97baef549e4e960a856fa08b1f7d145a20b7fdb2961dd",
    ],
    "VideoTextBatch": [
        "6915af5758041b1d21e7a7dfe23075c36dacaf7a6d9c45fdc9838997ef601e3f",
        "01b1078912092446555d774c194a5be130f1c960b0e93ad032e8dce1d5d0a9bd",
    ],
    "PointCloudTextBatch": [
        "0df1a28468084d3ccf1b00761c86f2fab92c451d12b1e0681586a3984bbe8329",
        "4119d23a5064e530a744f1a4e6a158faec5894414e95b2b6086f870e287777b0",
    ],
    "MultimodalBatch": [
        "b9012d3ffa477453778d593d5072409f1b7d9e73e5c5641dd4b294483883a6df",
        "ffabad9d3d991b6b857a299f65f830135fc609ba43c1a0e206ff1bb2b46139a0",
    ],
}
WAVEFORM_TEXT_ONLY = RECORDED["TextBatch"]


@pytest.mark.parametrize("cls", [c for c in BATCH_TYPES if c.__name__ in RECORDED], ids=str)
def test_existing_batch_types_digest_as_recorded(cls):
    assert row_digests(make_batch(cls)) == RECORDED[cls.__name__]


def test_the_waveform_examples_digests_now_cover_its_waveforms():
    assert row_digests(make_batch(WaveformTextBatch)) != WAVEFORM_TEXT_ONLY


def tensor_fields(cls: type) -> set[str]:
    """The fields ``cls`` annotates as tensors."""
    return {f.name for f in dataclasses.fields(cls) if f.type in ("torch.Tensor", torch.Tensor)}


def changed(batch: TextBatch, name: str) -> None:
    """Change ``batch.<name>`` in place: a medium's counts per document or per item are reversed (an
    item moves to another row), a length shortened by one, any other tensor's first element
    changed."""
    t = getattr(batch, name)
    counts = {n for m in type(batch).media for n in (m.per_doc, m.per_item) if n}
    lengths = {m.lengths for m in type(batch).media if m.lengths}
    flat = t.view(-1)
    if name in counts:
        t.copy_(t.flip(0))
    elif name in lengths:
        flat[0] -= 1
    elif t.dtype == torch.bool:
        flat[0] = ~flat[0]
    else:
        flat[0] += 1


@pytest.mark.parametrize("cls", BATCH_TYPES, ids=str)
def test_a_batch_type_declares_every_tensor_it_holds(cls):
    assert set(cls.tensor_fields()) == tensor_fields(cls)
    assert set(cls.device_fields()) <= tensor_fields(cls)


@pytest.mark.parametrize(
    "cls, name",
    [(c, n) for c in BATCH_TYPES for n in sorted(tensor_fields(c) - set(c.undigested))],
    ids=str,
)
def test_changing_one_element_of_a_digested_tensor_changes_a_rows_digest(cls, name):
    batch = make_batch(cls)
    before = row_digests(batch)
    changed(batch, name)
    assert row_digests(batch) != before


@pytest.mark.parametrize("cls", BATCH_TYPES, ids=str)
def test_the_trainer_moves_every_medium_and_its_lengths(cls):
    """`device_fields`: the text rows, ``cu_seqlens``, and each medium with its valid lengths
    (``videos`` and ``waveforms`` included)."""
    media = {n for m in cls.media for n in (m.field, m.lengths) if n}
    assert set(device_fields(make_batch(cls))) == set(cls.row_tensors) | {"cu_seqlens"} | media


def test_every_batch_class_of_task_encoders_is_checked_here():
    """A new batch class (a new modality) joins ``FIELDS``, and so the tests above."""
    import importlib
    import pkgutil

    import task_encoders

    for info in pkgutil.walk_packages(task_encoders.__path__, "task_encoders."):
        importlib.import_module(info.name)
    found, stack = set(), [TextBatch]
    while stack:
        cls = stack.pop()
        found.add(cls)
        stack += cls.__subclasses__()
    assert {c for c in found if c.__module__.startswith("task_encoders.")} == set(FIELDS)


@pytest.mark.parametrize("cls", [VideoTextBatch, MultimodalBatch, WaveformTextBatch], ids=str)
def test_the_reference_trainer_moves_the_batchs_device_fields(cls):
    """``train._to`` moves what the batch declares (``videos`` and ``waveforms`` included, which
    its own list missed); the counts that place media stay on the host. The ``meta`` device
    stands in for a GPU."""
    from energon_platform.training.train import _to

    batch = _to(make_batch(cls), torch.device("meta"))
    on_meta = {n for n in tensor_fields(cls) if getattr(batch, n).device.type == "meta"}
    assert on_meta == set(cls.device_fields())
