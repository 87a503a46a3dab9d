"""scripts/soak_resume.py: a short kill soak of the reference trainer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.slow
def test_short_soak_survives_every_kill_and_matches_the_uninterrupted_run(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "soak_resume.py"),
            "--kills",
            "4",
            "--steps",
            "12",
            "--seed",
            "3",
            "--max-minutes",
            "8",
            "--out",
            str(tmp_path / "soak"),
            "--json",
            str(tmp_path / "soak.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["passed"] and report["kills_made"] == report["kills_survived"] == 4
    assert (
        report["batches_checked"] == 12
        and report["every_batch_once_in_order"]
        and not report["rows_mismatched"]
    )
    assert report["time_lost_per_kill_s"]["mean"] > 0 and len(report["layouts_used"]) >= 2
    killed = [a for a in report["attempts"] if a["killed"]]
    assert all(a["survived"] for a in killed) and report["attempts"][-1]["exit"] == 0
    assert "kills survived 4/4" in r.stdout and "time lost per kill" in r.stdout


@pytest.mark.slow
def test_short_soak_of_a_balanced_blend_survives_start_up_kills(tmp_path):
    """``--config``: the packed three-modality blend with ``loader.balance``; the seed's plan kills
    the first two processes during start-up (the first one while it builds the length index)."""
    import yaml

    from scripts.bench.data import three_modality_blend

    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(three_modality_blend(tmp_path / "data")), "val_split": None},
                "encoder": str(REPO / "configs/encoders/multimodal_packed.yaml"),
                "loader": {
                    "global_batch_size": 8,
                    "micro_batch_size": 4,
                    "num_workers": 2,
                    "seed": 1,
                    "balance": "attention",
                },
                "model": {"dim": 16, "layers": 1, "heads": 2, "patch": 16},
                "train": {"checkpoint_every": 3, "warmup": 1},
            }
        )
    )
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "soak_resume.py"),
            "--config",
            str(config),
            "--kills",
            "3",
            "--steps",
            "9",
            "--seed",
            "11",
            "--max-workers",
            "2",
            "--max-minutes",
            "8",
            "--out",
            str(tmp_path / "soak"),
            "--json",
            str(tmp_path / "soak.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["passed"] and report["kills_made"] == report["kills_survived"] == 3
    assert report["kills_landed"]["startup"] >= 2, report["kills_landed"]
    assert (
        report["batches_checked"] == 9
        and report["every_batch_once_in_order"]
        and not report["rows_mismatched"]
    )
    chain = "".join(p.read_text() for p in (tmp_path / "soak" / "soak").rglob("stdout*.txt"))
    assert "(building it now)" in chain, "the chain builds the length index again, as a new job"
