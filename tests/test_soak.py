"""scripts/soak_resume.py: a short kill soak of the reference trainer (issue 14)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from demo_datasets import REPO


@pytest.mark.slow
def test_short_soak_survives_every_kill_and_matches_the_uninterrupted_run(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "soak_resume.py"), "--kills", "4", "--steps", "12",
                        "--seed", "3", "--max-minutes", "8", "--out", str(tmp_path / "soak"),
                        "--json", str(tmp_path / "soak.json")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["passed"] and report["kills_made"] == report["kills_survived"] == 4
    assert report["batches_checked"] == 12 and report["every_batch_once_in_order"] and not report["rows_mismatched"]
    assert report["time_lost_per_kill_s"]["mean"] > 0 and len(report["layouts_used"]) >= 2
    killed = [a for a in report["attempts"] if a["killed"]]
    assert all(a["survived"] for a in killed) and report["attempts"][-1]["exit"] == 0
    assert "kills survived 4/4" in r.stdout and "time lost per kill" in r.stdout
