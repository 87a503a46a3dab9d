"""``pointcloud_text``: points on the mesh surface (trimesh's exact distance), area weighting,
normalisation, seeded augmentation, colours, the length contract, the same tensors per
(seed, key, epoch) for 0/1/2 workers and another process, exact resume after SIGKILL and elastic
resume through energon_platform's TrainLoader, a three-modality blend (image, text, 3D) with the
``multimodal`` encoder, and SIGKILL + bit-exact resume of the reference trainer on point clouds."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from task_encoders.config_parser import ConfigError
from task_encoders.registry import get_encoder
from tests.helpers import REPO, layouts
from tests.helpers.cli import run_python
from tests.helpers.run_configs import loader_config

SMALL = {"num_points": 256, "colors": True, "dropout": 0.2}


def pc_encoder(tokenizer_dir=None, seed=None, training=True, **pointcloud):
    text = {"seq_len": 32, **({"tokenizer": str(tokenizer_dir)} if tokenizer_dir else {})}
    return get_encoder(
        {
            "encoder": "pointcloud_text",
            "seed": 1234,
            "text": text,
            "pointcloud": {**SMALL, **pointcloud},
        },
        seed=seed,
        training=training,
    )


def with_epoch(sample, epoch):
    sample = copy.copy(sample)
    sample.__subflavors__ = {**(sample.__subflavors__ or {}), "epoch": epoch}
    return sample


def digests(batch) -> dict[str, str]:
    """key → sha256 of the document's tokens and points."""
    flat = batch.tokens.flatten()
    out = {}
    for j, key in enumerate(batch.keys):
        start = int(batch.cu_seqlens[j])
        parts = [flat[start : start + int(batch.doc_lengths[j])], batch.points[j]]
        out[key] = hashlib.sha256(
            b"".join(p.contiguous().numpy().tobytes() for p in parts)
        ).hexdigest()
    return out


