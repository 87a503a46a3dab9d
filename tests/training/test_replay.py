"""``energon-platform replay``: from a planted spike to its samples, their exclusion rules, a
replay from the checkpoint before it without the spike, and the report of both runs."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from energon_platform import cli
from energon_platform.training.replay import MARK, claim_out
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
        (out / MARK).write_text("{}")
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
    before = folder_digest(run)
    args = [str(a) for k, v in argv.items() for a in (k, v) if a is not None]
    assert cli.main(["replay", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert folder_digest(run) == before and not (run / "replay").exists()
    if case == "overwrite a training run":
        assert folder_digest(out) == before  # nothing of the run there was touched
    elif case != "overwrite a foreign folder":
        assert not (out / "checkpoints").exists()


def test_replay_onto_a_live_replay_is_refused_by_its_run_lock(spike_run, capsys, tmp_path):
    """A replay into a folder another process is training in (it holds the folder's run lock)
    is refused in one line, and the live run's files stay."""
    out = tmp_path / "replay"
    (out / "checkpoints").mkdir(parents=True)
    (out / MARK).write_text("{}")
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
    assert (out / "log.jsonl").read_text() == '{"step": 1}\n' and (out / MARK).is_file()


def test_overwrite_empties_a_folder_an_earlier_replay_left_but_keeps_its_lock(tmp_path):
    out = tmp_path / "replay"
    (out / "checkpoints" / "step_000008").mkdir(parents=True)
    (out / "checkpoints" / ".run.lock").write_text("")
    (out / "log.jsonl").write_text("{}\n")
    (out / MARK).write_text("{}\n")
    for record in ("run.yaml", "run.json"):  # what the replay's trainer records of itself
        (out / record).write_text("{}\n")
    claim_out(out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "checkpoints",
        "checkpoints/.run.lock",
    ]
