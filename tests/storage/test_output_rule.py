"""The output rule (`storage.outputs`): a command writes only its own output, refuses the rest in
one line before any work, and writes atomically; a training run's folder is one holding the
``run.json`` a run wrote; then each command that writes, held to it (``calibrate``, ``report``,
``preview``, ``train --out``, ``scripts/demo.py --out``; ``replay`` is in
tests/training/test_replay.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from energon_platform.cli import main
from storage.outputs import (
    OutputError,
    check_file,
    check_folder,
    is_run,
    protected_place,
    run_record,
    write_atomic,
)
from tests.helpers import REPO
from tests.helpers.cli import cli_argv, one_line_error_in_process, run_cli
from tests.helpers.run_configs import run_config, write_config

#: what a training run records in its run.json (`energon_platform.training.run_record`)
RECORD = {"command": ["energon-platform", "train"], "versions": {}, "started": "2026-01-01"}


def digest(path: Path) -> str:
    """sha256 over the names and bytes of every file at or under ``path``."""
    h = hashlib.sha256()
    for p in sorted([path, *path.rglob("*")] if path.is_dir() else [path]):
        h.update(str(p).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def never_ours(path: Path) -> bool:
    return False


def is_ours(path: Path) -> bool:
    return path.read_text().startswith("ours")


@pytest.fixture
def places(tmp_path) -> Path:
    """A run folder (log, run.yaml, a checkpoint), a dataset and a user's file under ``tmp_path``."""
    (tmp_path / "run" / "checkpoints" / "step_000006").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step_000006" / "model.pt").write_bytes(b"weights")
    (tmp_path / "run" / "log.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "run" / "run.yaml").write_text("data: {}\n")
    (tmp_path / "run" / "run.json").write_text(json.dumps(RECORD))
    (tmp_path / "data" / ".nv-meta").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "config.yaml").write_text("data: {}\n")
    return tmp_path


@pytest.mark.parametrize(
    "target, said",
    [
        ("run/log.jsonl", "a file of the training run"),
        ("run/run.yaml", "a file of the training run"),
        ("run/run.json", "a file of the training run"),
        ("run/checkpoints/step_000006/model.pt", "inside the checkpoints of the run"),
        ("run/checkpoints/new.html", "inside the checkpoints of the run"),
        ("data/sheet.png", "inside the dataset"),
        ("notes.txt", "exists and is not a thing this command wrote"),
        ("config.yaml", "is "),  # an input
        ("run", "a folder; name the thing to write"),
    ],
)
def test_a_file_output_refuses_what_is_not_its_own_and_changes_nothing(places, target, said):
    before = digest(places)
    with pytest.raises(OutputError) as e:
        check_file(places / target, never_ours, "thing", inputs=[places / "config.yaml"])
    assert said in str(e.value) and "\n" not in str(e.value)
    assert digest(places) == before


def test_a_file_output_replaces_only_its_own_earlier_file(tmp_path):
    mine = tmp_path / "deep" / "report.html"
    assert check_file(mine, is_ours, "report") == mine and mine.parent.is_dir()  # a new file
    mine.write_text("ours, from before")
    assert check_file(mine, is_ours, "report") == mine
    mine.write_text("the user's")
    with pytest.raises(OutputError, match="not a report this command wrote"):
        check_file(mine, is_ours, "report")
    link = tmp_path / "link.html"
    link.symlink_to(tmp_path / "elsewhere.html")  # a link is never ours, even dangling
    with pytest.raises(OutputError):
        check_file(link, lambda p: True, "report")


def test_a_folder_output_refuses_home_root_repository_inputs_and_foreign_folders(
    places, monkeypatch
):
    monkeypatch.setenv("HOME", str(places / "home"))
    (places / "home").mkdir()
    for folder, said in [
        (places / "home", "your home folder"),
        (Path("/"), "the file system's root"),
        (REPO, "a repository's root"),
        (places, "is inside or holds"),  # holds the input config.yaml
        (places / "run" / "checkpoints", "inside the checkpoints of the run"),
        (places / "data" / "x", "inside the dataset"),
        (places / "run", "which no replay wrote"),
    ]:
        with pytest.raises(OutputError, match=said):
            check_folder(
                folder, never_ours, "replay", overwrite=True, inputs=[places / "config.yaml"]
            )
    own = places / "own"
    own.mkdir()
    (own / "log.jsonl").write_text("ours")
    with pytest.raises(OutputError, match="pass --overwrite"):
        check_folder(own, lambda p: True, "replay", overwrite=False)
    assert check_folder(own, lambda p: True, "replay", overwrite=True) == own
    assert check_folder(places / "new", never_ours, "replay", overwrite=False).is_dir()


