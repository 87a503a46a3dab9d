"""``energon-platform preview``: a contact sheet PNG for a dataset (encoder chosen by its sample
type), a run config, an explicit encoder and a multimodal blend; opened, sized and not blank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from energon_platform.tools.preview import TILE, doc_media, preview
from tests.helpers import REPO
from tests.helpers.cli import run_cli
from tests.helpers.video_corpus import video_dataset

SMALL_VIDEO = str(REPO / "configs/encoders/video_text_small.yaml")


def assert_sheet(path: Path, docs: int, min_width: int = 300) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        assert im.width >= min_width and im.height >= docs * TILE
        pixels = np.asarray(im)
    assert pixels.std() > 20, "the sheet is blank"
    assert len(np.unique(pixels.reshape(-1, 3)[::7], axis=0)) > 50, (
        "the sheet has almost no content"
    )
    return pixels


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    return video_dataset(tmp_path_factory.getbasetemp(), n=12)


def test_video_dataset_sheet_shows_frames_in_a_row(videos, tmp_path):
    out = tmp_path / "video.png"
    info = preview(videos, out, n=6, encoder=SMALL_VIDEO)
    assert info["documents"] == 6
    pixels = assert_sheet(out, 6, min_width=4 * TILE)
    row = pixels[30 : 30 + TILE]  # the first document: its 4 frames side by side
    assert row[:, : 4 * TILE].std() > 10


@pytest.mark.slow
def test_image_and_audio_datasets_with_default_encoders_and_cli(
    image_text_shards, audio_text_shards, tmp_path
):
    info = preview(image_text_shards, tmp_path / "image.png", n=5)
    assert info["documents"] == 5
    assert_sheet(tmp_path / "image.png", 5)
    r = run_cli(
        "preview",
        str(audio_text_shards),
        "--out",
        str(tmp_path / "audio.png"),
        "--n",
        "4",
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "4 documents" in r.stdout
    assert_sheet(tmp_path / "audio.png", 4)
    r = run_cli(
        "preview", str(tmp_path / "absent"), "--out", str(tmp_path / "x.png"), timeout=120, cwd=REPO
    )
    assert r.returncode == 2 and "no such" in r.stderr


def test_a_missing_target_is_refused_by_name_before_the_out_format(tmp_path):
    """The target is checked first: a missing one is named even when ``--out``'s suffix is bad too."""
    with pytest.raises(
        FileNotFoundError, match="absent: no such run config, dataset or metadataset"
    ):
        preview(tmp_path / "absent", tmp_path / "sheet.gif")


def test_a_file_that_is_no_yaml_is_not_called_a_metadataset(tmp_path):
    from storage import DatasetError

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="notes.txt: a file that is neither a run config nor"):
        preview(tmp_path / "notes.txt", tmp_path / "sheet.png")


def test_multimodal_blend_run_config(videos, image_text_shards, tmp_path):
    blend = tmp_path / "blend.yaml"
    blend.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {
                    "train": {
                        "blend": [
                            {"weight": 1, "path": str(videos)},
                            {"weight": 1, "path": str(image_text_shards)},
                        ]
                    }
                },
            }
        )
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(blend), "val_split": None},
                "encoder": {
                    "encoder": "multimodal",
                    "seed": 1234,
                    "text": {"seq_len": 48},
                    "modalities": {
                        "image_text": {
                            "image": {"transforms": [{"name": "RandomResizedCrop", "size": 32}]}
                        },
                        "video_text": SMALL_VIDEO,
                    },
                },
                "loader": {"global_batch_size": 8, "num_workers": 2},
            }
        )
    )
    info = preview(config, tmp_path / "blend.png", n=8)
    assert info["documents"] == 8
    assert_sheet(tmp_path / "blend.png", 8)


def test_doc_media_reads_every_batch_kind(videos):
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    loader = TrainLoader(
        load_config(
            {
                "data": {"path": str(videos), "val_split": None},
                "encoder": SMALL_VIDEO,
                "loader": {"global_batch_size": 3, "num_workers": 0},
            }
        )
    )
    batch = next(loader)
    loader.close()
    media = doc_media(batch)
    assert [[k for k, _ in m] for m in media] == [["video"]] * 3
    assert all(t.shape[0] == int(n) for m, n in zip(media, batch.num_frames) for _, t in m)


