"""What the commands share: argument types, ``--set`` overrides, the run arguments, and
`UsageError` (a user mistake: one line, exit status 2)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path


class UsageError(Exception):
    """Raised by commands for a user mistake: printed as one line, exit status 2."""


def format_arg(parser: argparse.ArgumentParser) -> None:
    """``--format`` of a manifest (``fmt``)."""
    parser.add_argument(
        "--format",
        dest="fmt",
        choices=["jsonl", "csv", "tsv", "parquet"],
        help="default: from the extension",
    )


def folder_or_manifest(parser: argparse.ArgumentParser, files: str, stem: str, paths: str) -> None:
    """``--root`` (a folder of ``files`` with ``STEM.txt``/``STEM.json`` captions) or ``--manifest``."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--root",
        help=f"folder searched recursively for {files}; captions from {stem}.txt or "
        f"{stem}.json beside each",
    )
    src.add_argument(
        "--manifest", help=f"JSONL/CSV/TSV/Parquet; {paths} resolve relative to its folder"
    )


def fraction(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return v


def non_negative(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return v


def non_negative_float(text: str) -> float:
    v = float(text)
    if not v >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return v


def positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return v


def positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return v


def override_text(pair: str, value: str) -> str:
    """The YAML text of a ``--set KEY=VALUE``: ``@FILE`` reads FILE (``loader.exclude=@rules.yaml``),
    anything else is the value itself (a plain YAML value cannot start with ``@``)."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text()
    except OSError as e:
        raise UsageError(
            f"--set {pair}: cannot read {value[1:]} ({e.strerror or e}); give KEY=@FILE with a "
            f"readable YAML file"
        ) from None


def overrides(pairs: list[str]) -> dict:
    import yaml

    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = yaml.safe_load(override_text(pair, value))
        except yaml.YAMLError as e:
            raise UsageError(
                f"--set {pair}: the value is not valid YAML ({getattr(e, 'problem', None) or e})"
            ) from None
    return out


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A description or epilog wrapped to the terminal's width one paragraph (blank-line separated)
    at a time; a paragraph with an indented line (examples, commands) is kept as written, so its
    lines must fit 100 columns on their own (``tests/project/test_docs_reference.py`` checks)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line[:1].isspace() for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                words = " ".join(line.strip() for line in lines)
                paragraphs.append(
                    textwrap.fill(words, width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n\n".join(paragraphs)


def run_config(args, run: str | None, required: bool = True):
    """The config of a command over a run folder: ``--config`` (with ``--set``) when given, else
    the one ``RUN/run.yaml`` records (with ``--set``). Given both, one line on stderr names the
    keys where ``--config`` differs from the record (``train.out`` aside: the run's own folder).
    None when neither is there and ``required`` is false; else a `UsageError` saying what to
    pass."""
    from energon_platform.config import config_dict, load_config
    from energon_platform.training.run_record import RUN_YAML, config_changes, recorded_config

    sets = overrides(getattr(args, "set", None))
    recorded = recorded_config(run, sets) if run is not None else None
    if args.config is None:
        if recorded is None and required:
            where = f"{run} records no config (no {RUN_YAML}: a run of an earlier version)"
            raise UsageError(f"{where}; pass --config FILE" if run else "pass --config FILE")
        if recorded is None and sets:
            raise UsageError("--set overrides a config: pass --config FILE too")
        return recorded
    cfg = load_config(args.config, sets)
    if recorded is not None:
        changed = config_changes(config_dict(recorded), config_dict(cfg))
        changed.pop("train.out", None)  # the run's own folder, wherever the config pointed
        if changed:
            print(
                f"note: --config differs from {Path(run) / RUN_YAML} at {', '.join(sorted(changed))}",
                file=sys.stderr,
            )
    return cfg


def add_run_args(p, workers_help: str, config_required: bool = True) -> None:
    """Arguments every command that runs the trainer takes."""
    p.add_argument(
        "--config", required=config_required, help="run config YAML (see configs/train_*.yaml)"
    )
    p.add_argument("--num-workers", type=non_negative, help=workers_help)
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. loader.seed=7 (KEY=@FILE: the value is FILE's YAML)",
    )


def replay_progress(done: int, total: int) -> None:
    """A balanced run's trace replays the planner: say how far, on stderr."""
    print(
        f"\rreplaying the planner: {done}/{total} global batches",
        end="\n" if done >= total else "",
        file=sys.stderr,
        flush=True,
    )
