"""``energon-platform check-resume``: does a killed-and-resumed run train exactly like one that
never stopped?

Runs the trainer twice as separate processes (``torchrun`` when ``--nproc > 1``): once straight
through, once killed with SIGKILL while step K is in progress (after step K-1 was logged, before
step K is) and resumed from its latest checkpoint, optionally with another number of ranks or
workers. Compares every step after the resume point: the global batch's sample keys, the sha256
of its tensors, and the loss. Writes ``OUT/report.json`` and ``OUT/loss.png``; the verdict fails
on any difference of keys or tensors, on a loss difference above ``tolerance`` (0 by default:
on CPU, same layout, the loss must be bit-identical), on a missing step, and when the resumed
process did not really continue from the checkpoint: nothing was restored (no checkpoint was
complete at the kill: ``"restored": false``), or it logged steps before the resume point (it
restarted from step 0, which on a deterministic run would otherwise pass unnoticed).

:func:`check_resume_cmd` runs the same check on any training command (``check-resume --cmd``):
``{out}`` in the commands becomes a folder per run (an absolute path, quoted for the shell where
the placeholder stands: bare, in ``'...'`` or in ``"..."``), steps are read from the run's log in
one of the formats of :mod:`energon_platform.training.step_log_readers`, counted from 1, or from 0 when
the uninterrupted run's first logged step is 0 (then ``--steps N`` are steps 0..N-1). The resume
point is where the resumed command's log starts: it must be after the first step, right after a
step the killed run logged or earlier, and match the ``resumed_from`` the log states, if it
states one (the steps done before its first row: that row's step, less 1 in a log counted from
1). The verdict is
exact (keys, batch digests, loss with tolerance 0) when every compared row carries ``keys`` and
``batch_sha256``, and by the loss alone (|Δloss| <= 0.01, the seed's criterion) otherwise.

Both forms write only into an ``--out`` that is new, empty, or one an earlier check made
(:func:`_claim_out`); anything else in it is refused before a run starts.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energon_platform.training import checkpoint
from energon_platform.training.step_log_readers import (
    JsonLines,
    complete_length,
    get_format,
    read_steps,
)


class RunFailed(RuntimeError):
    """A trainer process failed or ended early; the message holds its output's tail."""


@dataclass
class RunSpec:
    config: str
    steps: int
    nproc: int = 1
    num_workers: int | None = None
    overrides: tuple[str, ...] = ()


def trainer_command(spec: RunSpec, out: Path, resume: bool = False) -> list[str]:
    base = [sys.executable, "-m"]
    if spec.nproc > 1:
        base += ["torch.distributed.run", "--standalone", f"--nproc-per-node={spec.nproc}", "-m"]
    cmd = base + [
        "energon_platform",
        "train",
        "--config",
        spec.config,
        "--out",
        str(out),
        "--steps",
        str(spec.steps),
        "--quiet",
    ]
    if spec.num_workers is not None:
        cmd += ["--num-workers", str(spec.num_workers)]
    for o in spec.overrides:
        cmd += ["--set", o]
    return cmd + (["--resume"] if resume else [])


def _complete_lines(path: Path) -> list[bytes]:
    """The newline-terminated lines of ``path`` (a last line still being written, or cut by a kill,
    is not one yet; the trainer drops such a line when it appends again)."""
    return path.read_bytes().split(b"\n")[:-1] if path.is_file() else []


def read_log(path: Path, skip_lines: int = 0) -> dict[int, dict]:
    """Rows by step, in the order logged, from complete line ``skip_lines`` on; a step logged
    twice keeps the last."""
    rows = {}
    for line in _complete_lines(path)[skip_lines:]:
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = row
    return rows


def _count_lines(path: Path) -> int:
    return len(_complete_lines(path))


RUN_FILES = {"log.jsonl", "stdout.txt", "checkpoints"}  #: what a trainer run writes in its folder


#: what the check writes in ``--out`` (besides its two run folders); a leftover write probe is harmless
OUT_FILES = {"report.json", ".report.json.tmp", "loss.png"}
RUN_DIRS = ("straight", "killed")


def _own_report(path: Path) -> bool:
    """Whether ``path`` is a report check-resume wrote (a JSON object with its verdict's fields)."""
    try:
        report = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and {"steps_compared", "resume_step", "passed", "rows"} <= set(
        report
    )