def test_only_a_folder_holding_a_runs_record_is_a_run(places):
    """A log.jsonl or a checkpoints/ alone does not make a training run's folder (a user's
    folder may hold either); the run.json a run wrote does, and its files stay protected. An
    unparsable run.json is said to be unparsable, never missing."""
    run, mine = places / "run", places / "mine"
    assert is_run(run)
    assert protected_place(run / "log.jsonl") and protected_place(run / "checkpoints" / "x.html")
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "log.jsonl").write_text("my own lines\n")
    assert not is_run(mine)
    assert protected_place(mine / "log.jsonl") is None
    assert protected_place(mine / "checkpoints" / "x.html") is None
    with pytest.raises(OutputError, match="run.json: missing"):
        run_record(mine)
    for text, said in [
        ('{"command": ["train"', r"run.json: unparsable \("),
        ("\xff\xfe", r"run.json: unparsable \("),
        ("{}", "run.json: not a training run's record"),
        ('{"command": "train", "versions": {}, "started": "x"}', "not a training run's record"),
    ]:
        (mine / "run.json").write_bytes(text.encode("latin-1"))
        with pytest.raises(OutputError, match=said) as e:
            run_record(mine)
        assert "\n" not in str(e.value) and "missing" not in str(e.value)
        assert not is_run(mine) and protected_place(mine / "log.jsonl") is None


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), write_atomic(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed while writing")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["cost.json"]
    with write_atomic(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["cost.json"]


# --- the commands -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "out, said",
    [
        ("config", "is "),  # D1: the config it reads
        ("notes.txt", "not a cost file this command wrote"),  # D1: any other file
        ("folder", "a folder; name the cost file"),  # T6: refused at once, nothing left behind
        ("log", "a file of the training run"),
    ],
)
def test_calibrate_refuses_an_out_that_is_not_a_cost_file_before_any_work(
    spike_run, tmp_path, capsys, out, said
):
    config = tmp_path / "run.yaml"
    config.write_text(spike_run["config"].read_text())
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "folder").mkdir()
    target = {"config": config, "log": spike_run["out"] / "log.jsonl"}.get(out, tmp_path / out)
    before = digest(tmp_path), digest(spike_run["out"])
    argv = ["calibrate", "--config", str(config), "--out", str(target), "--no-progress"]
    one_line_error_in_process(capsys, argv, said)
    assert (digest(tmp_path), digest(spike_run["out"])) == before


@pytest.mark.parametrize("value", ["3", "1000000000000"])
def test_calibrate_bounds_micro_batches_in_one_line(tmp_path, capsys, value):
    """T5: a huge count was a MemoryError after minutes; too few is refused before any work."""
    argv = ["calibrate", "--config", str(REPO / "configs/train_image_text.yaml")]
    one_line_error_in_process(
        capsys,
        [*argv, "--out", str(tmp_path / "c.json"), "--micro-batches", value],
        f"--micro-batches {value}: expected 4 to ",
    )
    assert not (tmp_path / "c.json").exists()


def test_report_refuses_a_runs_files_and_replaces_only_its_own_page(spike_run, tmp_path, capsys):
    """D4: the log, the run's config name and a checkpoint's file are never overwritten; a user's
    page is refused; the report's own page is replaced."""
    run = spike_run["out"]
    step = sorted((run / "checkpoints").glob("step_*"))[0]
    before = digest(run)
    for out, said in [
        (run / "log.jsonl", "which this command reads"),
        (run / "run.yaml", "a file of the training run"),
        (next(step.iterdir()), "inside the checkpoints of the run"),
    ]:
        one_line_error_in_process(capsys, ["report", "--run", str(run), "--out", str(out)], said)
    assert digest(run) == before
    page = tmp_path / "report.html"
    for _ in range(2):  # the second replaces the first
        assert main(["report", "--run", str(run), "--out", str(page)]) == 0
    assert '<meta name="generator" content="energon-platform report">' in page.read_text()
    page.write_text("<!DOCTYPE html><p>my notes</p>")
    one_line_error_in_process(
        capsys,
        ["report", "--run", str(run), "--out", str(page)],
        "not a run report this command wrote",
    )
    assert page.read_text() == "<!DOCTYPE html><p>my notes</p>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary left


