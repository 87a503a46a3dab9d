"""A run folder records itself (``run.yaml``, ``run.json``), and the commands over a run read it.

Unit: a config written as plain data loads back to the same config (every shipped config and one
with exclusions, a weight schedule and a grouped balance); a start records the command, versions,
datasets and world size; a resume keeps the first start and appends what it changed; a fresh
start over an old record replaces it. Through the CLI, on the session's run with a planted spike
(trained by ``train``): ``spikes``, ``trace`` and ``report`` take ``--run R`` alone and say the
same as with ``--config``, ``--set`` applied to the recorded config; a ``--config`` that differs
from the record is named in one line; an unparsable ``run.json`` is said to be so. A run's own
``run.yaml`` trains in the folder that holds it, wherever the run was moved, and ``--resume``
that finds nothing to resume says so, ``--quiet`` or not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

from energon_platform import cli, load_config
from energon_platform.config import config_dict
from energon_platform.training.run_record import config_changes, record_run, recorded_config
from storage.outputs import OutputError
from tests.helpers import REPO


def _configs() -> list:
    shipped = sorted((REPO / "configs").glob("train_*.yaml"))
    rich = {
        "data": {"path": str(REPO / "configs/blend_demo.yaml"), "val_split": None},
        "encoder": str(REPO / "configs/encoders/image_text_small.yaml"),
        "loader": {
            "global_batch_size": 8,
            "seed": 3,
            "balance": {"mode": "attention", "window": 512},
            "exclude": [{"step": 3, "keys": ["coco*"]}],
        },
        "train": {"steps": 9, "lr": 0.002},
    }
    return [*map(str, shipped), rich]


@pytest.mark.parametrize(
    "source", _configs(), ids=lambda s: Path(s).stem if isinstance(s, str) else "rich"
)
def test_a_config_as_plain_data_loads_back_to_itself(source):
    cfg = load_config(source)
    data = config_dict(cfg)
    assert yaml.safe_load(yaml.safe_dump(data)) == data  # plain YAML
    assert config_dict(load_config(data)) == data  # loads back to itself
    if isinstance(source, str):  # every path of a config file's is absolute once parsed
        assert dataclasses.replace(load_config(data), source=cfg.source) == cfg


def test_a_start_records_itself_and_a_resume_appends_what_it_changed(tmp_path):
    cfg = load_config(str(REPO / "configs/train_image_text.yaml"))
    first = record_run(tmp_path, cfg, 2, argv=["energon-platform", "train"])
    assert first["world_size"] == 2 and first["command"] == ["energon-platform", "train"]
    assert first["versions"]["python"] and first["versions"]["torch"] and first["resumes"] == []
    assert recorded_config(tmp_path) == dataclasses.replace(cfg, source=str(tmp_path / "run.yaml"))
    later = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr=cfg.train.lr * 2))
    again = record_run(tmp_path, later, 4, argv=["resume"], resumed=True)
    assert again["started"] == first["started"] and again["command"] == first["command"]
    (resume,) = again["resumes"]
    assert resume["world_size"] == 4 and resume["changed"] == {
        "train.lr": [cfg.train.lr, cfg.train.lr * 2]
    }
    assert recorded_config(tmp_path).train.lr == cfg.train.lr * 2
    fresh = record_run(tmp_path, cfg, 1, argv=["again"])  # a new run in the folder: a new record
    assert fresh["resumes"] == [] and fresh["command"] == ["again"]


def test_a_users_own_run_yaml_in_the_runs_folder_is_never_replaced(tmp_path, capsys):
    """A config named run.yaml in the --out folder is the user's input, not a record: train
    refuses in one line before any work (the folder holds no run's run.json), and the file is
    unchanged; the record itself refuses to replace it too."""
    from tests.helpers.run_configs import run_config, write_config

    (tmp_path / "run").mkdir()
    own = tmp_path / "run" / "run.yaml"
    write_config(own, run_config(str(tmp_path / "data")))  # refused before the data is read
    before = own.read_bytes()
    argv = ["train", "--config", str(own), "--out", str(own.parent), "--steps", "1"]
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert status != 0 and own.read_bytes() == before
    assert "holds run.yaml, which no training run wrote" in err, err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(OutputError, match="is not this run's record"):
        record_run(own.parent, load_config(own), 1)


def test_config_changes_name_every_dotted_key_that_differs():
    old = {"a": 1, "b": {"c": 2, "d": 3}}
    assert config_changes(old, {"a": 1, "b": {"c": 5}, "e": 0}) == {
        "b.c": [2, 5],
        "b.d": [3, None],
        "e": [None, 0],
    }


# --- the commands over the session's run -----------------------------------------------------


def _cli(capsys, *argv) -> tuple[int, str, str]:
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_trained_run_records_how_it_was_made(spike_run):
    out = spike_run["out"]
    record = json.loads((out / "run.json").read_text())
    assert record["world_size"] == 1 and record["datasets"] and record["fingerprint"]
    recorded = recorded_config(out)
    assert recorded.train.out == out.resolve()
    assert dataclasses.replace(recorded, train=load_config(spike_run["config"]).train) == (
        dataclasses.replace(load_config(spike_run["config"]), source=recorded.source)
    )


def test_spikes_and_trace_take_the_run_alone(spike_run, capsys):
    run, config = spike_run["out"], spike_run["config"]
    alone = _cli(capsys, "spikes", "--run", run, "--window", "10", "--json")
    given = _cli(capsys, "spikes", "--run", run, "--config", config, "--window", "10", "--json")
    assert alone[0] == 0 and alone[1] == given[1] and json.loads(alone[1].splitlines()[0])
    alone = _cli(capsys, "trace", "--run", run, "--step", "3", "--json")
    given = _cli(capsys, "trace", "--config", config, "--checkpoint", run, "--step", "3", "--json")
    assert alone[0] == given[0] == 0 and alone[1] == given[1]


def test_a_run_without_checkpoints_is_traced_from_its_record(spike_run, capsys, tmp_path):
    """A run killed before its first checkpoint: ``trace --run`` reads its record, and says what
    ``trace --config`` without ``--checkpoint`` says."""
    (tmp_path / "run.yaml").write_bytes((spike_run["out"] / "run.yaml").read_bytes())
    alone = _cli(capsys, "trace", "--run", tmp_path, "--step", "2", "--json")
    given = _cli(capsys, "trace", "--config", spike_run["config"], "--step", "2", "--json")
    assert alone[0] == given[0] == 0 and alone[1] == given[1]


def test_set_values_apply_to_the_recorded_config_of_run_alone(spike_run, capsys):
    """``--run R --set K=V`` without ``--config``: the recorded config with the values set (not
    the record as it is), as ``--config R/run.yaml --set K=V`` gives it; ``trace`` reads it."""
    from energon_platform.cli.common import run_config

    run = spike_run["out"]
    sets = ["train.lr=0.125", "loader.seed=11"]
    cfg = run_config(argparse.Namespace(config=None, set=sets), run)
    assert cfg.train.lr == 0.125 and cfg.loader.seed == 11
    assert cfg == run_config(argparse.Namespace(config=str(run / "run.yaml"), set=sets), run)
    # through a command: the run's checkpoint was saved with the recorded seed (3), so trace
    # --run R refuses a seed set on the command line, naming the value set
    status, _, err = _cli(capsys, "trace", "--run", run, "--set", "loader.seed=11", "--step", "2")
    assert status == 2 and "seed: saved 3, now 11" in err, err
    assert _cli(capsys, "trace", "--run", run, "--step", "2")[0] == 0


def test_a_config_that_differs_from_the_record_is_named_in_one_line(spike_run, capsys, tmp_path):
    other = tmp_path / "other.yaml"
    data = yaml.safe_load(Path(spike_run["config"]).read_text())
    data.setdefault("train", {})["lr"] = 0.5  # the trace does not depend on it
    other.write_text(yaml.safe_dump(data))
    status, _, err = _cli(
        capsys, "trace", "--run", spike_run["out"], "--config", other, "--step", "1"
    )
    assert status == 0
    (note,) = [line for line in err.splitlines() if line.startswith("note:")]
    assert "train.lr" in note and "run.yaml" in note


def test_a_run_without_a_record_asks_for_the_config(spike_run, capsys, tmp_path):
    (tmp_path / "log.jsonl").write_bytes((spike_run["out"] / "log.jsonl").read_bytes())
    for argv in (("spikes", "--run", tmp_path), ("trace", "--run", tmp_path, "--step", "1")):
        status, _, err = _cli(capsys, *argv)
        assert status == 2 and "records no config" in err and "pass --config FILE" in err
        assert len(err.strip().splitlines()) == 1


def test_report_draws_the_spikes_samples_from_the_recorded_config(spike_run, capsys, tmp_path):
    page = tmp_path / "report.html"
    status, _, _ = _cli(
        capsys, "report", "--run", spike_run["out"], "--out", page, "--window", "10"
    )
    assert status == 0
    assert any(key in page.read_text() for key in spike_run["planted"])


def test_check_resume_takes_a_finished_run_as_its_uninterrupted_run(spike_run, capsys, tmp_path):
    """``check-resume --straight-from RUN`` alone: a finished run of ``train`` (its config given
    with a ``--set`` and ``--steps``, both recorded) is killed during a step and resumed from what
    it records, and compared with the run's own log: no uninterrupted run is trained."""
    from tests.helpers.cli import run_cli

    run = tmp_path / "run"
    argv = ["train", "--config", spike_run["config"], "--out", run, "--steps", 12, "--quiet"]
    trained = run_cli(*argv, "--set", "train.checkpoint_every=4", timeout=600)  # its own process:
    assert trained.returncode == 0, trained.stderr[-2000:]  # the trainer freezes its set-up
    out = tmp_path / "check"
    status, printed, err = _cli(
        capsys, "check-resume", "--straight-from", run, "--kill-at", "7", "--out", out
    )
    assert status == 0 and "PASS" in printed, printed + err
    assert f"[1/3] uninterrupted run: {run.resolve()} (12 steps on 1 rank(s))" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["straight_from"] == str(run.resolve()) and report["resume_step"] == 4
    assert report["steps_compared"] == 8 and report["passed"]
    assert not any((out / "straight").iterdir()), "no uninterrupted run was trained"


def test_check_resume_straight_from_refuses_what_is_not_one_finished_run(
    spike_run, capsys, tmp_path
):
    run = spike_run["out"]
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    for name in ("run.yaml", "log.jsonl"):
        (resumed / name).write_bytes((run / name).read_bytes())
    record = json.loads((run / "run.json").read_text())
    (resumed / "run.json").write_text(json.dumps({**record, "resumes": [{"world_size": 1}]}))
    empty = tmp_path / "empty"
    empty.mkdir()
    short = tmp_path / "short"
    short.mkdir()
    for name in ("run.yaml", "run.json"):
        (short / name).write_bytes((run / name).read_bytes())
    (short / "log.jsonl").write_text("".join((run / "log.jsonl").read_text().splitlines(True)[:5]))
    broken = tmp_path / "broken"  # M5: an unparsable record is not a missing one
    shutil.copytree(run, broken)
    (broken / "run.json").write_text('{"command": ["energon-platform", "train"')
    cases = {
        (str(empty),): "no run.yaml and run.json of a training run there",
        (str(broken),): f"{broken / 'run.json'}: unparsable (",
        (str(resumed),): "that run was resumed (1 time(s))",
        (str(short),): "its log reaches step 5 of its 16",
        (str(run), "--set", "loader.seed=1"): "--set comes from the run",
        (str(run), "--steps", "16"): "--steps comes from the run",
        (str(run), "--out", str(run)): "which this command reads",
        (str(run), "--out", str(run / "checkpoints" / "check")): "which this command reads",
    }
    for (folder, *more), expected in cases.items():
        argv = ["check-resume", "--straight-from", folder, "--kill-at", "12", *more]
        if "--out" not in more:
            argv += ["--out", str(tmp_path / "never")]
        status, _, err = _cli(capsys, *argv)
        assert status == 2 and expected in err and err.count("\n") == 1, (folder, more, err)
    assert not (tmp_path / "never").exists()
    status, _, err = _cli(capsys, "check-resume", "--config", spike_run["config"], "--kill-at", "9")
    assert status == 2 and "--steps is required" in err


# --- where a run record trains, and what --resume says -------------------------------------------


def test_a_moved_run_resumes_in_the_folder_that_holds_its_record(coco, tmp_path):
    """U5: ``train --config MOVED/run.yaml --resume`` resumes the run where it now is (not from
    scratch in the folder its record names, which stays absent), and says where it trains; a
    run whose folder is gone from where the record says is found by its record."""
    from tests.helpers.cli import run_cli
    from tests.helpers.run_configs import run_config, write_config

    config = write_config(tmp_path / "cfg.yaml", run_config(coco))
    first, moved = tmp_path / "first", tmp_path / "moved"
    done = run_cli("train", "--config", config, "--out", first, "--steps", 2, "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    first.rename(moved)
    argv = ["train", "--config", moved / "run.yaml", "--resume", "--steps", 4, "--quiet"]
    done = run_cli(*argv, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not first.exists(), "trained in the folder the record names, not the run's"
    assert f"the run is in {moved}, where it trains" in done.stderr, done.stderr
    assert "no checkpoint" not in done.stderr, done.stderr
    rows = [json.loads(line) for line in (moved / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[2]["resumed_from"] == 2
    (resume,) = json.loads((moved / "run.json").read_text())["resumes"]
    assert recorded_config(moved).train.out == moved.resolve()


def test_resume_that_finds_nothing_to_resume_says_so_even_quiet(coco, tmp_path):
    """U5: ``--resume`` into a folder with no checkpoint trains from step 0 and says so on
    stderr, ``--quiet`` or not."""
    from tests.helpers.cli import run_cli
    from tests.helpers.run_configs import run_config, write_config

    config = write_config(tmp_path / "cfg.yaml", run_config(coco))
    out = tmp_path / "new"
    argv = ["train", "--config", config, "--out", out, "--steps", 1, "--resume", "--quiet"]
    done = run_cli(*argv, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "--resume" in line]
    assert said == [
        f"warning: --resume: no checkpoint in {out / 'checkpoints'}; starting from step 0"
    ], done.stderr
    assert json.loads((out / "log.jsonl").read_text())["resumed_from"] == 0
