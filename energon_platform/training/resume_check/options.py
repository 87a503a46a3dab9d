"""The rules ``check-resume``'s options follow, checked before any run starts: which options go with
which form of the check (``--config``: the reference trainer; ``--cmd``/``--resume-cmd``: any
training command), where the kill may land, and the default tolerance.

Each refusal is an `OptionError` whose message is one line naming the option; the CLI
prints it and exits 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from energon_platform.training.resume_check.command import CommandSpec

# the loader and preflight are imported inside check_trainer_run: every command imports this module
# for OptionError, and they would multiply the command's start-up (scripts/bench/cli.py)

#: the loss tolerance of a resume on another number of ranks: the gradient all-reduce then sums in
#: another order, so the loss may differ in its last bits
OTHER_WORLD_TOLERANCE = 1e-5


class OptionError(ValueError):
    """Options of ``check-resume`` that cannot go together or cannot work (one line, naming them)."""


def is_command_form(cmd: str | None, resume_cmd: str | None) -> bool:
    """Whether the options ask for the check on any training command (either of ``--cmd`` and
    ``--resume-cmd`` given) rather than on the reference trainer."""
    return cmd is not None or resume_cmd is not None


def check_kill_at(kill_at: int, steps: int) -> None:
    """`OptionError` unless ``2 <= kill_at <= steps`` (the killed run must have logged a step,
    and the kill must land within the run)."""
    if not 2 <= kill_at <= steps:
        raise OptionError(f"--kill-at must be between 2 and --steps ({steps})")


def command_spec(
    *,
    config: str | None,
    cmd: str | None,
    resume_cmd: str | None,
    steps: int,
    kill_at: int,
    trainer_options: Mapping[str, Any],
    log: str | None,
    log_format: str | None,
    regex: str | None,
    tolerance: float | None,
    timeout: float,
) -> CommandSpec:
    """The `CommandSpec` of ``check-resume --cmd``; `OptionError` for ``--config``
    given as well, a missing ``--cmd`` or ``--resume-cmd``, any of ``trainer_options`` (option →
    value: the reference trainer's layout and settings) given, a ``--kill-at`` outside the run, or a
    spec that cannot work (`CommandSpec.reader`), in that order."""
    if config is not None:
        raise OptionError("--config and --cmd are two forms of the check: give one of them")
    if not cmd or not resume_cmd:
        raise OptionError(
            "--cmd and --resume-cmd go together: the command, and the one that continues it from its "
            "latest checkpoint in {out}"
        )
    for flag, value in trainer_options.items():
        if value is not None:
            raise OptionError(
                f"{flag} goes with --config (the reference trainer); with --cmd, put the layout and "
                f"settings in the commands themselves"
            )
    check_kill_at(kill_at, steps)
    spec = CommandSpec(
        cmd, resume_cmd, steps, log, log_format or "jsonl", regex, tolerance, timeout
    )
    try:
        spec.reader()
    except ValueError as e:
        raise OptionError(str(e)) from None
    return spec


def check_trainer_form(config: str | None, command_options: Mapping[str, Any]) -> None:
    """`OptionError` for ``check-resume`` on the reference trainer without ``--config``, or
    with any of ``command_options`` (option → value: how a command's log is read) given."""
    if config is None:
        raise OptionError(
            "give --config FILE (the reference trainer) or --cmd and --resume-cmd (any training command)"
        )
    for flag, value in command_options.items():
        if value is not None:
            raise OptionError(
                f"{flag} goes with --cmd; the reference trainer (--config) logs its own steps"
            )


def check_kill_after_a_checkpoint(kill_at: int, first_checkpoint: int) -> None:
    """`OptionError` unless a checkpoint is complete when the kill lands. The kill comes once
    step ``kill_at - 1`` is logged, and the reference trainer logs a step before it writes that
    step's checkpoint: the newest checkpoint sure to be complete is at step ``kill_at - 2`` or
    before."""
    if kill_at < first_checkpoint + 2:
        raise OptionError(
            f"--kill-at {kill_at} leaves no checkpoint to resume from: the kill comes once step "
            f"{kill_at - 1} is logged, and the first checkpoint (step {first_checkpoint}, "
            f"train.checkpoint_every) is written after its step is logged, so the resumed run would "
            f"restore nothing; use --kill-at >= {first_checkpoint + 2} or a smaller "
            f"train.checkpoint_every"
        )


def check_trainer_run(cfg: Any, nproc: int, resume_nproc: int | None, kill_at: int, steps: int):
    """Refuse, before any process starts, a check on the reference trainer that cannot work, in this
    order: a world size (``nproc``, then ``resume_nproc``) the config's batches do not divide into
    ([`LayoutError`][energon_platform.loader.schedule.LayoutError]), a ``--kill-at`` outside the run or
    before a checkpoint is complete (`OptionError`), a dataset, encoder or model that do not
    fit (`preflight`'s errors)."""
    from energon_platform.loader.train_loader import check_layout
    from energon_platform.training.preflight import preflight

    for world in {nproc, resume_nproc or nproc}:
        check_layout(cfg, world)
    check_kill_at(kill_at, steps)
    check_kill_after_a_checkpoint(kill_at, min(cfg.train.checkpoint_every, steps))
    preflight(cfg)


def default_tolerance(nproc: int, resume_nproc: int | None) -> float:
    """The loss tolerance of a check on the reference trainer without ``--tolerance``: 0 (bit-exact)
    on the same world size, `OTHER_WORLD_TOLERANCE` when the resumed part runs on another."""
    return OTHER_WORLD_TOLERANCE if resume_nproc not in (None, nproc) else 0.0