def _foreign(d: Path, allowed: set[str]) -> list[str]:
    """The names in folder ``d`` that are not in ``allowed`` (none when ``d`` is no folder)."""
    if not d.is_dir():
        return []
    return sorted(
        p.name
        for p in d.iterdir()
        if p.name not in allowed and not p.name.startswith(".write-test-")
    )


def _claim_out(out: Path, run_files: set[str]) -> tuple[Path, Path]:
    """Make ``out`` the check's folder, with its two run folders emptied for new runs; returns them.

    Before anything is written or deleted, refuses (:class:`~checkpoint.CheckpointError`, one
    line) an ``out`` that holds anything check-resume did not write: a name other than its run
    folders, ``report.json`` and ``loss.png``; a ``report.json`` that is not a check-resume
    report (a converted dataset's, say); a ``loss.png`` without one; a run folder holding more
    than a run writes (``run_files``). A new or empty folder, or one an earlier check made, is fine."""
    foreign = _foreign(out, OUT_FILES | set(RUN_DIRS))
    report = out / "report.json"
    if report.exists() and not _own_report(report):
        foreign.insert(0, report.name)
    elif (out / "loss.png").exists() and not report.exists():
        foreign.insert(0, "loss.png")
    if foreign:
        raise checkpoint.CheckpointError(
            f"{out}: holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, which check-resume did not "
            f"write; it writes only into a new or empty folder or one it made: choose another --out"
        )
    dirs = tuple(out / name for name in RUN_DIRS)
    for (
        d
    ) in dirs:  # a run folder is deleted whole: it must be a real folder holding only a run's files
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            raise checkpoint.CheckpointError(
                f"{d}: a {'link' if d.is_symlink() else 'file'} check-resume did not "
                f"make; it deletes only its own runs: choose another --out"
            )
        foreign = _foreign(d, run_files)
        if foreign:
            raise checkpoint.CheckpointError(
                f"{d}: holds {', '.join(foreign[:3])}, which check-resume did not write; "
                f"it deletes only its own runs: choose another --out"
            )
    checkpoint.writable_dir(out, "the check's runs and report")
    for d in dirs:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    return dirs


def _write_report(out: Path, result: dict) -> None:
    """``OUT/report.json``, replaced whole (a kill never leaves half a report, which a rerun would refuse)."""
    tmp = out / ".report.json.tmp"
    tmp.write_text(
        json.dumps(_finite(result), indent=1, allow_nan=False)
    )  # strict JSON: NaN/inf become null
    tmp.replace(out / "report.json")


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once, like a node failure. (torchrun starts
    its workers in sessions of their own, so killing its process group is not enough.) The tree
    is frozen first (SIGSTOP, top down, until no new process appears): a process killed before
    its children would leave them to init, and a process still running could start another one
    (a loader worker) between the listing and the kill."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    frozen: dict[int, psutil.Process] = {}
    for _ in range(100):
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        new = [p for p in procs if p.pid not in frozen]
        if not new:
            break
        for p in new:
            try:
                p.send_signal(signal.SIGSTOP)
                frozen[p.pid] = p
            except psutil.NoSuchProcess:
                pass
    for p in frozen.values():
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(frozen.values()), timeout=30)


def _run(
    cmd: list[str] | str, log: Path, timeout: float | None = None, cwd: str | None = None
) -> None:
    """Run ``cmd`` (a list, or a shell command line) to its end, output appended to ``log``;
    :class:`RunFailed` with the output's tail when it fails or outlives ``timeout``."""
    with open(log, "ab") as f:
        proc = launch(cmd, f, cwd)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            raise RunFailed(
                f"still running after {timeout:g} s, killed: {_shown(cmd)}\n" + _tail(log)
            ) from None
    if proc.returncode != 0:
        raise RunFailed(f"trainer failed (exit {proc.returncode}): {_shown(cmd)}\n" + _tail(log))