def shapes_dataset(base: Path) -> Path:
    from converters.convert import ConvertOptions, run_conversion

    out = base / "mesh_mini"
    if not (out / "report.json").is_file():
        run_conversion(
            "3d",
            {"root": str(REPO / "data/mesh_mini/shapes")},
            ConvertOptions(out=str(out), samples_per_shard=8, progress=False),
        )
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return shapes_dataset(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def samples(shards):
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    ds = get_val_dataset(
        shards,
        split_part="train",
        batch_size=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    return {s.__key__: s for s in get_loader(ds)}


def one_pass(encoder, path, num_workers=0, batch_size=4):
    from megatron.energon import get_savable_loader, get_val_dataset

    ds = get_val_dataset(
        path,
        split_part="train",
        batch_size=batch_size,
        task_encoder=encoder,
        worker_config=encoder.worker_config(num_workers=num_workers),
    )
    return list(get_savable_loader(ds))


# ---------------------------------------------------------------- the points


def test_sampled_points_lie_on_the_mesh_surface_and_follow_area(samples):
    import trimesh

    from converters.mesh3d import sample_surface
    from task_encoders.pointcloud_text import geometry_of, normalise

    encoder = pc_encoder(training=False, num_points=128)
    meshes = [k for k, s in samples.items() if s.meta["source"]["kind"] == "mesh"]
    assert len(meshes) == 21
    for key in meshes:
        geom = geometry_of(samples[key])
        rng = np.random.default_rng(encoder.sample_seed(samples[key], "points"))
        raw, _ = sample_surface(geom, 128, rng)
        mesh = trimesh.Trimesh(geom.vertices, geom.faces, process=False)
        _, distance, _ = trimesh.proximity.closest_point_naive(mesh, raw)
        assert distance.max() < 1e-6 * max(1.0, np.abs(geom.vertices).max()), key
        points, _ = encoder.cloud(samples[key])  # evaluation: steps 1-2 only
        np.testing.assert_array_equal(points, normalise(raw))
        assert (
            np.sqrt((points**2).sum(1)).max() == pytest.approx(1.0)
            and np.abs(points.mean(0)).max() < 1e-12
        )
    slab = samples["shape_001"]  # 2 x 0.3 x 2: top and bottom hold 8 of its 10.4 area units
    points, _ = sample_surface(geometry_of(slab), 4000, np.random.default_rng(0))
    assert np.mean(np.isclose(np.abs(points[:, 1]), 0.15)) == pytest.approx(8 / 10.4, abs=0.03)


def test_stored_clouds_give_their_own_points_and_colours(samples):
    from task_encoders.pointcloud_text import geometry_of

    encoder = pc_encoder(training=False, num_points=300)
    for key in ("shape_018", "shape_021", "shape_024"):
        geom = geometry_of(samples[key])
        batch = encoder.batch([encoder.encode_sample(samples[key])])
        cloud, _ = encoder.cloud(samples[key])
        stored = {tuple(np.round(p, 9)) for p in (geom.vertices - geom.vertices.mean(0)).tolist()}
        assert len(cloud) == 300 and batch.points.shape == (1, 300, 6)
        rgb = batch.points[0, :, 3:]
        if geom.colors is not None:
            assert bool(batch.has_colors[0]) and torch.allclose(
                rgb, torch.tensor(geom.colors[0] / 255.0).float()
            )
        else:
            assert not bool(batch.has_colors[0]) and not rgb.any()
        assert len(stored) == len(geom.vertices)
    # 512 stored: all, then repeats
    few = pc_encoder(training=False, num_points=600).cloud(samples["shape_018"])[0]
    assert len({tuple(p) for p in few.tolist()}) == 512


def test_augmentation_is_seeded_up_axis_turn_scale_jitter_dropout(samples, tokenizer_dir):
    sample = samples["shape_005"]
    plain = pc_encoder(tokenizer_dir, training=False)
    turn = pc_encoder(tokenizer_dir, scale=[1, 1], jitter=0.0, dropout=0.0)
    base, _ = plain.cloud(sample)
    turned, _ = turn.cloud(sample)
    # a turn about y keeps every height
    np.testing.assert_allclose(turned[:, 1], base[:, 1], atol=1e-12)
    assert not np.allclose(turned[:, 0], base[:, 0])
    np.testing.assert_allclose(
        np.linalg.norm(turned, axis=1), np.linalg.norm(base, axis=1), atol=1e-12
    )
    so3, _ = pc_encoder(tokenizer_dir, rotation="so3", scale=[1, 1], jitter=0.0, dropout=0.0).cloud(
        sample
    )
    assert not np.allclose(so3[:, 1], base[:, 1])
    np.testing.assert_allclose(
        np.linalg.norm(so3, axis=1), np.linalg.norm(base, axis=1), atol=1e-12
    )
    dropped, _ = pc_encoder(tokenizer_dir, dropout=0.9).cloud(sample)
    assert (dropped == dropped[0]).all(axis=1).sum() > 1
    full = pc_encoder(tokenizer_dir)
    clouds = {e: full.cloud(with_epoch(sample, e))[0] for e in range(3)}
    assert not np.array_equal(clouds[0], clouds[1])
    np.testing.assert_array_equal(
        clouds[1], pc_encoder(tokenizer_dir).cloud(with_epoch(sample, 1))[0]
    )
    assert not np.array_equal(
        clouds[0], pc_encoder(tokenizer_dir, seed=99).cloud(with_epoch(sample, 0))[0]
    )


def test_a_dropped_point_takes_the_first_points_colour_with_its_place(samples):
    rng = np.random.default_rng(0)
    sample = copy.copy(samples["shape_021"])  # a stored cloud, given points of many colours
    sample.geometry = np.concatenate(
        [rng.normal(size=(400, 3)), rng.uniform(size=(400, 3))], axis=1
    )
    points = pc_encoder(num_points=256, dropout=0.9).encode_media(sample)["points"].numpy()
    xyz, rgb = points[:, :3], points[:, 3:]
    dropped = (xyz == xyz[0]).all(axis=1)
    assert dropped.sum() > 10 and len(np.unique(rgb[dropped], axis=0)) == 1 < len(
        np.unique(rgb, axis=0)
    )
    assert (rgb[dropped] == rgb[0]).all()


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"pointcloud\.num_points"):
        pc_encoder(num_points=0)
    with pytest.raises(ConfigError, match=r"pointcloud\.rotation"):
        pc_encoder(rotation="sideways")
    with pytest.raises(ConfigError, match=r"pointcloud\.dropout"):
        pc_encoder(dropout=1.0)


# ---------------------------------------------------------------- lengths, determinism


def test_derived_lengths_equal_encoded_lengths(shards):
    from tests.encoders.test_lengths import check_lengths

    encoder = get_encoder(str(REPO / "configs/encoders/pointcloud_text.yaml"))
    seen = check_lengths(encoder, [shards], per_corpus=6)
    assert seen["ok"] == 18


def test_same_tensors_per_key_for_0_1_2_workers(shards, tokenizer_dir):
    encoder = pc_encoder(tokenizer_dir)
    runs = [
        {k: v for b in one_pass(encoder, shards, num_workers=w) for k, v in digests(b).items()}
        for w in (0, 1, 2)
    ]
    assert len(runs[0]) == 30 and runs[0] == runs[1] == runs[2]


PROCESS_SCRIPT = """
import json, sys
from tests.encoders.test_pointcloud import digests, one_pass, pc_encoder
out = {}
for batch in one_pass(pc_encoder(sys.argv[2]), sys.argv[1], num_workers=2, batch_size=7):
    out.update(digests(batch))
print("DIGESTS " + json.dumps(out))
"""


@pytest.mark.slow
def test_another_process_with_other_workers_gives_the_same_tensors(shards, tokenizer_dir):
    r = run_python(PROCESS_SCRIPT, shards, tokenizer_dir, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("DIGESTS "))[8:])
    ours = {
        k: v for b in one_pass(pc_encoder(tokenizer_dir), shards) for k, v in digests(b).items()
    }
    assert len(ours) == 30 and theirs == ours


