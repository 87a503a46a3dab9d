"""``check-resume`` edges: an ``--out`` it did not make is refused before anything
runs; ``{out}`` is an absolute path quoted for where it stands in the command; a log counted from
0 is checked like one counted from 1; a trainer whose log lies about ``resumed_from`` fails.

Each check runs a small fake trainer (no torch, a few tenths of a second per run)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from energon_platform.training.checkpoint import CheckpointError
from energon_platform.training.resume_check import (
    CommandSpec,
    RunFailed,
    RunSpec,
    check_resume,
    check_resume_cmd,
    verdict,
)
from tests.helpers.cli import run_cli

PY = shlex.quote(sys.executable)
QUIET = {"log": lambda *_: None}

FAKE = textwrap.dedent("""
    # a fake trainer: writes its own JSON step log (fsynced), checkpoints every 2 steps
    import json, os, sys, time
    from pathlib import Path
    out, steps, args = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    base = 0 if "--base0" in args else 1  # the step number of the first step
    lie = int(args[args.index("--lie") + 1]) if "--lie" in args else 0
    (out / "ran").write_text("yes")
    done = int((out / "ckpt").read_text()) if "--resume" in args and (out / "ckpt").exists() else 0
    claimed = done + lie
    if "--restart" in args:  # starts over, yet claims to continue from the checkpoint
        done = 0
    # every step logged at once (one write); the run the check kills then lingers, alive
    burst = "--burst" in args
    with open(out / "steps.jsonl", "a") as log:
        for i in range(done, steps):
            time.sleep(0 if burst else 0.04)
            if (i + 1) % 2 == 0:  # a step's checkpoint is complete before the step is logged
                (out / "ckpt.tmp").write_text(str(i + 1))
                (out / "ckpt.tmp").replace(out / "ckpt")
            row = {"step": i + base, "loss": 1.0 / (i + 1), "keys": [f"k{i}"], "batch_sha256": f"b{i}"}
            if "--resume" in args and i == done:
                row["resumed_from"] = claimed
            log.write(json.dumps(row) + "\\n")
            if not burst:
                log.flush()
                os.fsync(log.fileno())
        log.flush()
        os.fsync(log.fileno())
    if burst and out.parent.name == "killed":
        time.sleep(60)
""")


@pytest.fixture
def fake(tmp_path) -> str:
    """The fake's command line, with {out} bare and 10 steps."""
    path = tmp_path / "fake trainer.py"
    path.write_text(FAKE)
    return f"{PY} {shlex.quote(str(path))} {{out}} 10"


def cli(*argv, cwd=None) -> subprocess.CompletedProcess:
    return run_cli("check-resume", *argv, timeout=300, cwd=cwd)


# ---------------------------------------------------------------- 1. an --out it did not make


def dataset_like(folder: Path) -> dict[str, bytes]:
    """A converted dataset's files (report.json records every shard's sha256); returns them."""
    (folder / ".nv-meta").mkdir(parents=True)
    (folder / ".nv-meta" / "split.yaml").write_text("split_parts: {train: [shard-000000.tar]}\n")
    (folder / "shard-000000.tar").write_bytes(b"\0" * 1024)
    (folder / "report.json").write_text(
        json.dumps(
            {
                "totals": {"written": 3},
                "shards": [{"name": "shard-000000.tar", "sha256": "ab" * 32}],
            }
        )
    )
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("content", ["dataset", "report-only", "other-file", "plot-only"])
def test_an_out_holding_files_check_resume_did_not_write_is_refused_before_running(
    fake, tmp_path, content
):
    out = tmp_path / "target"
    if content == "dataset":
        before = dataset_like(out)
    else:
        out.mkdir()
        name = {"report-only": "report.json", "other-file": "notes.txt", "plot-only": "loss.png"}[
            content
        ]
        (out / name).write_text('{"totals": {}, "shards": []}' if name == "report.json" else "mine")
        before = {name: (out / name).read_bytes()}
    r = cli(
        "--cmd",
        fake,
        "--resume-cmd",
        fake + " --resume",
        "--steps",
        10,
        "--kill-at",
        7,
        "--out",
        out,
    )
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "which check-resume did not write" in err[0], (
        r.stderr
    )
    assert str(out) in err[0] and "choose another --out" in err[0]
    after = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing deleted, nothing ran
    # the --config form too
    with pytest.raises(CheckpointError, match="which check-resume did not write"):
        check_resume(RunSpec("never-read.yaml", 6), 4, out, **QUIET)
    assert {
        str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()
    } == before


