"""A loader worker lost during a command is one line and exit status 1 (not a traceback): the
line names the worker and says how to resume; a lost Ray cluster keeps its own line."""

from __future__ import annotations

import argparse

from energon_platform import cli
from energon_platform.loader.executors.base import WorkerLost
from energon_platform.loader.executors.ray_connect import RayUnavailable
from energon_platform.loader.supervision import worker_died
from energon_platform.loader.train_loader import LoaderWorkerError


class _Loader:
    rank, next_microbatch, global_batch = 1, 12, 3


def test_a_dead_worker_is_one_line_with_exit_status_1(monkeypatch, capsys):
    message = worker_died(
        _Loader(), WorkerLost("local worker 0 (pid 77)", 12, "killed by signal 9")
    )

    def command(args):
        raise LoaderWorkerError(message)

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=command, command="train")
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("energon-platform train: error: local worker 0")
    assert "Out of memory?" in err and "resume from the latest checkpoint" in err


def test_a_lost_cluster_keeps_its_own_advice():
    lost = RayUnavailable("the Ray cluster at 10.0.0.1:6379 does not answer", 4)
    line = worker_died(_Loader(), lost)
    assert line == str(lost) and "Out of memory" not in line