# ---------------------------------------------------------------- resume through TrainLoader


def shards_config(path: Path, **loader):
    """The loaded config of the shards at ``path`` (no validation split), seed 7, ``loader``."""
    from energon_platform.config import load_config

    encoder = {"encoder": "pointcloud_text", "text": {"seq_len": 32}, "pointcloud": SMALL}
    return load_config(
        loader_config({"path": str(path), "val_split": None}, encoder, seed=7, **loader)
    )


def layout_batches(config, ranks: int, workers: int, steps: int, states=None):
    """``steps`` global batches as per-key digests (ranks in order), then every rank's state."""
    return layouts.layout_batches(config, ranks, workers, steps, digests, states)


@pytest.mark.slow
def test_elastic_resume_changes_ranks_and_workers_tensors_identical(shards):
    config = shards_config(shards)
    reference, _ = layout_batches(config, 1, 0, 10)  # 30 samples: epoch 0, then part of epoch 1
    before, states = layout_batches(config, 1, 2, 4)
    assert before == reference[:4]
    after, _ = layout_batches(config, 2, 1, 6, states)
    assert after == reference[4:], "the resumed layout must give the same keys and tensors"


@pytest.mark.slow
def test_sigkill_then_resume_gives_identical_tensors(shards, tmp_path):
    layouts.assert_sigkill_resume_identical(
        "tests.encoders.test_pointcloud", shards, tmp_path / "killed", steps=10
    )


# ---------------------------------------------------------------- multimodal: a three-modality blend