def test_a_folder_an_earlier_check_made_is_reused(fake, tmp_path):
    (tmp_path / "scratch").mkdir()
    out = tmp_path / "check"
    out.symlink_to(tmp_path / "scratch")  # --out may be a link to another disk
    for _ in range(2):
        result = check_resume_cmd(CommandSpec(fake, fake + " --resume", 10), 7, out, **QUIET)
        assert result["passed"], verdict(result)
    assert sorted(p.name for p in out.iterdir()) == [
        "killed",
        "loss.png",
        "report.json",
        "straight",
    ]
    # a run folder's own out/ is the command's: still ours
    (out / "killed" / "out" / "mine.txt").write_text("x")
    assert check_resume_cmd(CommandSpec(fake, fake + " --resume", 10), 7, out, **QUIET)["passed"]
    (out / "straight" / "mine.txt").write_text("x")  # beside the run's files: not ours
    with pytest.raises(CheckpointError, match="straight: holds mine.txt"):
        check_resume_cmd(CommandSpec(fake, fake + " --resume", 10), 7, out, **QUIET)
    # refused before either run folder was emptied
    assert (out / "killed" / "out" / "steps.jsonl").exists()
    (out / "straight" / "mine.txt").unlink()
    shutil.rmtree(out / "killed")
    # a run folder is deleted whole: never through a link
    (out / "killed").symlink_to(tmp_path / "scratch")
    with pytest.raises(CheckpointError, match="killed: a link check-resume did not make"):
        check_resume_cmd(CommandSpec(fake, fake + " --resume", 10), 7, out, **QUIET)
    assert (out / "straight" / "out" / "steps.jsonl").exists()


# ---------------------------------------------------------------- 2. {out}: absolute, quoted once


