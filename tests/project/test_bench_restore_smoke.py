"""``python -m scripts.bench.restore`` end to end at a toy size (ours only, to stay well under 30 s; the
Energon settings run in the full benchmark): it runs, writes the JSON the issue asks for, and the
restored batch is the batch the saving run produced next."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO

#: run as a module from the repository root (``cwd=REPO``)
SCRIPT = ["-m", "scripts.bench.restore"]


@pytest.mark.slow
def test_bench_restore_toy(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            *SCRIPT,
            "--samples",
            "600",
            "--positions",
            "3",
            "--repeats",
            "1",
            "--loaders",
            "ours",
            "--throughput-batches",
            "0",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        capture_output=True,
        cwd=REPO,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dataset"]["num_samples"] == 600 and not report["errors"]
    cell = report["positions"]["3"]["ours"]
    # timings are only reported here (a ratio > 0 proves nothing): that a restore builds only the
    # requested micro-batches is
    # tests/loader/test_state_mismatches_and_compare.py::test_restore_builds_only_the_requested_micro_batches
    for key in ("restore_s", "fresh_s", "ratio"):
        assert isinstance(cell[key], float), (key, cell)
    assert cell["state_bytes"] > 0
    assert cell["restored_batch_matches"] and cell["restored_tensors_match"], cell
    assert "target" in report and "position" in proc.stdout