@pytest.mark.slow
def test_three_modality_blend_with_3d_through_the_train_loader(
    shards, image_text_shards, text_mini, tmp_path, tokenizer_dir
):
    import yaml

    from energon_platform.config import load_config
    from task_encoders.multimodal import MultimodalBatch
    from tests.conftest import SMALL_IMAGE

    text = text_mini
    blend = [
        {"weight": 2, "path": str(image_text_shards)},
        {"weight": 1, "path": str(text)},
        {"weight": 1, "path": str(shards)},
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
    encoder = {
        "encoder": "multimodal",
        "seed": 1234,
        "text": {"seq_len": 32},
        "modalities": {
            "image_text": {"image": SMALL_IMAGE},
            "text": {},
            "pointcloud_text": {"pointcloud": SMALL},
        },
    }
    config = load_config(
        {
            "data": {"path": str(meta), "val_split": None},
            "encoder": encoder,
            "loader": {"global_batch_size": 8, "num_workers": 0, "seed": 3},
        }
    )
    mm_digest = lambda b: [
        (k, hashlib.sha256(b.points[i].numpy().tobytes()).hexdigest())
        for i, k in zip(range(len(b.points)), [k for k, n in zip(b.keys, b.num_clouds) if n])
    ]
    from energon_platform.loader.train_loader import TrainLoader

    def run(workers, steps, state=None):
        loader = TrainLoader(config, num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        batches = [next(loader) for _ in range(steps)]
        saved = json.loads(json.dumps(loader.state_dict()))
        seeds.add(loader.encoder.seed)
        loader.close()
        return batches, saved

    seeds: set[int] = set()
    reference, _ = run(0, 6)
    seen = {m for b in reference for m in b.modalities}
    assert seen == {"image_text", "text", "pointcloud_text"}
    for b in reference:
        assert isinstance(b, MultimodalBatch) and b.points.shape[1:] == (256, 6)
        assert b.points.shape[0] == int(b.num_clouds.sum()) == b.modalities.count("pointcloud_text")
        assert b.cloud_docs.tolist() == [
            i for i, m in enumerate(b.modalities) if m == "pointcloud_text"
        ]
    first, state = run(2, 2)
    rest, _ = run(1, 4, state)
    assert [mm_digest(b) for b in first + rest] == [mm_digest(b) for b in reference]
    assert [b.keys for b in first + rest] == [b.keys for b in reference]
    (seed,) = seeds
    own = pc_encoder(tokenizer_dir, seed=seed)
    stored = {s.__key__: s for s in _samples_of(shards)}
    checked = 0
    for b in reference:
        for i, j in enumerate(b.cloud_docs.tolist()):
            key = b.keys[j]
            sample = copy.copy(stored[key.rsplit(":", 1)[-1]])
            sample.__key__, sample.__subflavors__ = key, {"epoch": 0}
            assert torch.equal(b.points[i], own.encode_sample(sample).media["points"]), key
            checked += 1
    assert checked >= 3, "3D documents are what their own encoder gives"


def _samples_of(path: Path) -> list:
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    ds = get_val_dataset(
        path,
        split_part="train",
        batch_size=None,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
    )
    return list(get_loader(ds))


# ---------------------------------------------------------------- the reference trainer


def test_reference_model_reads_the_points(samples, tokenizer_dir):
    from energon_platform.config import ModelConfig
    from energon_platform.training.model import CaptionModel, media_of

    encoder = pc_encoder(tokenizer_dir, colors=False)
    assert media_of(encoder) == ("points",)
    batch = encoder.batch([encoder.encode_sample(samples[k]) for k in ("shape_000", "shape_018")])
    torch.manual_seed(0)
    model = CaptionModel(
        ModelConfig(dim=16, layers=1, heads=2, patch=16),
        encoder.tokenizer.vocab_size,
        32,
        media_of(encoder),
    )
    loss = model(batch)
    batch.points = batch.points.flip(1) * 0.5
    assert not torch.equal(loss, model(batch)), "the loss must depend on the points"


@pytest.mark.slow
def test_sigkill_mid_step_of_the_reference_trainer_resumes_bit_exact(shards, tmp_path):
    import yaml

    from energon_platform.training.resume_check import RunSpec, check_resume

    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(shards), "val_split": None},
                "encoder": {
                    "encoder": "pointcloud_text",
                    "text": {"seq_len": 32},
                    "pointcloud": SMALL,
                },
                "loader": {"global_batch_size": 4, "num_workers": 2, "seed": 5},
                "model": {"dim": 32, "layers": 1, "heads": 2, "patch": 16},
                "train": {"steps": 8, "checkpoint_every": 3, "warmup": 2},
            }
        )
    )
    result = check_resume(
        RunSpec(str(config), 8), kill_at=5, out=tmp_path / "check", log=lambda *_: None
    )
    assert result["passed"] and result["max_abs_loss_diff"] == 0.0, {
        k: v for k, v in result.items() if k != "rows"
    }
