"""The trainer's process sets up without the garbage collector, then freezes what it set up
(`energon_platform.training.collector`), and leaves the collector of a process that never paused
it alone."""

from __future__ import annotations

import json
import os

import pytest

from energon_platform.training import collector
from tests.helpers.cli import run_python
from tests.helpers.run_configs import run_config, write_config

SPY = """
import gc, json, sys
from energon_platform.training import collector

seen = {}
settle = collector.settle

def spy():
    seen["enabled_during_set_up"] = gc.isenabled()
    settle()
    seen["frozen"] = gc.get_freeze_count()

collector.settle = spy
from energon_platform.cli import main

seen["status"] = main(sys.argv[1:])
seen["enabled_at_end"] = gc.isenabled()
print(json.dumps(seen))
"""


def test_the_trainer_sets_up_with_the_collector_off_then_freezes_the_set_up(coco, tmp_path):
    config = write_config(tmp_path / "run.yaml", run_config(coco, train={"steps": 2}))
    argv = ["train", "--config", str(config), "--out", str(tmp_path / "out"), "--quiet"]
    r = run_python(SPY, *argv, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["status"] == 0 and seen["enabled_during_set_up"] is False, seen
    # torch, the encoder and the model: hundreds of thousands of objects no collection scans again
    assert seen["frozen"] > 100_000 and seen["enabled_at_end"] is True, seen


ALONE = """
import gc
from energon_platform.training import collector

gc.disable()
collector.pause()
collector.settle()
print(gc.isenabled(), gc.get_freeze_count())
gc.enable()
collector.settle()
print(gc.isenabled(), gc.get_freeze_count())
"""


def test_settle_leaves_a_collector_it_did_not_pause_alone():
    """Off and not paused by `pause` stays off; on and not paused stays on; nothing frozen."""
    r = run_python(ALONE)
    assert r.stdout.split() == ["False", "0", "True", "0"], r.stdout + r.stderr


def test_a_train_command_refused_in_process_leaves_the_collector_on(tmp_path, capsys):
    """``cli.main(["train", ...])`` called from Python with a config that cannot run: one line,
    exit 2, and the caller's collector is on again (it was paused for the set-up)."""
    import gc

    from energon_platform import cli

    assert gc.isenabled()
    assert cli.main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "error:" in capsys.readouterr().err
    assert gc.isenabled()


def test_a_train_command_refused_at_its_checkpoints_freezes_nothing_of_its_caller(
    coco, tmp_path, capsys
):
    """The trainer settles after its last refusal: ``cli.main(["train", ...])`` in-process, into
    an ``--out`` that already holds checkpoints (no ``--resume``), is refused once the model is
    built, and leaves its caller's collector on with nothing frozen."""
    import gc

    from energon_platform import cli

    config = write_config(tmp_path / "run.yaml", run_config(coco, train={"steps": 2}))
    (tmp_path / "out" / "checkpoints").mkdir(parents=True)
    (tmp_path / "out" / "checkpoints" / "latest").write_text("step_000002")
    record = {"command": ["energon-platform", "train"], "versions": {}, "started": "2026-01-01"}
    (tmp_path / "out" / "run.json").write_text(json.dumps(record))  # a run's folder, not foreign
    frozen = gc.get_freeze_count()
    argv = ["train", "--config", str(config), "--out", str(tmp_path / "out"), "--quiet"]
    assert cli.main(argv) == 2
    assert "pass --resume" in capsys.readouterr().err
    # nothing newly frozen (objects frozen by earlier tests of this process may be freed meanwhile)
    assert gc.isenabled() and gc.get_freeze_count() <= frozen


def test_off_runs_its_block_without_the_collector_and_restores_it_as_it_was():
    import gc

    assert gc.isenabled()
    with pytest.raises(ValueError), collector.off():
        assert not gc.isenabled()
        raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.off():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


def test_calibrate_times_each_step_with_the_collector_off(monkeypatch):
    """A full collection inside a timed step would count as that batch's time."""
    import gc

    from energon_platform.training import calibrate

    seen = []
    monkeypatch.setattr(
        calibrate, "time_step", lambda model, batch: seen.append(gc.isenabled()) or 1.0
    )
    calibrate.time_rounds(None, [0.0, 0.0], repeats=1)
    assert seen == [False] * 4 and gc.isenabled()


EXITS = """
import atexit, gc, runpy, sys
from importlib.metadata import entry_points

atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))
how, sys.argv = sys.argv[1], ["energon-platform", *sys.argv[2:]]
if how == "module":
    runpy.run_module("energon_platform", run_name="__main__", alter_sys=True)
else:
    entry_points(group="console_scripts")["energon-platform"].load()()
"""


@pytest.mark.parametrize("how", ["module", "console-script"])
def test_the_program_exits_with_what_its_imports_made_frozen(how, tmp_path):
    """``python -m energon_platform`` and the installed ``energon-platform`` freeze every object
    alive before they exit (`collector.before_exit`): the interpreter's collection at exit then
    scans none of what torch and Energon made. The status is the command's, here a one-line
    error (exit 2) on a folder that is not a dataset. Run outside the repository, so the entry
    point is the installed package's, not that of build metadata left in the checkout."""
    hook = os.path.join("tests", "helpers", "exit_hook")  # the suite's own freeze at exit: not here
    path = [p for p in os.environ["PYTHONPATH"].split(os.pathsep) if not p.endswith(hook)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    r = run_python(EXITS, how, "info", tmp_path, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "not an Energon dataset" in r.stderr, r.stdout + r.stderr
    frozen = int(r.stdout.rsplit(":", 1)[-1])
    assert frozen > 100_000, r.stdout
