"""The two-tower reference model (``model.kind: two_tower``) on every batch type of the default data."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from energon_platform import TrainLoader
from energon_platform.config import ConfigError, load_config
from energon_platform.training.model import CaptionModel
from energon_platform.training.two_tower import TwoTowerModel, build_model
from scripts.bench.data import three_modality_blend
from tests.helpers import REPO

#: batch kind → (dataset under the blend's folder, or the blend itself; encoder config; towers)
KINDS = {
    "text": ("text_mini", "text_small.yaml", ()),
    "image_text": ("coco_mini", "image_text_small.yaml", ("vision",)),
    "vision_language": ("coco_mini", "image_text_vlm_small.yaml", ("vision",)),
    "audio_text": ("librispeech_mini", "audio_text.yaml", ("audio",)),
    "multimodal": ("blend.yaml", "multimodal.yaml", ("vision", "audio")),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("two-tower")
    three_modality_blend(base)
    return base


def two_tower_config(data, batches: str, **model):
    """The loaded config of batch kind ``batches`` with a two-tower model updated by ``model``."""
    path, encoder, _ = KINDS[batches]
    return load_config(
        {
            "data": {"path": str(data / path), "val_split": None},
            "encoder": str(REPO / "configs/encoders" / encoder),
            "loader": {"global_batch_size": 4, "num_workers": 0},
            "model": {"kind": "two_tower", "patch": 8, **model},
        }
    )


def first_batch(data, kind: str):
    cfg = two_tower_config(data, kind)
    loader = TrainLoader(cfg, num_workers=0)
    return cfg, loader.encoder, next(iter(loader))


def grad_norm(module: torch.nn.Module) -> float:
    return float(sum(p.grad.norm() ** 2 for p in module.parameters() if p.grad is not None))


@pytest.mark.parametrize("kind", list(KINDS))
def test_forward_backward_reaches_every_tower(data, kind):
    cfg, encoder, batch = first_batch(data, kind)
    torch.manual_seed(0)
    model = build_model(cfg.model, encoder)
    assert isinstance(model, TwoTowerModel)
    loss = model(batch)
    loss.backward()
    assert torch.isfinite(loss) and loss > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert grad_norm(model.blocks) > 0
    for tower in KINDS[kind][2]:
        assert grad_norm(getattr(model, tower)) > 0, tower
    for absent in {"vision", "audio"} - set(KINDS[kind][2]):
        assert getattr(model, absent) is None


def test_a_multimodal_micro_batch_without_audio_runs_every_tower(data):
    cfg = two_tower_config(data, "multimodal")
    cfg = dataclasses.replace(cfg, loader=dataclasses.replace(cfg.loader, micro_batch_size=1))
    loader = TrainLoader(cfg, num_workers=0)
    batch = next(b for b in loader if int(b.num_audio.sum()) == 0)
    torch.manual_seed(0)
    model = build_model(cfg.model, loader.encoder)
    loss = model(batch)
    loss.backward()
    assert torch.isfinite(loss) and grad_norm(model.blocks) > 0
    assert all(p.grad is not None for p in model.audio.parameters())  # DDP needs every parameter


def test_loss_goes_down_on_a_vision_language_batch(data):
    cfg, encoder, batch = first_batch(data, "vision_language")
    torch.manual_seed(0)
    model = build_model(cfg.model, encoder)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = model(batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


def test_splice_puts_every_tile_at_its_placeholder(data):
    cfg, encoder, batch = first_batch(data, "vision_language")
    model = build_model(cfg.model, encoder)
    x, position_ids, labels, loss_mask = model.splice(batch)
    assert x.shape[:2] == batch.tokens.shape
    assert int(batch.num_tiles.sum()) > len(batch.num_tiles)  # some image has several tiles
    assert torch.equal(loss_mask.sum(1), batch.loss_mask.sum(1))  # answers keep their loss
    # each document starts where the spliced lengths of the documents before it end
    lengths = batch.spliced_lengths.long().split(batch.num_docs.long().tolist())
    for row, row_lengths in enumerate(lengths):
        starts = torch.cumsum(row_lengths, 0) - row_lengths
        assert torch.equal(position_ids[row, starts], torch.zeros_like(starts))
        assert int((position_ids[row, : int(row_lengths.sum())] == 0).sum()) == len(row_lengths)
    # the answer moves right by what the images add: tiles x tokens_per_tile - placeholders
    images = batch.num_images.long().split(batch.num_docs.long().tolist())
    tiles = batch.num_tiles.long().split([int(n.sum()) for n in images])
    for row in range(len(batch.tokens)):
        surplus = int(tiles[row].sum()) * int(batch.tokens_per_tile) - int(images[row].sum())
        first_answer = int(batch.loss_mask[row].nonzero()[0])
        assert int(loss_mask[row].nonzero()[0]) == first_answer + surplus
        assert labels[row, first_answer + surplus] == batch.labels[row, first_answer]


def test_the_default_kind_is_the_tiny_model(data):
    cfg = two_tower_config(data, "image_text", kind="tiny")
    assert load_config({"data": {"path": "x"}, "encoder": {}}).model.kind == "tiny"
    assert type(build_model(cfg.model, TrainLoader(cfg, num_workers=0).encoder)) is CaptionModel


@pytest.mark.parametrize(
    "model, key",
    [
        ({"vision_dim": 30, "vision_heads": 4}, "model.vision_dim"),
        ({"audio_heads": 0}, "model.audio_heads"),
        ({"kind": "three_tower"}, "model.kind"),
    ],
)
def test_bad_tower_sizes_are_refused_naming_the_key(model, key):
    with pytest.raises(ConfigError, match=key):
        load_config({"data": {"path": "x"}, "encoder": {}, "model": model})