def _shown(cmd: list[str] | str) -> str:
    return cmd if isinstance(cmd, str) else " ".join(cmd)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def launch(cmd: list[str] | str, stdout: Any, cwd: str | None = None) -> subprocess.Popen:
    """Start ``cmd`` (a list, or a shell command line run by ``/bin/sh``) in a session of its own,
    stdout and stderr to the open file ``stdout``, Python's output unbuffered (so that a log line
    printed before a kill is in the file, and the kill lands where it was aimed)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd,
        shell=isinstance(cmd, str),
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
        cwd=cwd,
    )


class LogTail:
    """The steps a log has gained since it was opened: :meth:`steps` reads only what is new
    (complete lines), so polling a growing log every few milliseconds stays cheap."""

    def __init__(self, path: Path, fmt: Any = None):
        self.path, self.fmt = Path(path), fmt or JsonLines()
        self.offset = _size(self.path)
        self.logged: set[int] = set()

    def steps(self) -> set[int]:
        if (
            _size(self.path) < self.offset
        ):  # cut back (a writer dropping a torn line): read on from its end
            self.offset = _size(self.path)
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.logged
        end = complete_length(data)
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            row = self.fmt.parse_line(line) if line.strip() else None
            if row is not None:
                self.logged.add(row["step"])
        self.offset += end
        return self.logged


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``ready()`` every 2 ms while ``proc`` runs, then SIGKILL its whole tree
    (:func:`kill_tree`). :class:`RunFailed` when the process ends first or ``timeout`` passes."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if ready():
            break
        time.sleep(0.002)
    if proc.poll() is not None:
        raise RunFailed(f"the run ended (exit {proc.returncode}) before {what}")
    if time.time() >= deadline:
        kill_tree(proc.pid)
        proc.wait()
        raise RunFailed(f"no {what} after {timeout:g} s; the run was killed")
    kill_tree(proc.pid)
    proc.wait()


def _run_killed(
    cmd: list[str] | str,
    stdout_path: Path,
    log_path: Path,
    fmt: Any,
    kill_at: int,
    timeout: float,
    cwd: str | None = None,
) -> None:
    """Start ``cmd`` and SIGKILL its whole process tree once its log (``log_path``, read with
    ``fmt``) gains step ``kill_at - 1``: while step ``kill_at`` is in flight."""
    tail = LogTail(log_path, fmt)
    with open(stdout_path, "ab") as f:
        proc = launch(cmd, f, cwd)
        try:
            kill_when(
                proc, lambda: kill_at - 1 in tail.steps(), timeout, f"step {kill_at - 1} was logged"
            )
        except RunFailed as e:
            raise RunFailed(f"{e}; see {stdout_path}\n" + _tail(stdout_path)) from None


def run_killed(
    spec: RunSpec, out: Path, kill_at: int, timeout: float = 900, resume: bool = False
) -> int:
    """Start a run (``resume``: continue from its latest checkpoint) and SIGKILL its whole process
    tree once step ``kill_at - 1`` is logged. Returns the last step logged before the kill."""
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "log.jsonl"
    _run_killed(
        trainer_command(spec, out, resume),
        out / "stdout.txt",
        log_path,
        JsonLines(),
        kill_at,
        timeout,
    )
    return max(read_log(log_path), default=0)


def _same(a: dict, b: dict, field: str) -> bool | None:
    """Whether rows ``a`` and ``b`` agree on ``field``; None when neither logs it."""
    if field not in a and field not in b:
        return None
    return a.get(field) == b.get(field)


def _all(values: list) -> bool | None:
    """True/False over the values that were compared; None when none was (the log carries no such field)."""
    known = [v for v in values if v is not None]
    return all(known) if known else None


def compare(
    straight: dict[int, dict], resumed: dict[int, dict], first: int, last: int, tolerance: float
) -> dict:
    """Steps ``first..last`` of ``straight`` against the rows the resumed process logged
    (``resumed``). Passes when every step is there on both sides with identical keys and tensor
    hashes (where the rows carry them: ``keys``, ``batch_sha256``) and a loss within
    ``tolerance``, and the resumed process logged no step before ``first`` (it continued from
    the checkpoint; it did not start over). ``keys_identical``/``tensors_identical`` are None
    when no row carries the field."""
    rows = []
    for step in range(first, last + 1):
        a, b = straight.get(step), resumed.get(step)
        if a is None or b is None:
            rows.append({"step": step, "missing": "straight" if a is None else "resumed"})
            continue
        rows.append(
            {
                "step": step,
                "keys_identical": _same(a, b, "keys"),
                "tensors_identical": _same(a, b, "batch_sha256"),
                "loss_straight": a["loss"],
                "loss_resumed": b["loss"],
                "abs_loss_diff": abs(a["loss"] - b["loss"]),
            }
        )
    complete = [r for r in rows if "missing" not in r]
    max_diff = max((r["abs_loss_diff"] for r in complete), default=float("nan"))
    if any(d != d for d in (r["abs_loss_diff"] for r in complete)):  # a NaN loss on either side
        max_diff = float("nan")
    result = {
        "steps_compared": len(complete),
        "missing_steps": [r["step"] for r in rows if "missing" in r],
        "keys_identical": _all([r["keys_identical"] for r in complete]),
        "tensors_identical": _all([r["tensors_identical"] for r in complete]),
        "max_abs_loss_diff": max_diff,
        "tolerance": tolerance,
        "resumed_steps_before_resume_point": sorted(s for s in resumed if s < first),
        "rows": rows,
    }
    result["passed"] = (
        bool(complete)
        and not result["missing_steps"]
        and result["keys_identical"] is not False
        and result["tensors_identical"] is not False
        and max_diff <= tolerance
        and not result["resumed_steps_before_resume_point"]
    )
    return result


def plot(straight: dict[int, dict], resumed: dict[int, dict], resume_step: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(straight)
    balanced = [
        s for s in steps if "rank_cost" in straight[s]
    ]  # loader.balance: a panel of per-rank cost
    fig, axes = plt.subplots(
        3 if balanced else 2,
        1,
        figsize=(8, 8 if balanced else 6),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1, 1] if balanced else [3, 1]},
    )
    ax, bx = axes[0], axes[1]
    if balanced:
        axes[2].plot(
            balanced,
            [straight[s]["rank_cost"] for s in balanced],
            color="teal",
            label="max/mean rank cost",
        )
        axes[2].axhline(1.0, color="gray", ls=":")
        axes[2].set_ylabel("rank cost")
        axes[2].legend()
    ax.plot(steps, [straight[s]["loss"] for s in steps], label="uninterrupted", lw=2)
    rs = sorted(resumed)
    ax.plot(rs, [resumed[s]["loss"] for s in rs], "--", label="killed + resumed", lw=1.5)
    ax.axvline(resume_step, color="gray", ls=":", label=f"resumed from step {resume_step}")
    ax.set_ylabel("loss")
    ax.legend()
    common = [s for s in steps if s in resumed]
    bx.plot(
        common, [abs(straight[s]["loss"] - resumed[s]["loss"]) for s in common], color="crimson"
    )
    bx.set_ylabel("|Δloss|")
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def balance_summary(rows: dict) -> dict:
    """``{"balance": {...}}`` over the logged steps of a run with ``loader.balance`` (per-step
    ``rank_cost``: max/mean of the ranks' costs, and ``padding``); ``{}`` for other runs."""
    steps = [r for r in rows.values() if "rank_cost" in r]
    if not steps:
        return {}
    costs, pads = [r["rank_cost"] for r in steps], [r.get("padding", 0.0) for r in steps]
    return {
        "balance": {
            "steps": len(steps),
            "rank_cost_max": max(costs),
            "rank_cost_mean": round(sum(costs) / len(costs), 4),
            "padding_mean": round(sum(pads) / len(pads), 4),
            "rank_cost": costs,
        }
    }


def check_resume(
    spec: RunSpec,
    kill_at: int,
    out: Path,
    resume_nproc: int | None = None,
    resume_workers: int | None = None,
    tolerance: float = 0.0,
    log=print,
) -> dict:
    """Run the check (module doc); returns the report (also written to ``OUT/report.json``)."""
    if not 2 <= kill_at <= spec.steps:
        raise ValueError(f"--kill-at must be between 2 and --steps ({spec.steps}), got {kill_at}")
    if not tolerance >= 0:
        raise ValueError(f"--tolerance must be >= 0, got {tolerance}")
    straight_dir, killed_dir = _claim_out(out, RUN_FILES)
    log(f"[1/3] uninterrupted run: {spec.steps} steps on {spec.nproc} rank(s)")
    _run(trainer_command(spec, straight_dir), straight_dir / "stdout.txt")
    log(f"[2/3] run killed with SIGKILL during step {kill_at}")
    last_logged = run_killed(spec, killed_dir, kill_at)
    before = read_log(killed_dir / "log.jsonl")
    resume_spec = RunSpec(
        spec.config,
        spec.steps,
        resume_nproc or spec.nproc,
        resume_workers if resume_workers is not None else spec.num_workers,
        spec.overrides,
    )
    found = checkpoint.find(killed_dir / "checkpoints")  # what the resumed run must continue from
    resume_step = found.content["step"] if found else 0
    log(
        f"      killed after step {last_logged} was logged; latest complete checkpoint: step {resume_step}"
    )
    log(
        f"[3/3] resume on {resume_spec.nproc} rank(s)"
        + (f" x {resume_workers} worker(s)" if resume_workers is not None else "")
    )
    lines_before = _count_lines(killed_dir / "log.jsonl")
    _run(trainer_command(resume_spec, killed_dir, resume=True), killed_dir / "stdout.txt")
    # only rows the resumed process wrote count: nothing may have survived the kill
    straight, resumed = (
        read_log(straight_dir / "log.jsonl"),
        read_log(killed_dir / "log.jsonl", lines_before),
    )
    result = compare(straight, resumed, resume_step + 1, spec.steps, tolerance)
    first_row = _complete_lines(killed_dir / "log.jsonl")[lines_before:][:1]
    claimed = (
        json.loads(first_row[0]).get("resumed_from") if first_row else None
    )  # the trainer's own word
    result["restored"] = resume_step > 0 and claimed == resume_step
    result["passed"] = result["passed"] and result["restored"]
    result.update(balance_summary(straight))
    result.update(
        {
            "kill_at": kill_at,
            "killed_after_logged_step": last_logged,
            "kill_landed_mid_step": last_logged == kill_at - 1 and kill_at not in before,
            "resume_step": resume_step,
            "layout": {"nproc": spec.nproc, "num_workers": spec.num_workers},
            "resume_layout": {"nproc": resume_spec.nproc, "num_workers": resume_spec.num_workers},
            # per dataset of the blend: samples and epochs consumed by the end of each run
            "datasets": straight.get(spec.steps, {}).get("datasets"),
            "datasets_resumed": resumed.get(spec.steps, {}).get("datasets"),
        }
    )
    _write_report(out, result)
    plot(straight, {**before, **resumed}, resume_step, out / "loss.png")
    return result


# --- any training command ------------------------------------------------------------------

#: the seed's criterion: a loss jump above this after a resume means the resume scheme is worthless
SEED_TOLERANCE = 0.01
CMD_RUN_FILES = {
    "stdout.txt",
    "out",
}  #: what a command's run writes in its folder (its own files go to out/)


@dataclass
class CommandSpec:
    """``check-resume --cmd``: the command (``{out}``: its run's output folder), the command that
    resumes it, the steps both run, and where and how they log their steps.

    ``log``: the log's path, with ``{out}``; None: ``{out}/steps.jsonl`` for ``jsonl``, the
    command's own output (stdout and stderr) for the text formats. ``tolerance``: None for 0 when
    the log carries keys and digests, :data:`SEED_TOLERANCE` otherwise. ``timeout``: seconds per run."""

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


def check_resume_cmd(spec: CommandSpec, kill_at: int, out: Path, log=print) -> dict:
    """The check on any training command (module doc); returns the report (also ``OUT/report.json``).
    ValueError for a spec that cannot work, :class:`RunFailed` when a run fails or logs no step."""
    fmt = spec.reader()
    if not 2 <= kill_at <= spec.steps:
        raise ValueError(f"--kill-at must be between 2 and --steps ({spec.steps}), got {kill_at}")
    out = Path(os.path.abspath(out))  # {out} must name the same folder wherever the command cds to
    straight_dir, killed_dir = _claim_out(out, CMD_RUN_FILES)
    for d in (straight_dir, killed_dir):
        (d / "out").mkdir()
    straight_log = spec.log_path(straight_dir / "out", straight_dir / "stdout.txt")
    killed_log = spec.log_path(killed_dir / "out", killed_dir / "stdout.txt")
    log(f"[1/3] uninterrupted run: {_with_out(spec.cmd, straight_dir / 'out')}")
    _run(
        _with_out(spec.cmd, straight_dir / "out"),
        straight_dir / "stdout.txt",
        spec.timeout,
        spec.cwd,
    )
    straight = read_steps(straight_log, fmt)
    if not straight:
        raise RunFailed(
            f"the uninterrupted run logged no step that --log-format {fmt.name} recognises in "
            f"{straight_log}; a {fmt.name} line looks like: {_sample(fmt)}"
        )
    base = (
        0 if min(straight) == 0 else 1
    )  # the log's first step: 0 or 1 (then --steps steps are base..last)
    last = base + spec.steps - 1
    if kill_at > last:
        raise ValueError(
            f"the log counts steps from 0 (its last of --steps {spec.steps} is {last}): --kill-at must "
            f"be between 2 and {last}, got {kill_at}"
        )
    log(f"[2/3] run killed with SIGKILL during step {kill_at}")
    _run_killed(
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
    log(f"[3/3] resume: {_with_out(spec.resume_cmd, killed_dir / 'out')}")
    _run(
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
    resume_step = (
        first - base
    )  # steps done before it: what its resumed_from must say, if it logs one
    compared = [s for s in range(first, last + 1) if s in straight]
    exact = bool(compared) and all(
        "keys" in straight[s] and "batch_sha256" in straight[s] for s in compared
    )
    tolerance = spec.tolerance if spec.tolerance is not None else (0.0 if exact else SEED_TOLERANCE)
    result = compare(straight, resumed, first, last, tolerance)
    claimed = (
        resumed[first].get("resumed_from") if resumed else None
    )  # the loop's own word, if it logs one
    result.update(
        {
            "form": "cmd",
            "mode": "exact" if exact else "loss",
            "log_format": fmt.name,
            "first_step": base,
            "first_resumed_step": first,
            "restored": 0 < resume_step
            and first - 1 <= last_logged
            and claimed in (None, resume_step),
            "resumed_from_logged": claimed,
            "kill_at": kill_at,
            "killed_after_logged_step": last_logged,
            "kill_landed_mid_step": last_logged == kill_at - 1 and kill_at not in before,
            "resume_step": resume_step,
            "resumed_steps_logged": len(resumed),
            "commands": {
                "straight": _with_out(spec.cmd, straight_dir / "out"),
                "killed": _with_out(spec.cmd, killed_dir / "out"),
                "resume": _with_out(spec.resume_cmd, killed_dir / "out"),
            },
            "logs": {"straight": str(straight_log), "killed": str(killed_log)},
        }
    )
    result["passed"] = result["passed"] and result["restored"]
    _write_report(out, result)
    plot(straight, {**before, **resumed}, first - 1, out / "loss.png")
    return result


def _sample(fmt: Any) -> str:
    """The sample line of a reader's docstring (the indented line after ``::``)."""
    doc = (type(fmt).__doc__ or "").split("::", 1)[-1].strip().splitlines()
    return doc[0].strip() if doc else "?"


def _judged(result: dict) -> str:
    if result.get("mode") == "loss":
        return (
            f"max |Δloss|={result['max_abs_loss_diff']:.3g} (tolerance {result['tolerance']:g}; the log carries "
            f"no keys and batch digests, so the loss alone is judged)"
        )
    return (
        f"keys identical={result['keys_identical']}, tensors identical={result['tensors_identical']}, "
        f"max |Δloss|={result['max_abs_loss_diff']:.3g} (tolerance {result['tolerance']:g})"
    )


def verdict(result: dict) -> str:
    head = "PASS" if result["passed"] else "FAIL"
    base = result.get("first_step", 1)
    text = (
        f"{head}: {result['steps_compared']} steps compared after resuming from step {result['resume_step']} "
        f"(killed during step {result['kill_at']}{'; the log counts steps from 0' if base == 0 else ''}): "
        f"{_judged(result)}"
    )
    if result["missing_steps"]:
        sides = {r["missing"] for r in result["rows"] if "missing" in r}
        text += (
            f"; steps {result['missing_steps'][:3]}{'...' if len(result['missing_steps']) > 3 else ''} missing "
            f"from the {' and '.join(sorted(sides))} run's log"
        )
    if result["resumed_steps_before_resume_point"]:
        text += (
            f"; the resumed run logged steps {result['resumed_steps_before_resume_point'][:3]}... before the "
            f"resume point: it started over instead of continuing"
        )
    if result.get("form") == "cmd" and not result["restored"]:
        if not result["resumed_steps_logged"]:
            text += "; the resume command logged no step"
        elif result["resume_step"] <= 0:
            text += (
                f"; the resume command started again from step {result.get('first_resumed_step', base)}: it "
                f"restored nothing"
            )
        elif result["resume_step"] + base - 1 > result["killed_after_logged_step"]:
            text += (
                f"; it resumed after step {result['resume_step'] + base - 1}, which the killed run never logged "
                f"(it stopped after step {result['killed_after_logged_step']}): does --resume-cmd read another "
                f"run's checkpoints?"
            )
        else:
            text += (
                f"; its log says resumed_from={result['resumed_from_logged']}, but its first step is "
                f"{result['resume_step'] + base} (resumed_from={result['resume_step']} expected): it did not "
                f"continue from the checkpoint it names"
            )
    elif not result.get("restored", True):
        text += (
            "; NO loader state was restored (no checkpoint was complete at the kill)"
            if not result["resume_step"]
            else "; the resumed run did not report continuing from that checkpoint"
        )
    return text
