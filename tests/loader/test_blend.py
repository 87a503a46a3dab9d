"""Blends through energon_platform's loader: Energon metadatasets, exact ratios, per-dataset
epochs, exact and elastic resume, weights that change, datasets added, constructs refused."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from energon_platform.config import load_config
from energon_platform.loader.state import StateMismatchError
from energon_platform.loader.train_loader import TrainLoader
from energon_platform.training.train import batch_digest
from storage import DatasetError
from tests.conftest import _convert, _image_item
from tests.helpers import REPO

IMAGE = str(REPO / "configs/encoders/image_text_small.yaml")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    """Three image-text datasets of 24, 10 and 6 samples in one folder: ``big``, ``small``, ``tiny``."""
    root = tmp_path_factory.mktemp("blend")
    for name, n, offset in (("big", 24, 0), ("small", 10, 100), ("tiny", 6, 200)):
        _convert(
            "image_text",
            [_image_item(offset + i, False) for i in range(n)],
            root / f"raw-{name}",
            root / name,
        )
    return root


def metadataset(root: Path, name: str, split: dict) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {"train": split},
            }
        )
    )
    return path


def blend_of(root: Path, name: str, **weights: float) -> Path:
    return metadataset(
        root, name, {"blend": [{"weight": w, "path": f"./{d}"} for d, w in weights.items()]}
    )


def cfg(path: Path, **loader):
    return load_config(
        {
            "data": {"path": str(path), "val_split": None},
            "encoder": IMAGE,
            "loader": {"global_batch_size": 8, "num_workers": 0, **loader},
        }
    )


def keys_of(
    config,
    steps: int,
    ranks: int = 1,
    workers: int = 0,
    state: dict | None = None,
    digests: bool = False,
) -> list:
    loaders = [
        TrainLoader(config, rank=r, world_size=ranks, num_workers=workers) for r in range(ranks)
    ]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    out = []
    for _ in range(steps):
        parts = [next(loader) for loader in loaders for _ in range(loader.accumulation)]
        keys = [k for p in parts for k in p.keys]
        out.append((keys, [d for p in parts for d in batch_digest(p)]) if digests else keys)
    for loader in loaders:
        loader.close()
    return out


def dataset_of(key: str) -> str:
    return key.split(":")[0]


def test_realised_counts_within_one_in_every_prefix_and_two_in_every_window(corpora):
    config = cfg(blend_of(corpora, "b31", big=3, small=1))
    stream = [dataset_of(k) for batch in keys_of(config, 16) for k in batch]
    assert len(stream) == 128
    for name, w in (("big", 0.75), ("small", 0.25)):
        hits = np.cumsum([d == name for d in stream])
        n = np.arange(1, len(stream) + 1)
        assert np.abs(hits - w * n).max() < 1, name
        for length in (8, 13, 32):
            window = hits[length:] - hits[:-length]
            assert np.abs(window - w * length).max() < 2
    assert Counter(stream) == {"big": 96, "small": 32}


def test_each_dataset_walks_its_own_epochs_once_per_epoch(corpora):
    config = cfg(blend_of(corpora, "b11", big=1, small=1))
    # 40 of each: 1.67 epochs of big, 4 of small
    keys = [k for batch in keys_of(config, 10) for k in batch]
    small = [k for k in keys if dataset_of(k) == "small"]
    epochs = [small[i : i + 10] for i in range(0, 40, 10)]
    assert all(len(set(e)) == 10 for e in epochs), (
        "a small-dataset epoch repeated or skipped a sample"
    )
    assert epochs[0] != epochs[1], "the next epoch must have a new order"
    big = [k for k in keys if dataset_of(k) == "big"]
    assert len(set(big[:24])) == 24
    loader = TrainLoader(config)
    loader.next_microbatch = 10
    assert loader.consumed() == {
        "big": {"samples": 40, "epochs": round(40 / 24, 6)},
        "small": {"samples": 40, "epochs": 4.0},
    }


def test_same_dataset_twice_has_independent_orders(corpora):
    path = metadataset(
        corpora,
        "twice",
        {"blend": [{"weight": 1, "path": "./small"}, {"weight": 1, "path": "./small"}]},
    )
    keys = [k for batch in keys_of(cfg(path), 5) for k in batch]
    a = [k.split(":", 1)[1] for k in keys if dataset_of(k) == "small"]
    b = [k.split(":", 1)[1] for k in keys if dataset_of(k) == "small#2"]
    assert len(a) == len(b) == 20 and sorted(a[:10]) == sorted(b[:10]) and a[:10] != b[:10]


@pytest.mark.parametrize("saved,resumed", [((2, 2), (1, 1)), ((1, 0), (2, 2))])
def test_blend_resumes_exactly_on_another_layout(corpora, saved, resumed):
    config = cfg(blend_of(corpora, "b312", big=3, small=1, tiny=2), micro_batch_size=2)
    reference = keys_of(config, 12, digests=True)
    loaders = [
        TrainLoader(config, rank=r, world_size=saved[0], num_workers=saved[1])
        for r in range(saved[0])
    ]
    before = []
    for _ in range(5):
        parts = [next(ld) for ld in loaders for _ in range(ld.accumulation)]
        before.append(
            ([k for p in parts for k in p.keys], [d for p in parts for d in batch_digest(p)])
        )
    state = loaders[0].state_dict()  # what the saving run holds after 5 steps
    for ld in loaders:
        ld.close()
    assert before == reference[:5]
    loaders = [
        TrainLoader(config, rank=r, world_size=resumed[0], num_workers=resumed[1])
        for r in range(resumed[0])
    ]
    after = []
    for ld in loaders:
        ld.load_state_dict(state)
    for _ in range(7):
        parts = [next(ld) for ld in loaders for _ in range(ld.accumulation)]
        after.append(
            ([k for p in parts for k in p.keys], [d for p in parts for d in batch_digest(p)])
        )
    for ld in loaders:
        ld.close()
    assert after == reference[5:], (
        "the resumed layout must produce the same global batches and tensors"
    )


def test_blend_epochized_repetitions_are_exact(corpora):
    path = metadataset(
        corpora,
        "epochized",
        {
            "blend_epochized": [
                {"repetitions": 2, "path": "./small"},
                {"repetitions": 0.5, "path": "./tiny"},
            ]
        },
    )
    # 23 x 8 = 184 = 8 blend epochs of 23
    stream = [dataset_of(k) for batch in keys_of(cfg(path), 23) for k in batch]
    epoch = 2 * 10 + 3
    for e in range(8):
        part = Counter(stream[e * epoch : (e + 1) * epoch])
        assert part == {"small": 20, "tiny": 3}


def test_nested_blend_multiplies_weights_down(corpora):
    metadataset(
        corpora,
        "inner",
        {"blend": [{"weight": 1, "path": "./small"}, {"weight": 1, "path": "./tiny"}]},
    )
    outer = metadataset(
        corpora,
        "outer",
        {"blend": [{"weight": 1, "path": "./big"}, {"weight": 1, "path": "./inner.yaml"}]},
    )
    stream = Counter(dataset_of(k) for batch in keys_of(cfg(outer), 8) for k in batch)
    assert stream == {"big": 32, "small": 16, "tiny": 16}


def test_the_older_metadataset_format_works(corpora):
    path = corpora / "old.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "Metadataset",
                "splits": {
                    "train": {
                        "datasets": [
                            {"weight": 1, "path": "./big"},
                            {"weight": 3, "path": "./small"},
                        ]
                    }
                },
            }
        )
    )
    assert Counter(dataset_of(k) for batch in keys_of(cfg(path), 4) for k in batch) == {
        "big": 8,
        "small": 24,
    }


def test_unsupported_constructs_are_refused_with_file_and_key(corpora):
    path = metadataset(corpora, "join", {"join": [{"path": "./big"}, {"path": "./small"}]})
    with pytest.raises(
        DatasetError,
        match=r"join\.yaml: splits\.train\.join: 'join' is not supported.*supported: blend",
    ):
        TrainLoader(cfg(path))
    path = metadataset(
        corpora, "subset", {"blend": [{"weight": 1, "path": "./big", "subset": {"range": [0, 5]}}]}
    )
    with pytest.raises(DatasetError, match=r"splits\.train\.blend\[0\]\.subset"):
        TrainLoader(cfg(path))


def test_weights_changed_at_resume_keep_the_past_and_are_recorded(corpora):
    even = cfg(blend_of(corpora, "even", big=1, small=1))
    straight = keys_of(even, 8)
    loader = TrainLoader(even)
    for _ in range(4):
        next(loader)
    state = loader.state_dict()
    loader.close()
    skewed = cfg(blend_of(corpora, "even", big=3, small=1))  # same file, new weights
    resumed = TrainLoader(skewed)
    resumed.load_state_dict(state)
    assert resumed.plan.blend_changes and "from global batch 4" in resumed.plan.blend_changes[0]
    after = [list(next(resumed).keys) for _ in range(4)]
    assert Counter(dataset_of(k) for b in after for k in b) == {"big": 24, "small": 8}
    # nothing repeated: the small dataset continues where the even blend left it
    small_before = [k for b in straight[:4] for k in b if dataset_of(k) == "small"]
    small_after = [k for b in after for k in b if dataset_of(k) == "small"]
    assert len(set(small_before + small_after)) == 10 and len(small_before + small_after) == 24
    later = resumed.state_dict()
    assert [s["start"] for s in later["blend"]] == [0, 32]
    # a second resume from the later state, same new config: the same history and batches
    again = TrainLoader(skewed)
    again.load_state_dict(later)
    assert not again.plan.blend_changes
    assert [list(next(again).keys) for _ in range(2)] == [
        list(next(resumed).keys) for _ in range(2)
    ]
    resumed.close()
    again.close()


def test_blend_schedule_changes_weights_at_the_step(corpora):
    config = cfg(
        blend_of(corpora, "curriculum", big=1, small=1),
        blend_schedule=[{"step": 3, "weights": {"big": 1}}],
    )
    batches = keys_of(config, 6)
    assert all(any(dataset_of(k) == "small" for k in b) for b in batches[:3])
    assert all(dataset_of(k) == "big" for b in batches[3:] for k in b)
    with pytest.raises(DatasetError, match="nope"):
        TrainLoader(
            cfg(
                blend_of(corpora, "curriculum", big=1, small=1),
                blend_schedule=[{"step": 3, "weights": {"nope": 1}}],
            )
        )


def test_dataset_added_at_resume_joins_from_then_and_removal_is_refused(corpora):
    two = cfg(blend_of(corpora, "grow", big=1, small=1))
    loader = TrainLoader(two)
    for _ in range(3):
        next(loader)
    state = loader.state_dict()
    loader.close()
    three = TrainLoader(cfg(blend_of(corpora, "grow", big=1, small=1, tiny=2)))
    three.load_state_dict(state)
    after = [k for _ in range(4) for k in next(three).keys]
    assert Counter(map(dataset_of, after)) == {"big": 8, "small": 8, "tiny": 16}
    assert three.consumed()["tiny"]["samples"] == 16
    three.close()
    with pytest.raises(StateMismatchError, match=r"small.*added at resume, not removed"):
        TrainLoader(cfg(blend_of(corpora, "shrink", big=1))).load_state_dict(state)


def test_changed_dataset_content_is_refused_by_name(corpora):
    loader = TrainLoader(cfg(blend_of(corpora, "content", big=1, small=1)))
    next(loader)
    state = loader.state_dict()
    state["fingerprint"]["datasets"]["small"]["shards_sha256"] = "0" * 64
    with pytest.raises(StateMismatchError, match=r"datasets\.small\.shards_sha256"):
        TrainLoader(cfg(blend_of(corpora, "content", big=1, small=1))).load_state_dict(state)


def test_blend_unit_batch_takes_each_micro_batch_from_one_dataset(corpora):
    config = cfg(blend_of(corpora, "unit", big=1, small=1), blend_unit="batch", micro_batch_size=4)
    loader = TrainLoader(config)
    micro = [list(next(loader).keys) for _ in range(8)]
    loader.close()
    assert all(len({dataset_of(k) for k in m}) == 1 for m in micro)
    assert Counter(dataset_of(m[0]) for m in micro) == {"big": 4, "small": 4}


def test_blend_unit_batch_of_a_packing_encoder_takes_each_micro_batchs_documents_from_one_dataset(
    corpora,
):
    """A packed micro-batch holds ``micro_batch_size`` rows of ``pack_group`` documents each: the
    blend unit is all of its documents, not one per row."""
    config = load_config(
        {
            "data": {
                "path": str(blend_of(corpora, "packed-unit", big=1, small=1)),
                "val_split": None,
            },
            "encoder": str(REPO / "configs/encoders/image_text_small_packed.yaml"),
            "loader": {
                "global_batch_size": 2,
                "num_workers": 0,
                "blend_unit": "batch",
                "micro_batch_size": 1,
                "pack_group": 4,
            },
        }
    )
    loader = TrainLoader(config)
    micro = [list(next(loader).keys) for _ in range(6)]
    loader.close()
    assert all(len(m) == 4 for m in micro)  # a row of four documents
    assert all(len({dataset_of(k) for k in m}) == 1 for m in micro), micro
    assert {dataset_of(m[0]) for m in micro} == {"big", "small"}


def test_state_is_plain_json_with_the_blend_history_and_accounting(corpora):
    loader = TrainLoader(cfg(blend_of(corpora, "json", big=3, small=1)))
    for _ in range(2):
        next(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["datasets"] == ["big", "small"] and state["blend"] == [
        {"start": 0, "weights": ["3/4", "1/4"]}
    ]
    assert state["consumed"] == [{"samples": 12, "epochs": 0.5}, {"samples": 4, "epochs": 0.4}]


def test_megatron_provider_takes_a_blend_and_restores_on_another_data_parallel_size(
    corpora, tmp_path
):
    from energon_platform.integrations.megatron import make_provider, save_dataloader_state

    config = {
        "data": {"path": str(blend_of(corpora, "megatron", big=2, small=1)), "val_split": None},
        "encoder": IMAGE,
        "loader": {"global_batch_size": 8, "num_workers": 0},
    }

    def iterators(dp, restore=None):
        its = []
        for rank in range(dp):
            provider = make_provider(
                config,
                dp_rank=rank,
                dp_size=dp,
                micro_batch_size=2,
                global_batch_size=8,
                dataloader_save=tmp_path / "save",
                restore_iteration=restore,
                build_valid=False,
            )
            its.append(provider(None)[0])
        return its

    def iteration(its):
        keys = []
        for it in its:
            for _ in range(it.accumulation):
                next(it)
                keys += list(it.last_keys)
        return keys

    two = iterators(2)
    straight = [iteration(two) for _ in range(5)]
    for it in two:
        it.close()
    two = iterators(2)
    for _ in range(3):
        iteration(two)
    for rank, it in enumerate(two):
        save_dataloader_state(it, tmp_path / "save", 3, rank)
        it.close()
    one = iterators(1, restore=3)
    assert [iteration(one) for _ in range(2)] == straight[3:]
    assert {dataset_of(k) for batch in straight for k in batch} == {"big", "small"}
    one[0].close()
