"""The reference trainer on a blend of modalities: mixed batches train, SIGKILL + resume is exact,
per-dataset accounting is logged and reported."""

from __future__ import annotations

import json

import pytest
import yaml

from demo_datasets import REPO, coco_dataset, librispeech_dataset
from energon_platform.training.resume_check import RunSpec, check_resume, read_log


@pytest.fixture(scope="module")
def blend_config(tmp_path_factory):
    base = tmp_path_factory.mktemp("blend-train")
    coco, speech = coco_dataset(base), librispeech_dataset(base)
    mds = base / "blend.yaml"
    mds.write_text(yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {
        "train": {"blend": [{"weight": 2, "path": str(coco)}, {"weight": 1, "path": str(speech)}]},
        "val": {"blend": [{"weight": 1, "path": str(coco), "split_part": "val"}]}}}))
    config = base / "run.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"path": str(mds)}, "encoder": str(REPO / "configs/encoders/multimodal.yaml"),
        "loader": {"global_batch_size": 6, "num_workers": 2, "seed": 11},
        "model": {"dim": 32, "layers": 1, "heads": 2, "patch": 16},
        "train": {"steps": 8, "checkpoint_every": 3, "warmup": 2}}))
    return config


@pytest.mark.slow
def test_sigkill_on_a_modality_blend_resumes_bit_exact_with_accounting(blend_config, tmp_path):
    result = check_resume(RunSpec(str(blend_config), 8), kill_at=5, out=tmp_path / "check", log=lambda *_: None)
    assert result["passed"] and result["resume_step"] == 3 and result["max_abs_loss_diff"] == 0.0, result
    rows = read_log(tmp_path / "check" / "straight" / "log.jsonl")
    names = sorted(rows[8]["datasets"])
    assert names == ["coco_mini", "librispeech_mini"]
    assert {n: rows[8]["datasets"][n]["samples"] for n in names} == {"coco_mini": 32, "librispeech_mini": 16}
    keys = [k for r in rows.values() for k in r["keys"]]
    assert {k.split(":")[0] for k in keys} == set(names), "keys say which dataset a sample came from"
    assert all("val_loss" in rows[s] for s in (3, 6, 8))
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert report["datasets"] == rows[8]["datasets"]
