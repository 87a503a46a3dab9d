"""The reference trainer on a blend of modalities: mixed batches train, SIGKILL + resume is exact,
per-dataset accounting is logged and reported."""

from __future__ import annotations

import json

import pytest
import yaml

from energon_platform.training.resume_check import RunSpec, check_resume, read_log
from scripts.bench.data import three_modality_blend
from tests.helpers import REPO
from tests.helpers import run_configs as configs


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """The embedded image-text, audio-text and text-only corpora, converted: a metadataset at 2:1:1."""
    return three_modality_blend(tmp_path_factory.mktemp("blend-train"), val=True)


def loader_config(mds, **loader):
    from energon_platform.config import load_config

    data = {"path": str(mds), "val_split": None}
    loader = {"global_batch_size": 8, "seed": 5, **loader}
    return load_config(
        configs.loader_config(data, REPO / "configs/encoders/multimodal.yaml", **loader)
    )


def global_batches(config, steps, ranks, workers, state=None):
    from energon_platform.loader.train_loader import TrainLoader
    from energon_platform.training.train import batch_digest

    loaders = [
        TrainLoader(config, rank=r, world_size=ranks, num_workers=workers) for r in range(ranks)
    ]
    for ld in loaders:
        if state is not None:
            ld.load_state_dict(state)
    out = []
    for _ in range(steps):
        parts = [next(ld) for ld in loaders for _ in range(ld.accumulation)]
        out.append(
            ([k for p in parts for k in p.keys], [d for p in parts for d in batch_digest(p)])
        )
    saved = loaders[0].state_dict()
    for ld in loaders:
        ld.close()
    return out, saved


def test_three_modality_blend_counts_exact_in_every_prefix(three):
    import numpy as np

    batches, _ = global_batches(loader_config(three), 12, 1, 0)
    stream = [k.split(":")[0] for keys, _ in batches for k in keys]
    for name, w in (("coco_mini", 0.5), ("librispeech_mini", 0.25), ("text_mini", 0.25)):
        hits = np.cumsum([d == name for d in stream])
        n = np.arange(1, len(stream) + 1)
        assert np.abs(hits - w * n).max() < 1, name
        assert np.abs((hits[8:] - hits[:-8]) - w * 8).max() < 2


@pytest.mark.slow
@pytest.mark.parametrize("saved,resumed", [((2, 2), (1, 1)), ((1, 0), (2, 2))])
def test_three_modality_blend_resumes_on_another_layout(three, saved, resumed):
    config = loader_config(three, micro_batch_size=2)
    reference, _ = global_batches(config, 8, 1, 0)
    before, state = global_batches(config, 3, *saved)
    after, _ = global_batches(config, 5, *resumed, state=state)
    assert before == reference[:3] and after == reference[3:]
    keys = [k for ks, _ in reference for k in ks]
    per = {}
    for k in keys:
        per.setdefault(k.split(":")[0], []).append(k)
    # exactly once per dataset epoch: no repeat before a dataset's epoch is complete
    assert len(set(per["coco_mini"])) == len(per["coco_mini"])


@pytest.fixture(scope="module")
def blend_config(three):
    base, mds = three.parent, three
    config = base / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(mds)},
                "encoder": str(REPO / "configs/encoders/multimodal.yaml"),
                "loader": {"global_batch_size": 6, "num_workers": 2, "seed": 11},
                "model": {"dim": 32, "layers": 1, "heads": 2, "patch": 16},
                "train": {"steps": 8, "checkpoint_every": 3, "warmup": 2},
            }
        )
    )
    return config


@pytest.mark.slow
def test_sigkill_on_a_modality_blend_resumes_bit_exact_with_accounting(blend_config, tmp_path):
    result = check_resume(
        RunSpec(str(blend_config), 8), kill_at=5, out=tmp_path / "check", log=lambda *_: None
    )
    assert result["passed"] and result["resume_step"] == 3 and result["max_abs_loss_diff"] == 0.0, (
        result
    )
    rows = read_log(tmp_path / "check" / "straight" / "log.jsonl")
    names = sorted(rows[8]["datasets"])
    assert names == ["coco_mini", "librispeech_mini", "text_mini"]
    assert {n: rows[8]["datasets"][n]["samples"] for n in names} == {
        "coco_mini": 24,
        "librispeech_mini": 12,
        "text_mini": 12,
    }
    keys = [k for r in rows.values() for k in r["keys"]]
    assert {k.split(":")[0] for k in keys} == set(names), (
        "keys say which dataset a sample came from"
    )
    assert all("val_loss" in rows[s] for s in (3, 6, 8))
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert report["datasets"] == rows[8]["datasets"]
