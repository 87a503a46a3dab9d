"""The loss-spike part of ``make demo`` (``scripts/demo.py``'s ``spike_loop``) runs on the
converted COCO corpus: the planted documents named at the top of the spike, the replay's steps
before it the original's, and ``report.html`` written with the replay drawn against the run."""

from __future__ import annotations

import pytest

from scripts.bench.data import coco_dataset
from tests.helpers.cli import run_python

LOOP = "from pathlib import Path; from scripts import demo; "


@pytest.mark.slow
def test_demo_spike_loop_replays_without_the_planted_samples_and_writes_the_report(
    tmp_path_factory, tmp_path
):
    coco = coco_dataset(tmp_path_factory.getbasetemp())
    code = LOOP + f"demo.spike_loop(Path({str(tmp_path)!r}), Path({str(coco)!r}))"
    done = run_python(code, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    planted = done.stdout.split("(documents ")[1].split(" of step")[0].split(" and ")
    listing = done.stdout.split("--top 3\n")[1].splitlines()
    assert listing[0].startswith("step 13  loss ")
    assert {line.split()[1] for line in listing[1:3]} == set(planted)
    assert "steps 9-12 are the original's" in done.stdout
    assert "the replayed loss first differs at step 13" in done.stdout
    report = (tmp_path / "report.html").read_text()
    # the run folders named relative to the report's own folder, no absolute path
    assert "<td>spike/run</td>" in report and "<td>spike/replay</td>" in report
    assert str(tmp_path) not in report
