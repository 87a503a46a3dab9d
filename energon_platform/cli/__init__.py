"""The ``energon-platform`` command: thin argument parsing over the packages' functions.

Exit status: 0 success; 1 the job ran but failed its own check (too many skipped samples);
2 wrong arguments, a missing input or an output that cannot be used (one line, no traceback);
141 the reader of standard output went away (``| head -1``), as for a process ended by SIGPIPE
(nothing printed).

One module per group of commands (`data`,
`training`, `inspection`), each with its
``add_*`` (the options) and ``cmd_*`` (the dispatch into the room that does the work);
`common` holds what they share.

A command imports the rooms it runs inside its ``cmd_*`` function, not at module top: measured
with ``scripts/bench/cli.py``, importing every room up front makes ``--help`` and each
one-line error wait seconds instead of tens of milliseconds.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from energon_platform.cli.common import UsageError
from energon_platform.cli.data import (
    EXAMPLES,
    add_convert,
    add_index,
    add_info,
    add_prepare,
    add_verify,
)
from energon_platform.cli.inspection import add_preview, add_report, add_spikes, add_trace
from energon_platform.cli.training import add_calibrate, add_check_resume, add_replay, add_train

__all__ = ["EXAMPLES", "UsageError", "build_parser", "main", "run"]


QUIET_LOGGERS = ("multistorageclient",)


def _quiet_third_party_logs() -> None:
    """Keep the loggers of `QUIET_LOGGERS` (MSC's "Non-retryable error occurred ..." before
    the exception it raises) to critical messages, in this process and the workers it forks."""
    import logging

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (``energon-platform trace | head -1``)."""
    import select

    try:
        fd = sys.stdout.fileno()
    # not a file (replaced, or closed): the pipe that broke was another
    except (
        OSError,
        ValueError,
    ):
        return False
    if not hasattr(select, "poll"):
        return True  # no way to ask: the error came from writing, and stdout is what the CLI writes
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(mask & select.POLLERR for _, mask in poller.poll(0))


def _quiet_stdout() -> None:
    """Point standard output at /dev/null, so that Python's flush at exit has nowhere to fail."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def package_version() -> str:
    """This package's installed version ("not installed" when it runs from a source tree only)."""
    from importlib import metadata

    try:
        return metadata.version("energon-platform")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="energon-platform",
        description="Multimodal data on megatron-energon: convert corpora to shards, encode, train with exact resume.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_convert(sub)
    add_info(sub)
    add_index(sub)
    add_prepare(sub)
    add_verify(sub)
    add_train(sub)
    add_check_resume(sub)
    add_calibrate(sub)
    add_preview(sub)
    add_trace(sub)
    add_spikes(sub)
    add_replay(sub)
    add_report(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from converters.output import ConvertError
    from converters.readers import InputError
    from energon_platform.loader.mixing import AdaptError
    from energon_platform.loader.schedule import LayoutError
    from energon_platform.loader.state import StateMismatchError
    from energon_platform.training.checkpoint import CheckpointError
    from energon_platform.training.resume_check.options import OptionError
    from storage import DatasetError
    from storage.outputs import OutputError
    from task_encoders.config_parser import ConfigError

    args = build_parser().parse_args(argv)
    _quiet_third_party_logs()
    try:
        status = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader gone (``| head -1``) is caught below
        return status
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        _quiet_stdout()
        return 141  # as a process ended by SIGPIPE
    except (
        InputError,
        ConvertError,
        UsageError,
        FileNotFoundError,
        ConfigError,
        DatasetError,
        StateMismatchError,
        LayoutError,
        AdaptError,
        CheckpointError,
        OptionError,
        OutputError,
    ) as e:
        print(f"energon-platform {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a lost loader worker: not a mistake, its line says how to resume
        if not _lost_loader_worker(e):
            raise
        print(f"energon-platform {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def _lost_loader_worker(error: Exception) -> bool:
    """Whether ``error`` is a `LoaderWorkerError`, without importing the loader (and torch) for a
    command that never did: only a command that imported it can raise one."""
    module = sys.modules.get("energon_platform.loader.train_loader")
    return module is not None and isinstance(error, module.LoaderWorkerError)


def run() -> NoReturn:
    """The program ``energon-platform`` (its console script and ``python -m energon_platform``):
    `main` on ``sys.argv``, then exit with its status. Whatever `main` returned or raised, the
    objects alive are frozen first (`collector.before_exit`), so the interpreter's collection at
    exit does not scan what the imports made. `main` itself leaves the caller's collector alone."""
    from energon_platform.training import collector

    try:
        status = main()
    finally:
        collector.before_exit()
    sys.exit(status)
