"""The reference trainer's per-row digest (``training.train.batch_digest``: ``digests.row_digests``)
covers every medium a row's documents carry, so check-resume sees a resumed run that feeds other
pixels, frames or audio. The batches here carry the declarations of the batch types they stand for
(``row_tensors``, ``media``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from energon_platform.training.train import batch_digest
from task_encoders.documents import TextBatch
from task_encoders.multimodal import MultimodalBatch
from task_encoders.video_text import VideoTextBatch
from task_encoders.vision_language import VisionLanguageBatch


def text_rows(n_rows: int, docs_per_row: int) -> dict:
    """Two rows of tokens, labels, mask and positions, ``docs_per_row`` documents each."""
    tokens = torch.arange(n_rows * 6).view(n_rows, 6)
    return dict(
        tokens=tokens,
        labels=tokens + 1,
        loss_mask=torch.ones_like(tokens),
        position_ids=tokens % 6,
        num_docs=torch.full((n_rows,), docs_per_row),
        row_tensors=TextBatch.row_tensors,
    )


def video_batch() -> SimpleNamespace:
    videos = torch.rand(2, 4, 3, 2, 2)
    return SimpleNamespace(
        **text_rows(2, 1),
        videos=videos,
        num_frames=torch.tensor([4, 2], dtype=torch.int32),
        audio_features=torch.rand(2, 3, 5),
        audio_lengths=torch.tensor([5, 3]),
        media=VideoTextBatch.media,
    )


@pytest.mark.parametrize(
    "change, row",
    [
        (lambda b: b.videos[0, 1].add_(1.0), 0),  # a real frame of row 0's clip
        (lambda b: b.audio_features[1, :, 2].add_(1.0), 1),  # a valid audio frame of row 1's clip
    ],
)
def test_a_video_rows_digest_sees_its_frames_and_its_audio(change, row):
    batch = video_batch()
    before = batch_digest(batch)
    change(batch)
    after = batch_digest(batch)
    assert after[row] != before[row] and after[1 - row] == before[1 - row]


def test_padding_beyond_a_clips_frames_or_audio_is_not_digested():
    batch = video_batch()
    before = batch_digest(batch)
    batch.videos[1, 3].add_(1.0)  # row 1's clip has 2 real frames
    batch.audio_features[1, :, 4].add_(1.0)  # and 3 valid audio frames
    assert batch_digest(batch) == before


def test_a_mixed_batchs_clip_counts_for_the_document_that_holds_it():
    batch = SimpleNamespace(
        **text_rows(2, 1),
        videos=torch.rand(1, 3, 3, 2, 2),
        num_frames=torch.tensor([3], dtype=torch.int32),
        num_videos=torch.tensor([0, 1]),  # the only clip belongs to row 1's document
        media=MultimodalBatch.media,
    )
    before = batch_digest(batch)
    batch.videos[0, 0].add_(1.0)
    after = batch_digest(batch)
    assert after[0] == before[0] and after[1] != before[1]


def test_a_vision_language_rows_digest_sees_every_tile_of_its_images():
    """``images`` of a vision-language batch are tiles (``num_tiles`` per image of ``image_docs``):
    row 0's one image has 2 tiles, row 1's has 3; each tile counts for its own row."""
    batch = SimpleNamespace(
        **text_rows(2, 1),
        images=torch.rand(5, 3, 2, 2),
        num_tiles=torch.tensor([2, 3], dtype=torch.int32),
        num_images=torch.tensor([1, 1]),  # one image in each row's document
        media=VisionLanguageBatch.media,
    )
    for tile, row in [(1, 0), (2, 1), (4, 1)]:
        before = batch_digest(batch)
        batch.images[tile].add_(1.0)
        after = batch_digest(batch)
        assert after[row] != before[row] and after[1 - row] == before[1 - row], (tile, row)


def test_a_batch_that_declares_no_tensors_is_refused_in_one_line():
    batch = SimpleNamespace(**{k: v for k, v in text_rows(2, 1).items() if k != "row_tensors"})
    with pytest.raises(TypeError, match="does not say which tensors it holds"):
        batch_digest(batch)