def test_preview_never_draws_over_a_users_picture(coco, tmp_path, capsys):
    """D5: a photo of the user's is refused whatever its format; the sheet preview wrote is
    replaced (its mark is in the picture's metadata, in every format that has metadata)."""
    photo = next((REPO / "data/coco_mini/images").iterdir())
    mine = tmp_path / f"photo{photo.suffix}"
    mine.write_bytes(photo.read_bytes())
    one_line_error_in_process(
        capsys,
        ["preview", str(coco), "--out", str(mine), "--n", "2"],
        "not a contact sheet this command wrote",
    )
    assert mine.read_bytes() == photo.read_bytes()
    for suffix in (".png", ".jpg", ".webp", ".tif"):
        sheet = tmp_path / f"sheet{suffix}"
        for _ in range(2):
            assert main(["preview", str(coco), "--out", str(sheet), "--n", "2"]) == 0, suffix
    capsys.readouterr()
    bmp = tmp_path / "sheet.bmp"  # no metadata to carry the mark: written once, never replaced
    assert main(["preview", str(coco), "--out", str(bmp), "--n", "2"]) == 0
    one_line_error_in_process(
        capsys,
        ["preview", str(coco), "--out", str(bmp), "--n", "2"],
        "not a contact sheet this command wrote",
    )
    one_line_error_in_process(
        capsys,
        ["preview", str(coco), "--out", str(coco / "sheet.png"), "--n", "2"],
        "inside the dataset",
    )


# --- train --out: a new or empty folder, or its own run ---------------------------------------


def _names_at(folder: Path) -> dict[str, bool]:
    return {name: (folder / name).exists() for name in ("log.jsonl", "checkpoints", "run.json")}


@pytest.mark.parametrize(
    "out, said",
    [
        ("/", "the file system's root"),  # U2
        ("home", "your home folder"),
        ("repo", "a repository's root"),
        ("notes", "holds notes.txt, which no training run wrote"),  # U3
        ("log", "holds log.jsonl, which no training run wrote"),  # U4: no rows appended to it
        ("checkpoints", "holds checkpoints, which no training run wrote"),
        ("output", "holds stdout.txt, which no training run wrote"),  # not this process's output
        ("config", "holds run.yaml, which no training run wrote"),
        ("broken record", "run.json: unparsable ("),  # M5: not "missing", not a run
        ("foreign record", "run.json: not a training run's record"),
    ],
)
def test_train_refuses_an_out_that_is_not_new_empty_or_its_own_run(
    tmp_path, capsys, monkeypatch, out, said
):
    """One line naming what is foreign, exit 2, nothing written, before any data is read (the
    config's data does not even exist)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "configs").mkdir()
    config = write_config(tmp_path / "configs" / "cfg.yaml", run_config(tmp_path / "absent"))
    folder = {"/": Path("/"), "home": tmp_path / "home", "repo": REPO}.get(out, tmp_path / "out")
    if folder == tmp_path / "out":
        folder.mkdir()
        if out == "checkpoints":
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "model.pt").write_bytes(b"mine")
        else:
            name, text = {
                "notes": ("notes.txt", "mine"),
                "log": ("log.jsonl", '{"step": 1, "mine": true}\n'),
                "output": ("stdout.txt", "mine"),
                "config": ("run.yaml", config.read_text()),
                "broken record": ("run.json", '{"command": ['),
                "foreign record": ("run.json", '{"mine": 1}'),
            }[out]
            (folder / name).write_text(text)
    before = _names_at(folder) if folder in (Path("/"), REPO) else digest(folder)
    argv = ["train", "--config", str(config), "--out", str(folder), "--steps", "1"]
    one_line_error_in_process(capsys, argv, f"--out {folder}", said)
    assert (_names_at(folder) if folder in (Path("/"), REPO) else digest(folder)) == before


def test_train_out_takes_a_new_or_empty_folder_a_runs_own_and_what_a_run_leaves(tmp_path):
    """`check_out` alone: a new or an empty folder, a run's folder (with a page drawn into it),
    a checkpoints/ holding only a run lock (a run killed before it recorded itself), or a link
    to an empty folder (checkpoints kept on another disk), and what the config has the run
    write there (its length cache); a link to a full folder, or another folder, is a user's."""
    from energon_platform.training.run_record import check_out

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(RECORD))
    (run / "report.html").write_text("<p>drawn from the run</p>")
    empty, locked, linked, full = (tmp_path / n for n in ("empty", "locked", "linked", "full"))
    empty.mkdir()
    (locked / "checkpoints").mkdir(parents=True)
    (locked / "checkpoints" / ".run.lock").write_text("")
    (tmp_path / "disk").mkdir()
    linked.mkdir()
    (linked / "checkpoints").symlink_to(tmp_path / "disk")
    for out in (tmp_path / "new", empty, run, locked, linked):
        assert check_out(out) == out
    (locked / "lengths" / "coco").mkdir(parents=True)  # the run's loader.length_cache
    assert check_out(locked, writes=[locked / "lengths"]) == locked
    with pytest.raises(OutputError, match="holds lengths, which no training run wrote"):
        check_out(locked, writes=[tmp_path / "elsewhere"])
    full.mkdir()
    (full / "checkpoints").symlink_to(REPO / "configs")
    with pytest.raises(OutputError, match="holds checkpoints, which no training run wrote"):
        check_out(full)