@pytest.mark.parametrize(
    "placeholder", ["{out}", "'{out}'", '"{out}"'], ids=["bare", "single-quoted", "double-quoted"]
)
def test_out_is_absolute_and_quoted_once_wherever_the_placeholder_stands(tmp_path, placeholder):
    fake = tmp_path / "fake trainer.py"
    fake.write_text(FAKE)
    cmd = f"cd / && {PY} {shlex.quote(str(fake))} {placeholder} 10"  # a command that runs elsewhere
    # relative, with a space and quotes
    r = cli(
        "--cmd",
        cmd,
        "--resume-cmd",
        cmd + " --resume",
        "--steps",
        10,
        "--kill-at",
        7,
        "--out",
        "dir with 'space'",
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr[-3000:]
    out = tmp_path / "dir with 'space'"
    assert (out / "straight" / "out" / "ran").exists() and (out / "killed" / "out" / "ran").exists()
    report = json.loads((out / "report.json").read_text())
    # one word, absolute
    assert str(out / "straight" / "out") in shlex.split(report["commands"]["straight"])


# ---------------------------------------------------------------- 3. a log counted from 0


def test_a_log_counted_from_zero_is_checked_like_one_counted_from_one(fake, tmp_path):
    result = check_resume_cmd(
        CommandSpec(fake + " --base0", fake + " --base0 --resume", 10), 7, tmp_path / "c", **QUIET
    )
    assert result["passed"] and result["first_step"] == 0 and not result["missing_steps"], verdict(
        result
    )
    # killed once step 6 (the 7th) was logged, after the checkpoint of 6 steps: resumes at step 6
    assert (
        result["resume_step"] == 6
        and result["first_resumed_step"] == 6
        and result["steps_compared"] == 4
    )
    assert "the log counts steps from 0" in verdict(result)
    result = check_resume_cmd(
        CommandSpec(fake + " --base0", fake + " --base0", 10), 7, tmp_path / "c", **QUIET
    )
    assert not result["passed"] and "started again from step 0" in verdict(result), verdict(result)


def test_kill_at_past_the_last_step_of_a_log_counted_from_zero_is_one_line(fake, tmp_path):
    r = cli(
        "--cmd",
        fake + " --base0",
        "--resume-cmd",
        fake + " --base0 --resume",
        "--steps",
        10,
        "--kill-at",
        10,
        "--out",
        tmp_path / "c",
    )
    err = r.stderr.strip().splitlines()
    assert (
        r.returncode == 2
        and len(err) == 1
        and "counts steps from 0" in err[0]
        and "between 2 and 9" in err[0]
    ), r.stderr


def test_a_kill_that_lands_after_the_last_step_is_named_not_compared(fake, tmp_path):
    """A trainer that logs every step before the kill lands (a loaded machine, a fast trainer)
    leaves nothing to resume: the check stops with a message saying so, not with a comparison
    of a resume that logged no step."""
    with pytest.raises(RunFailed, match=r"logged its last step \(10\) before the kill"):
        check_resume_cmd(
            CommandSpec(fake + " --burst", fake + " --resume", 10), 7, tmp_path / "c", **QUIET
        )


# ---------------------------------------------------------------- 4. a log that lies about resumed_from


@pytest.mark.parametrize(
    "lie",
    [" --lie 2", " --lie -2", " --restart"],
    ids=["claims-later", "claims-earlier", "restarts-claiming-a-resume"],
)
def test_a_trainer_whose_log_lies_about_resumed_from_fails(fake, tmp_path, lie):
    result = check_resume_cmd(
        CommandSpec(fake, fake + " --resume" + lie, 10), 7, tmp_path / "c", **QUIET
    )
    assert not result["passed"] and not result["restored"], verdict(result)
    assert verdict(result).startswith("FAIL")
    if lie != " --restart":  # the batches agree: only the log's own word gives it away
        assert (
            result["keys_identical"]
            and result["tensors_identical"]
            and result["max_abs_loss_diff"] == 0
        )
        assert (
            result["resumed_from_logged"] == 6 + int(lie.split()[-1]) and result["resume_step"] == 6
        )
        assert f"says resumed_from={6 + int(lie.split()[-1])}, but its first step is 7" in verdict(
            result
        )


# ---------------------------------------------------------------- a NaN loss anywhere in the compared steps


def steps_with_loss(first: int, last: int, nan_at: int | None = None) -> dict[int, dict]:
    """Rows ``first..last`` as a log holds them (keys, digest, loss), the loss NaN at ``nan_at``."""
    return {
        s: {
            "step": s,
            "keys": [f"k{s}"],
            "batch_sha256": f"b{s}",
            "loss": float("nan") if s == nan_at else 1.0 / s,
        }
        for s in range(first, last + 1)
    }


@pytest.mark.parametrize("side", ["resumed", "straight", "both"])
@pytest.mark.parametrize("nan_at", [6, 8, 10])
def test_a_nan_loss_at_any_compared_step_fails(side, nan_at):
    from energon_platform.training.resume_check import compare

    straight = steps_with_loss(1, 10, nan_at if side in ("straight", "both") else None)
    resumed = steps_with_loss(6, 10, nan_at if side in ("resumed", "both") else None)
    assert compare(steps_with_loss(1, 10), steps_with_loss(6, 10), 6, 10, 0.0)["passed"]
    result = compare(straight, resumed, 6, 10, 0.0)
    assert not result["passed"] and result["max_abs_loss_diff"] != result["max_abs_loss_diff"], (
        result
    )
    assert result["keys_identical"] and result["tensors_identical"]  # the loss alone fails it


def test_a_report_with_a_nan_loss_is_strict_json(tmp_path):
    """JSON has no NaN: the report writes null where the comparison found none."""
    from energon_platform.training.resume_check import compare
    from energon_platform.training.resume_check.out_folder import write_report

    result = compare(steps_with_loss(1, 10, 8), steps_with_loss(6, 10), 6, 10, 0.0)
    write_report(tmp_path, {**result, "nested": [float("inf"), {"x": float("-inf")}]})

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    report = json.loads((tmp_path / "report.json").read_text(), parse_constant=refuse)
    assert report["max_abs_loss_diff"] is None and report["nested"] == [None, {"x": None}]
    assert report["passed"] is False


def test_timeout_bounds_each_run_of_the_reference_trainer_too(spike_run, tmp_path):
    """``--timeout`` was read only with ``--cmd``: the --config form waited as long as a run took."""
    argv = ["check-resume", "--config", spike_run["config"], "--steps", "16", "--kill-at", "12"]
    r = run_cli(*map(str, argv), "--timeout", "1", "--out", str(tmp_path / "check"), timeout=120)
    assert r.returncode == 1 and "still running after 1 s, killed" in r.stderr, r.stderr[-2000:]


def test_a_folder_an_earlier_trainer_check_made_is_reused_with_the_runs_records(tmp_path):
    """The reference trainer records itself (run.yaml, run.json) in each run folder: a second
    check into the same --out takes them as its own."""
    from energon_platform.training.resume_check.out_folder import claim_out
    from energon_platform.training.resume_check.trainer import RUN_FILES

    out = tmp_path / "check"
    for run in ("straight", "killed"):
        (out / run / "checkpoints" / "step_000002").mkdir(parents=True)
        for name in ("log.jsonl", "stdout.txt", "run.yaml", "run.json"):
            (out / run / name).write_text("{}\n")
    report = {"steps_compared": 2, "resume_step": 2, "passed": True, "rows": []}
    (out / "report.json").write_text(json.dumps(report))
    straight, killed = claim_out(out, RUN_FILES)
    assert straight.is_dir() and killed.is_dir()


def test_an_out_inside_a_runs_checkpoints_or_a_dataset_is_refused_by_the_output_rule(tmp_path):
    from energon_platform.training.resume_check.out_folder import claim_out
    from energon_platform.training.resume_check.trainer import RUN_FILES
    from storage.outputs import OutputError

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "log.jsonl").write_text("{}\n")
    record = {"command": ["energon-platform", "train"], "versions": {}, "started": "2026-01-01"}
    (run / "run.json").write_text(json.dumps(record))  # what makes it a run's folder
    dataset = tmp_path / "dataset"
    (dataset / ".nv-meta").mkdir(parents=True)
    for out, why in (
        (run / "checkpoints" / "check", "inside the checkpoints of the run"),
        (dataset / "check", "inside the dataset"),
    ):
        with pytest.raises(OutputError, match=why):
            claim_out(out, RUN_FILES)
        assert not out.exists()
