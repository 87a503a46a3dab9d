"""The output rule (`storage.outputs`): a command writes only its own output, refuses the rest in
one line before any work, and writes atomically; then each command that writes a file, held to it
(``calibrate``, ``report``, ``preview``; ``replay`` is in tests/training/test_replay.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from energon_platform.cli import main
from storage.outputs import OutputError, check_file, check_folder, write_atomic
from tests.helpers import REPO
from tests.helpers.cli import one_line_error_in_process


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
    (tmp_path / "data" / ".nv-meta").mkdir(parents=True)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "config.yaml").write_text("data: {}\n")
    return tmp_path


@pytest.mark.parametrize(
    "target, said",
    [
        ("run/log.jsonl", "a file of the training run"),
        ("run/run.yaml", "a file of the training run"),
        ("run/run.json", "a file of the training run"),  # not there yet: still the run's name
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
