"""``check-resume --straight-from RUN`` takes a finished run's log as its uninterrupted run only
when the run's record describes that log: the world size ``run.json`` records is the one the log's
rows were written at (else a check on the wrong number of ranks FAILs falsely), and the log reaches
the run's last step (one step short is not finished). Each refusal is one line, before anything
runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from energon_platform import cli
from energon_platform.training.resume_check.trainer import straight_run_spec


def copy_run(spike_run, folder: Path) -> Path:
    """The session's finished 16-step run (its record, config and log; no checkpoints needed)."""
    folder.mkdir()
    for name in ("run.yaml", "run.json", "log.jsonl"):
        shutil.copy(spike_run["out"] / name, folder / name)
    return folder


def refused(capsys, run: Path, out: Path) -> str:
    status = cli.main(
        ["check-resume", "--straight-from", str(run), "--kill-at", "9", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()  # nothing ran, nothing was written
    return err


def rewrite_rows(log: Path, **values) -> None:
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({**r, **values}) + "\n" for r in rows))


@pytest.mark.parametrize("recorded,logged", [(2, 1), (1, 4)])
def test_a_record_whose_world_size_is_not_the_logs_is_named_in_one_line(
    spike_run, capsys, tmp_path, recorded, logged
):
    run = copy_run(spike_run, tmp_path / "run")
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**record, "world_size": recorded}))
    if logged != 1:
        rewrite_rows(run / "log.jsonl", world_size=logged)
    err = refused(capsys, run, tmp_path / "check")
    assert (
        f"--straight-from {run}: run.json records world_size {recorded}, but its log.jsonl was "
        f"written at world_size {logged}; the record is not this log's"
    ) in err


def test_a_run_one_step_short_of_finished_is_not_an_uninterrupted_run(spike_run, capsys, tmp_path):
    run = copy_run(spike_run, tmp_path / "run")
    spec = straight_run_spec(run)  # the finished run: taken, with what it records
    assert (spec.steps, spec.nproc, spec.config) == (16, 1, str(run / "run.yaml"))
    lines = (run / "log.jsonl").read_text().splitlines(True)
    assert json.loads(lines[-1])["step"] == 16
    (run / "log.jsonl").write_text("".join(lines[:-1]))  # killed during its last step
    err = refused(capsys, run, tmp_path / "check")
    assert f"--straight-from {run}: its log reaches step 15 of its 16; let the run finish" in err
    with pytest.raises(ValueError, match="reaches step 15 of its 16"):
        straight_run_spec(run)