def test_a_dataset_smaller_than_the_sheet_says_to_lower_n_not_a_weight(audio_text_shards, tmp_path):
    """M6: a 12-sample dataset with the default --n 16 was told to lower a weight."""
    r = run_cli("preview", audio_text_shards, "--out", tmp_path / "s.png", timeout=120, cwd=REPO)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1, r.stderr
    assert "--n: 16 documents, but a dataset has 12 samples" in err[0] and "pass --n 12" in err[0]
    assert "weight" not in err[0] and not (tmp_path / "s.png").exists()


def test_out_suffix_names_the_format_and_another_suffix_is_refused(image_text_shards, tmp_path):
    info = preview(image_text_shards, tmp_path / "sheet.JPG", n=2)
    with Image.open(info["path"]) as im:
        assert im.format == "JPEG"
    r = run_cli(
        "preview", image_text_shards, "--out", tmp_path / "sheet.gif", timeout=120, cwd=REPO
    )
    assert (
        r.returncode == 2
        and "--out" in r.stderr
        and "'.gif'" in r.stderr
        and "Traceback" not in r.stderr
    )
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "sheet.gif").exists()


def test_point_clouds_without_an_encoder_are_drawn_in_their_own_colours(tmp_path):
    from converters.convert import ConvertOptions, run_conversion
    from energon_platform.loader.train_loader import TrainLoader
    from energon_platform.tools.preview import PAD, POINT_VIEWS, preview_config

    shapes = tmp_path / "shapes"
    run_conversion(
        "3d",
        {"root": str(REPO / "data/mesh_mini/shapes")},
        ConvertOptions(out=str(shapes), progress=False),
    )
    n = 8
    preview(shapes, tmp_path / "shapes.png", n=n)
    loader = TrainLoader(preview_config(shapes, None, n))
    batch = next(loader)  # the batch the sheet draws
    loader.close()
    assert batch.has_colors.any(), "the first batch should hold coloured clouds"
    with Image.open(tmp_path / "shapes.png") as im:
        pixels = np.asarray(im.convert("RGB"))
    top = 24 + PAD  # below the title
    for j in torch_nonzero(batch.has_colors):
        tiles = pixels[top + j * (TILE + PAD) :][
            :TILE, PAD : PAD + len(POINT_VIEWS) * (TILE + 2)
        ].reshape(-1, 3)
        # tile, sheet
        drawn = {tuple(c) for c in np.unique(tiles, axis=0)} - {
            (255, 255, 255),
            (250, 250, 248),
        }
        own = {
            tuple(c)
            for c in (np.clip(batch.points[j, :, 3:6].numpy(), 0, 1) * 255).astype(np.uint8)
        }
        assert drawn and drawn <= own, (batch.keys[j], len(drawn - own))


def torch_nonzero(mask) -> list[int]:
    return [int(i) for i in mask.nonzero().flatten()]


def test_each_document_of_a_vision_language_batch_gets_its_own_images_tiles():
    """A vision-language batch holds all tiles one after another, ``num_tiles`` per image and
    ``num_images`` per document: document 1's second image is tiles 5-6, not tile 1."""
    from types import SimpleNamespace

    num_tiles = torch.tensor([2, 3, 2], dtype=torch.int32)  # doc 0: one image; doc 1: two
    tiles = torch.arange(7, dtype=torch.float32).view(7, 1, 1, 1).expand(7, 3, 4, 4).clone()
    batch = SimpleNamespace(
        keys=["a", "b", "c"],
        images=tiles,
        num_tiles=num_tiles,
        num_images=torch.tensor([1, 2, 0], dtype=torch.int32),
    )
    media = doc_media(batch)
    assert [[k for k, _ in m] for m in media] == [["tiles"], ["tiles", "tiles"], []]
    firsts = [[int(t[:, 0, 0, 0].min()) for _, t in m] for m in media]
    assert firsts == [[0], [2, 5], []]
    assert [[t.shape[0] for _, t in m] for m in media] == [[2], [3, 2], []]


def test_an_image_encoders_pictures_undo_its_normalize(make_encoder):
    """The sheet shows an image as the pipeline saw it before its Normalize: the mean and std are
    found in the image path's steps (not stretched from each tile's own min..max)."""
    from energon_platform.tools.preview import _normalize_of

    found = _normalize_of(make_encoder("image_text"), None)
    assert found is not None
    mean, std = found
    assert mean.shape == std.shape == (3, 1, 1) and bool((std > 0).all())