def test_train_writes_into_its_own_run_and_past_what_a_run_leaves_before_its_record(coco, tmp_path):
    """A folder holding only what a run leaves before it records itself (its checkpoints/ with
    the run lock, a launcher's capture of the run's own output, as check-resume writes it) is
    trained in; the run then resumes there (its own run); the same name not captured is a user's
    (the test above)."""
    config = write_config(tmp_path / "cfg.yaml", run_config(coco))
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / ".run.lock").write_text("pid 1 on a host that was killed")
    with open(out / "stdout.txt", "ab") as f:
        argv = cli_argv("train", "--config", config, "--out", out, "--steps", 2, "--quiet")
        done = subprocess.run(argv, stdout=f, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert is_run(out) and (out / "checkpoints" / "step_000002").is_dir()
    again = run_cli("train", "--config", config, "--out", out, "--steps", 4, "--resume", "--quiet")
    assert again.returncode == 0, again.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[2]["resumed_from"] == 2


# --- scripts/demo.py --out: the demo's own folder, claimed before stage 1 ----------------------


def _demo(out, **kwargs) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "scripts.demo", "--out", str(out)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO, **kwargs)


def test_the_demo_refuses_a_folder_it_did_not_make_before_stage_1(tmp_path):
    """D1: a user's non-empty folder (their blend.yaml and report.html, which the demo writes
    too), the root, the home folder and the repository's root: one line, exit 2, no stage
    started, nothing written."""
    import os

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "blend.yaml").write_text("my blend\n")
    (mine / "report.html").write_text("<p>my report</p>")
    foreign_mark = tmp_path / "marked"
    foreign_mark.mkdir()
    (foreign_mark / "demo.json").write_text('{"mine": true}\n')
    home = tmp_path / "home"
    home.mkdir()

    def state(out: Path):  # the root and the repository: the names the demo writes first
        if out in (Path("/"), REPO):
            return [(out / name).exists() for name in ("demo.json", "coco", "blend.yaml")]
        return digest(out)

    for out, said in [
        (mine, "holds blend.yaml, report.html, which no demo wrote"),
        (foreign_mark, "holds demo.json, which no demo wrote"),
        (Path("/"), "the file system's root"),
        (home, "your home folder"),
        (REPO, "a repository's root"),
        (REPO / "data" / "demo", "which this command reads"),
    ]:
        before = state(out)
        done = _demo(out, env={**os.environ, "HOME": str(home)})
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (out, done.stderr[-2000:])
        assert lines[0].startswith("demo: error: --out ") and said in lines[0], lines[0]
        assert "== 1." not in done.stdout, done.stdout
        assert state(out) == before, out
    assert not (REPO / "data" / "demo").exists()


def test_the_demo_marks_the_folder_it_makes_first_and_a_rerun_proceeds(tmp_path):
    from scripts.demo import MARK, claim_out, is_demo

    out = tmp_path / "demo"
    assert claim_out(out) == out and is_demo(out) and [p.name for p in out.iterdir()] == [MARK]
    (out / "blend.yaml").write_text("the demo's blend\n")  # what the demo went on to write
    mark = (out / MARK).read_bytes()
    assert claim_out(out) == out and (out / MARK).read_bytes() == mark  # a rerun: kept
    assert (out / "blend.yaml").read_text() == "the demo's blend\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert claim_out(empty) == empty and is_demo(empty)
