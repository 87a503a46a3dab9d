"""``energon-platform replay``: from a planted spike to its samples, their exclusion rules, a
replay from the checkpoint before it without the spike, and the report of both runs; what it
may overwrite (only a replay's folder, whose refusal names only what no replay wrote), and a
full disk (ENOSPC injected into the copy and into the trainer's checkpoint) leaving nothing
half-written."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from energon_platform import cli
from energon_platform.training import checkpoint
from energon_platform.training.replay import MARK, claim_out, foreign, is_replay
from energon_platform.training.spike_samples import LogRows
from energon_platform.training.spikes import find_spikes
from energon_platform.training.step_log_readers import JsonLines
from scripts.planted_spike import PLANTED_STEP
from tests.helpers import REPO


def rows_of(run_dir) -> dict[int, dict]:
    return {r["step"]: r for r in LogRows(run_dir / "log.jsonl", JsonLines())}


def folder_digest(path) -> str:
    """sha256 over the names and bytes of every file under ``path``."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def mark(out, run="/runs/original") -> None:
    """The mark a replay writes first in its folder (what it replays)."""
    (out / MARK).write_text(json.dumps({"run": str(run), "from": 13, "steps": 5}) + "\n")


def planted_replay(run: dict, out, *args: str) -> subprocess.CompletedProcess:
    """``energon-platform replay`` of ``run`` into ``out`` from the planted step, in a process
    where the planted documents are junk wherever they are trained (as in the original run)."""
    argv = ["replay", "--run", run["out"], "--config", run["config"], "--out", out, *args]
    cmd = [sys.executable, "-m", "scripts.planted_spike", "--keys", ",".join(run["planted"])]
    return subprocess.run(
        [*cmd, "--", *map(str, argv)], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def test_replay_without_the_spikes_samples_removes_the_spike_and_keeps_the_steps_before(
    spike_run, capsys, tmp_path
):
    run, before = spike_run, folder_digest(spike_run["out"])
    spikes = ["spikes", "--run", str(run["out"]), "--config", str(run["config"]), "--window", "10"]
    assert cli.main([*spikes, "--json", "--top", "2"]) == 0
    (found,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert found["step"] == PLANTED_STEP
    assert {s["key"] for s in found["samples"]} == set(run["planted"])
    assert cli.main([*spikes, "--exclude-from", str(PLANTED_STEP), "--top", "2"]) == 0
    (tmp_path / "rules.yaml").write_text(capsys.readouterr().out)

    out = tmp_path / "replay"
    rules = f"loader.exclude=@{tmp_path / 'rules.yaml'}"
    done = planted_replay(run, out, "--from", str(PLANTED_STEP), "--steps", "5", "--set", rules)
    assert done.returncode == 0, done.stderr
    assert "steps 9-12 are the original's" in done.stdout
    assert f"the replayed loss first differs at step {PLANTED_STEP}" in done.stdout
    assert f"report --run {run['out']} --compare {out}" in done.stdout

    original, replayed = rows_of(run["out"]), rows_of(out)
    assert sorted(replayed) == list(range(9, PLANTED_STEP + 1))
    for step in range(9, PLANTED_STEP):
        for field in ("keys", "batch_sha256", "loss"):
            assert replayed[step][field] == original[step][field], (step, field)
    assert not set(run["planted"]) & set(replayed[PLANTED_STEP]["keys"])
    history = [original[s] for s in range(1, PLANTED_STEP)] + [replayed[PLANTED_STEP]]
    assert [s["step"] for s in find_spikes(history, window=10)] == []
    assert folder_digest(run["out"]) == before  # the original run is only read

    report = tmp_path / "report.html"
    argv = ["report", "--run", str(run["out"]), "--compare", str(out), "--out", str(report)]
    assert cli.main(argv) == 0 and report.stat().st_size > 0


def test_replay_fails_in_one_line_when_a_step_before_from_is_not_the_originals(
    spike_run, capsys, tmp_path
):
    tampered = tmp_path / "run"
    shutil.copytree(spike_run["out"], tampered)
    rows = [json.loads(line) for line in (tampered / "log.jsonl").read_text().splitlines()]
    rows[10 - 1]["batch_sha256"] = "0" * 64
    (tampered / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["replay", "--run", tampered, "--config", spike_run["config"], "--out", tmp_path / "r"]
    assert cli.main([*map(str, argv), "--from", "11", "--steps", "3"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "energon-platform replay: step 10 of the replay is not the original's (batch digests "
        "differ), though it comes before --from 11: replay with the run's own config and --set "
        "values"
    ]


@pytest.mark.parametrize(
    "case,said",
    [
        ("no checkpoint before", "--from 8: "),
        ("beyond the log", "--from 99: "),
        ("too few steps", "--steps 2: the replay would stop at step 10"),
        ("out not empty", "holds an earlier replay; pass --overwrite"),
        ("overwrite a foreign folder", "holds notes.txt, which no replay wrote"),
        ("overwrite a replay with a user's file", "--out {out}: holds notes.txt, which no replay"),
        ("overwrite a folder with a user's replay.json", "holds replay.json, which no replay"),
        (
            "overwrite a training run",
            "holds checkpoints, log.jsonl, run.json, ..., which no replay wrote",
        ),
        ("out inside the run", "is inside or holds"),
        ("no log", "no step log there"),
    ],
)
def test_replay_refuses_bad_inputs_in_one_line(spike_run, capsys, tmp_path, case, said):
    run, out = spike_run["out"], tmp_path / "replay"
    argv = {"--run": run, "--config": spike_run["config"], "--from": 13, "--steps": 5}
    if case == "no checkpoint before":
        argv["--from"] = 8
    elif case == "beyond the log":
        argv["--from"] = 99
    elif case == "too few steps":
        argv["--steps"] = 2
    elif case == "out not empty":
        out.mkdir()
        (out / "log.jsonl").write_text("")
        mark(out)
    elif case == "overwrite a replay with a user's file":  # M7: only the user's file is named
        (out / "checkpoints").mkdir(parents=True)
        (out / "log.jsonl").write_text("")
        mark(out)
        (out / "notes.txt").write_text("mine")
        argv["--overwrite"] = None
    elif case == "overwrite a folder with a user's replay.json":  # not a replay's mark
        out.mkdir()
        (out / MARK).write_text('{"mine": true}\n')
        argv["--overwrite"] = None
    elif case == "overwrite a training run":  # a run's folder has no replay mark
        shutil.copytree(run, out)
        argv["--overwrite"] = None
    elif case == "overwrite a foreign folder":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        argv["--overwrite"] = None
    elif case == "out inside the run":
        out = run / "replay"
    else:
        argv["--run"] = tmp_path
    before, out_before = folder_digest(run), folder_digest(out) if out.is_dir() else None
    args = [str(a) for k, v in argv.items() for a in (k, v) if a is not None]
    assert cli.main(["replay", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    said = said.format(out=out)
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert folder_digest(run) == before and not (run / "replay").exists()
    if out_before is not None:  # nothing in a refused folder was touched
        assert folder_digest(out) == out_before
    if case == "overwrite a training run":
        assert folder_digest(out) == before  # nothing of the run there was touched
    elif out_before is None:
        assert not (out / "checkpoints").exists()


def test_replay_onto_a_live_replay_is_refused_by_its_run_lock(spike_run, capsys, tmp_path):
    """A replay into a folder another process is training in (it holds the folder's run lock)
    is refused in one line, and the live run's files stay."""
    out = tmp_path / "replay"
    (out / "checkpoints").mkdir(parents=True)
    mark(out)
    (out / "log.jsonl").write_text('{"step": 1}\n')
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from energon_platform.training.checkpoint "
            "import RunLock\nwith RunLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
            str(out / "checkpoints"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = ["--run", spike_run["out"], "--config", spike_run["config"], "--from", 13]
        argv += ["--steps", 5, "--out", out, "--overwrite"]
        assert cli.main(["replay", *map(str, argv)]) == 2
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    err = capsys.readouterr().err
    assert "another training run is using this checkpoint folder" in err, err
    assert len(err.strip().splitlines()) == 1
    assert (out / "log.jsonl").read_text() == '{"step": 1}\n' and is_replay(out)


def test_overwrite_empties_a_folder_an_earlier_replay_left_but_keeps_its_lock(tmp_path):
    out = tmp_path / "replay"
    (out / "checkpoints" / "step_000008").mkdir(parents=True)
    (out / "checkpoints" / ".run.lock").write_text("")
    (out / "log.jsonl").write_text("{}\n")
    mark(out)
    for record in ("run.yaml", "run.json"):  # what the replay's trainer records of itself
        (out / record).write_text("{}\n")
    claim_out(out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "checkpoints",
        "checkpoints/.run.lock",
    ]


def test_a_replays_folder_is_its_mark_and_a_replays_names_only(tmp_path):
    """`is_replay` takes a folder for a replay's only with the mark a replay writes and nothing
    but what a replay writes: a user's file beside a real mark, or a user's own replay.json,
    make it a user's folder, and the refusal names only what no replay wrote."""
    out = tmp_path / "replay"
    (out / "checkpoints" / "step_000008").mkdir(parents=True)
    (out / "log.jsonl").write_text("{}\n")
    mark(out)
    assert is_replay(out) and foreign(out) == []
    (out / "notes.txt").write_text("mine")
    assert not is_replay(out) and foreign(out) == ["notes.txt"]
    (out / "notes.txt").unlink()
    (out / "report.html").mkdir()  # a folder of the user's too
    assert not is_replay(out) and foreign(out) == ["report.html"]
    (out / "report.html").rmdir()
    (out / MARK).write_text('{"mine": true}\n')  # a replay.json a replay did not write
    assert not is_replay(out) and sorted(foreign(out)) == ["checkpoints", "log.jsonl", MARK]
    only_lock = tmp_path / "stopped"  # a replay stopped before its mark: only its run lock
    (only_lock / "checkpoints").mkdir(parents=True)
    (only_lock / "checkpoints" / ".run.lock").write_text("")
    assert is_replay(only_lock)


# --- a full disk: nothing half-written stays ------------------------------------------------


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _full_disk_replay(spike_run, capsys, out, monkeypatch, where: str) -> str:
    """``replay`` into ``out`` with ENOSPC injected ``where``: "copy" (the checkpoint's second
    file copied into --out fails, the first already there) or "checkpoint" (the replay's first
    checkpoint, after steps were trained and logged). Returns its one line."""
    if where == "copy":
        copied, real = [], shutil.copyfile

        def copyfile(src, dst, *args, **kwargs):
            if copied:
                with open(dst, "wb") as f:  # half a file, as a full disk leaves it
                    f.write(b"half")
                _no_space()
            copied.append(dst)
            return real(src, dst, *args, **kwargs)

        monkeypatch.setattr(shutil, "copyfile", copyfile)
    else:
        real_save = checkpoint.save

        def save(*args, **kwargs):
            monkeypatch.setattr(os, "fsync", _no_space)
            return real_save(*args, **kwargs)

        monkeypatch.setattr(checkpoint, "save", save)
    argv = ["--run", spike_run["out"], "--config", spike_run["config"], "--from", 13]
    argv += ["--steps", 5, "--out", out, "--overwrite"]
    status = cli.main(["replay", *map(str, argv)])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("where", ["copy", "checkpoint"])
def test_a_full_disk_leaves_no_half_written_replay_behind(
    spike_run, capsys, tmp_path, monkeypatch, where
):
    """T5: ENOSPC while the checkpoint is copied into a new --out, or while the replay's own
    checkpoint is written: one line naming --out and the cause, and the folder the replay made
    is gone; the original run is only read."""
    before = folder_digest(spike_run["out"])
    out = tmp_path / "replay"
    line = _full_disk_replay(spike_run, capsys, out, monkeypatch, where)
    assert f"--out {out}: the replay could not write there" in line, line
    assert "no space left" in line.lower(), line
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))
    assert folder_digest(spike_run["out"]) == before


def test_a_full_disk_empties_the_replays_folder_it_did_not_make(
    spike_run, capsys, tmp_path, monkeypatch
):
    """T5 on a folder that was there (empty, or an earlier replay under --overwrite): what the
    replay wrote is removed, the folder itself stays, empty."""
    out = tmp_path / "replay"
    out.mkdir()
    _full_disk_replay(spike_run, capsys, out, monkeypatch, "copy")
    assert out.is_dir() and list(out.iterdir()) == []
    (out / "checkpoints").mkdir()
    (out / "log.jsonl").write_text("{}\n")
    mark(out)
    _full_disk_replay(spike_run, capsys, out, monkeypatch, "checkpoint")
    assert out.is_dir() and list(out.iterdir()) == []
