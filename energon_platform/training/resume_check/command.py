"""``check-resume --cmd``: the check on any training command, its steps read from the run's log in one
of the formats of `energon_platform.training.step_log_readers`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_platform.training.resume_check.comparison import compare
from energon_platform.training.resume_check.out_folder import claim_out, write_report
from energon_platform.training.resume_check.plot import plot
from energon_platform.training.resume_check.processes import (
    RunFailed,
    run_command,
    run_command_killed,
)
from energon_platform.training.step_log_readers import (
    complete_length,
    get_format,
    read_steps,
    sample_line,
)

#: the seed's criterion: a loss jump above this after a resume means the resume scheme is worthless
SEED_TOLERANCE = 0.01
#: what a command's run writes in its folder (its own files go to out/)
CMD_RUN_FILES = {
    "stdout.txt",
    "out",
}


@dataclass
class CommandSpec:
    """``check-resume --cmd``: the command (``{out}``: its run's output folder), the command that
    resumes it, the steps both run, and where and how they log their steps.

    ``log``: the log's path, with ``{out}``; None: ``{out}/steps.jsonl`` for ``jsonl``, the
    command's own output (stdout and stderr) for the text formats. ``tolerance``: None for 0 when
    the log carries keys and digests, `SEED_TOLERANCE` otherwise. ``timeout``: seconds per run."""

    cmd: str
    resume_cmd: str
    steps: int
    log: str | None = None
    log_format: str = "jsonl"
    regex: str | None = None
    tolerance: float | None = None
    timeout: float = 3600
    cwd: str | None = None

    def reader(self) -> Any:
        """The log reader; ValueError (one line) for a spec that cannot work."""
        for name, command in (("--cmd", self.cmd), ("--resume-cmd", self.resume_cmd)):
            if "{out}" not in command:
                raise ValueError(
                    f"{name} must contain {{out}} (each run's output folder: the uninterrupted and the "
                    f"killed run must not share checkpoints), got {command!r}"
                )
        if self.log is not None and "{out}" not in self.log:
            raise ValueError(
                f"--log must contain {{out}} (the runs must not share a log), got {self.log!r}"
            )
        if self.steps < 2:
            raise ValueError(f"--steps must be >= 2, got {self.steps}")
        if self.tolerance is not None and not self.tolerance >= 0:
            raise ValueError(f"--tolerance must be >= 0, got {self.tolerance}")
        return get_format(self.log_format, self.regex)

    def log_path(self, run_out: Path, stdout: Path) -> Path:
        if self.log is not None:
            return Path(self.log.replace("{out}", str(run_out)))
        return run_out / "steps.jsonl" if self.log_format == "jsonl" else stdout


def _with_out(command: str, run_out: Path) -> str:
    """``command`` with each ``{out}`` replaced by ``run_out`` quoted for where the placeholder
    stands: bare (``--out {out}``), inside single quotes (``'{out}'``) or inside double quotes
    (``"{out}/log.txt"``); each way the shell sees exactly the path, spaces and quotes included."""
    path, parts, quote, i = str(run_out), [], None, 0
    while i < len(command):
        if command.startswith("{out}", i):
            if quote is None:
                parts.append(shlex.quote(path))
            elif quote == "'":
                parts.append(path.replace("'", "'\\''"))  # close, an escaped quote, reopen
            else:
                parts.append(re.sub(r'([\\"$`])', r"\\\1", path))
            i += len("{out}")
            continue
        c = command[i]
        if c == "\\" and quote != "'":  # an escaped character: keep the pair, it quotes nothing
            parts.append(command[i : i + 2])
            i += 2
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote else c
        parts.append(c)
        i += 1
    return "".join(parts)


def reused_straight(earlier: Path, spec: CommandSpec, out: Path) -> tuple[str, Path]:
    """The uninterrupted run of an earlier ``check-resume --cmd`` whose ``--out`` was ``earlier``:
    (its command, its log). ValueError (one line, naming the folder) unless ``earlier`` holds
    such a check's report, other than ``out``, whose uninterrupted run ran ``spec.cmd`` (compared
    as written, ``{out}`` unfilled and white space around it aside: the folder may have moved)."""
    earlier = Path(os.path.abspath(earlier))
    name = f"--straight-from {earlier}"
    if earlier == out:
        raise ValueError(
            f"{name}: that is --out itself; the check empties it, so give another --out"
        )
    try:
        report = json.loads((earlier / "report.json").read_text())
    except (OSError, ValueError):
        raise ValueError(
            f"{name}: no readable report.json of an earlier check-resume there"
        ) from None
    command = _with_out(spec.cmd, earlier / "straight" / "out")
    if not isinstance(report, dict) or report.get("form") != "cmd":
        raise ValueError(f"{name}: its report is not one of check-resume --cmd")
    commands = report.get("commands") or {}
    template = commands.get("template")  # {out} unfilled: the folder may have moved since
    same = (
        template.strip() == spec.cmd.strip()
        if isinstance(template, str)
        else commands.get("straight") == command
    )
    if not same:
        raise ValueError(
            f"{name}: its uninterrupted run ran another command "
            f"({template or commands.get('straight')!r}); give the same --cmd"
        )
    return command, spec.log_path(earlier / "straight" / "out", earlier / "straight" / "stdout.txt")


def check_resume_cmd(
    spec: CommandSpec, kill_at: int, out: Path, log=print, straight_from: Path | None = None
) -> dict:
    """The check on any training command (module doc); returns the report (also ``OUT/report.json``).
    ``straight_from``: an earlier check's ``--out`` whose uninterrupted run of the same command is
    compared with (`reused_straight`) instead of running it again. ValueError for a spec that
    cannot work, `RunFailed` when a run fails or logs no step."""
    fmt = spec.reader()
    if not 2 <= kill_at <= spec.steps:
        raise ValueError(f"--kill-at must be between 2 and --steps ({spec.steps}), got {kill_at}")
    out = Path(os.path.abspath(out))  # {out} must name the same folder wherever the command cds to
    reused = reused_straight(straight_from, spec, out) if straight_from is not None else None
    straight_dir, killed_dir = claim_out(out, CMD_RUN_FILES)
    for d in (straight_dir, killed_dir):
        (d / "out").mkdir()
    killed_log = spec.log_path(killed_dir / "out", killed_dir / "stdout.txt")
    if reused is None:
        straight_command = _with_out(spec.cmd, straight_dir / "out")
        straight_log = spec.log_path(straight_dir / "out", straight_dir / "stdout.txt")
        log(f"[1/3] uninterrupted run: {straight_command}")
        run_command(straight_command, straight_dir / "stdout.txt", spec.timeout, spec.cwd)
    else:
        straight_command, straight_log = reused
        log(f"[1/3] uninterrupted run: reused from {straight_from} ({straight_command})")
    straight = read_steps(straight_log, fmt)
    if not straight:
        raise RunFailed(
            f"the uninterrupted run logged no step that --log-format {fmt.name} recognises in "
            f"{straight_log}; a {fmt.name} line looks like: {_sample(fmt)}"
        )
    # the log's first step: 0 or 1 (then --steps steps are base..last)
    base = 0 if min(straight) == 0 else 1
    last = base + spec.steps - 1
    if kill_at > last:
        raise ValueError(
            f"the log counts steps from 0 (its last of --steps {spec.steps} is {last}): --kill-at must "
            f"be between 2 and {last}, got {kill_at}"
        )
    if reused is not None and max(straight) < last:
        raise ValueError(
            f"--straight-from {straight_from}: its uninterrupted run logged steps up to "
            f"{max(straight)}; --steps {spec.steps} compares up to step {last}"
        )
    log(f"[2/3] run killed with SIGKILL during step {kill_at}")
    run_command_killed(
        _with_out(spec.cmd, killed_dir / "out"),
        killed_dir / "stdout.txt",
        killed_log,
        fmt,
        kill_at,
        spec.timeout,
        spec.cwd,
    )
    before = read_steps(killed_log, fmt)
    last_logged = max(before, default=base - 1)
    data = killed_log.read_bytes() if killed_log.is_file() else b""
    kept = complete_length(data)
    log(f"      killed after step {last_logged} was logged")
    if last_logged >= last:
        raise RunFailed(
            f"the killed run logged its last step ({last_logged}) before the kill landed (aimed "
            f"at step {kill_at}): nothing is left to resume. The trainer outran the check "
            f"(a loaded machine?): run it again, or give it more --steps; see "
            f"{killed_dir / 'stdout.txt'}"
        )
    log(f"[3/3] resume: {_with_out(spec.resume_cmd, killed_dir / 'out')}")
    run_command(
        _with_out(spec.resume_cmd, killed_dir / "out"),
        killed_dir / "stdout.txt",
        spec.timeout,
        spec.cwd,
    )
    # the resumed run's rows: after the complete lines the kill left; after the torn last line too,
    # if the resumed run appended behind it rather than cutting it (StepLog cuts it)
    after = killed_log.read_bytes() if killed_log.is_file() else b""
    start = len(data) if len(data) > kept and after[kept : len(data)] == data[kept:] else kept
    resumed = read_steps(killed_log, fmt, start)
    first = min(resumed) if resumed else base  # the resumed run's first step
    # steps done before it: what its resumed_from must say, if it logs one
    resume_step = first - base
    compared = [s for s in range(first, last + 1) if s in straight]
    exact = bool(compared) and all(
        "keys" in straight[s] and "batch_sha256" in straight[s] for s in compared
    )
    tolerance = spec.tolerance if spec.tolerance is not None else (0.0 if exact else SEED_TOLERANCE)
    result = compare(straight, resumed, first, last, tolerance)
    # the loop's own word, if it logs one
    claimed = resumed[first].get("resumed_from") if resumed else None
    result.update(
        {
            "form": "cmd",
            "mode": "exact" if exact else "loss",
            "log_format": fmt.name,
            "first_step": base,
            "first_resumed_step": first,
            # the checkpoint of the step the kill interrupted may be complete before that step's
            # log line (a trainer that saves before it logs): resuming after it is continuing too
            "restored": 0 < resume_step
            and first - 1 <= max(last_logged, kill_at)
            and claimed in (None, resume_step),
            "resumed_from_logged": claimed,
            "kill_at": kill_at,
            "killed_after_logged_step": last_logged,
            "kill_landed_mid_step": last_logged == kill_at - 1 and kill_at not in before,
            "resume_step": resume_step,
            "resumed_steps_logged": len(resumed),
            "straight_from": str(straight_from) if reused is not None else None,
            "commands": {
                "template": spec.cmd,
                "straight": straight_command,
                "killed": _with_out(spec.cmd, killed_dir / "out"),
                "resume": _with_out(spec.resume_cmd, killed_dir / "out"),
            },
            "logs": {"straight": str(straight_log), "killed": str(killed_log)},
        }
    )
    result["passed"] = result["passed"] and result["restored"]
    write_report(out, result)
    plot(straight, {**before, **resumed}, first - 1, out / "loss.png")
    return result


def _sample(fmt: Any) -> str:
    """The sample line of a reader's docstring (`sample_line`), "?" when it has none."""
    return sample_line(fmt) or "?"
