"""``check-resume --config``: the check on the reference trainer (``energon-platform train``), run
straight, killed mid-step and resumed, optionally on another number of ranks or workers.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from energon_platform.training import checkpoint
from energon_platform.training.resume_check.comparison import balance_summary, compare
from energon_platform.training.resume_check.out_folder import claim_out, write_report
from energon_platform.training.resume_check.plot import plot
from energon_platform.training.resume_check.processes import (
    run_command,
    run_command_killed,
    torchrun_argv,
)
from energon_platform.training.resume_check.trainer_log import complete_lines, count_lines, read_log
from energon_platform.training.run_record import RUN_JSON, RUN_YAML, recorded_config
from energon_platform.training.step_log_readers import (
    JsonLines,
)
from storage.outputs import OutputError, run_record


@dataclass
class RunSpec:
    config: str
    steps: int
    nproc: int = 1
    num_workers: int | None = None
    overrides: tuple[str, ...] = ()


def trainer_command(spec: RunSpec, out: Path, resume: bool = False) -> list[str]:
    base = torchrun_argv(spec.nproc, "-m") if spec.nproc > 1 else [sys.executable, "-m"]
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


#: what a trainer run writes in its folder
RUN_FILES = {"log.jsonl", "stdout.txt", "checkpoints", RUN_YAML, RUN_JSON}


def straight_run_spec(run: Path, num_workers: int | None = None) -> RunSpec:
    """The `RunSpec` of a finished training run's folder (``train --out RUN``), from what it
    records: its config (``RUN/run.yaml``: every ``--set`` applied), its world size and its steps
    (``RUN/run.json``). ValueError (one line naming the folder) unless it records a run that was
    never resumed (its log then holds one uninterrupted run), on the world size its log's rows
    were written at, and logged every step."""
    name = f"--straight-from {run}"
    if not (run / RUN_JSON).exists() and not (run / RUN_YAML).exists():
        raise ValueError(
            f"{name}: no {RUN_YAML} and {RUN_JSON} of a training run there (train --out writes them)"
        )
    try:  # an unparsable record is said to be so, never to be missing
        record = run_record(run)
    except OutputError as e:
        raise ValueError(f"{name}: {e}") from None
    cfg = recorded_config(run)  # an unparsable run.yaml: its own one-line ConfigError
    if cfg is None:
        raise ValueError(f"{name}: no {RUN_YAML} there (the config the run records)")
    if record.get("resumes"):
        raise ValueError(
            f"{name}: that run was resumed ({len(record['resumes'])} time(s)), so its log is not "
            f"one uninterrupted run; check it with --config {run / RUN_YAML} instead"
        )
    rows = read_log(run / "log.jsonl")
    world_size = int(record.get("world_size") or 1)
    logged_sizes = sorted({r["world_size"] for r in rows.values() if "world_size" in r})
    if logged_sizes and logged_sizes != [world_size]:  # the record first: else a false FAIL
        raise ValueError(
            f"{name}: {RUN_JSON} records world_size {world_size}, but its log.jsonl was written "
            f"at world_size {', '.join(map(str, logged_sizes))}; the record is not this log's "
            f"(check the run with --config {run / RUN_YAML} --nproc N instead)"
        )
    steps = cfg.train.steps
    logged = max(rows, default=0)
    if logged < steps:
        raise ValueError(
            f"{name}: its log reaches step {logged} of its {steps}; let the run finish first"
        )
    return RunSpec(str(run / RUN_YAML), steps, world_size, num_workers)


def run_killed(
    spec: RunSpec, out: Path, kill_at: int, timeout: float = 900, resume: bool = False
) -> int:
    """Start a run (``resume``: continue from its latest checkpoint) and SIGKILL its whole process
    tree once step ``kill_at - 1`` is logged. Returns the last step logged before the kill."""
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "log.jsonl"
    run_command_killed(
        trainer_command(spec, out, resume),
        out / "stdout.txt",
        log_path,
        JsonLines(),
        kill_at,
        timeout,
    )
    return max(read_log(log_path), default=0)


def check_resume(
    spec: RunSpec,
    kill_at: int,
    out: Path,
    resume_nproc: int | None = None,
    resume_workers: int | None = None,
    tolerance: float = 0.0,
    log=print,
    timeout: float | None = None,
    straight_run: Path | None = None,
) -> dict:
    """Run the check (module doc); returns the report (also written to ``OUT/report.json``).
    ``timeout``: seconds each of the three runs may take (None: no limit but the kill's 900 s
    wait for its step); a run past it is killed and the check fails (`RunFailed`).
    ``straight_run``: a finished training run of ``spec`` (``train --out`` folder, see
    `straight_run_spec`) whose log stands for the uninterrupted run, which is then not run."""
    if not 2 <= kill_at <= spec.steps:
        raise ValueError(f"--kill-at must be between 2 and --steps ({spec.steps}), got {kill_at}")
    if not tolerance >= 0:
        raise ValueError(f"--tolerance must be >= 0, got {tolerance}")
    straight_dir, killed_dir = claim_out(out, RUN_FILES)
    if straight_run is None:
        log(f"[1/3] uninterrupted run: {spec.steps} steps on {spec.nproc} rank(s)")
        run_command(trainer_command(spec, straight_dir), straight_dir / "stdout.txt", timeout)
    else:
        log(f"[1/3] uninterrupted run: {straight_run} ({spec.steps} steps on {spec.nproc} rank(s))")
        straight_dir = straight_run
    log(f"[2/3] run killed with SIGKILL during step {kill_at}")
    last_logged = run_killed(spec, killed_dir, kill_at, timeout or 900)
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
    lines_before = count_lines(killed_dir / "log.jsonl")
    run_command(
        trainer_command(resume_spec, killed_dir, resume=True), killed_dir / "stdout.txt", timeout
    )
    # only rows the resumed process wrote count: nothing may have survived the kill
    straight, resumed = (
        read_log(straight_dir / "log.jsonl"),
        read_log(killed_dir / "log.jsonl", lines_before),
    )
    result = compare(straight, resumed, resume_step + 1, spec.steps, tolerance)
    first_row = complete_lines(killed_dir / "log.jsonl")[lines_before:][:1]
    # the trainer's own word
    claimed = json.loads(first_row[0]).get("resumed_from") if first_row else None
    result["restored"] = resume_step > 0 and claimed == resume_step
    result["passed"] = result["passed"] and result["restored"]
    result.update(balance_summary(straight))
    result.update(
        {
            "kill_at": kill_at,
            "killed_after_logged_step": last_logged,
            "kill_landed_mid_step": last_logged == kill_at - 1 and kill_at not in before,
            "resume_step": resume_step,
            "straight_from": str(straight_run) if straight_run is not None else None,
            "layout": {"nproc": spec.nproc, "num_workers": spec.num_workers},
            "resume_layout": {"nproc": resume_spec.nproc, "num_workers": resume_spec.num_workers},
            # per dataset of the blend: samples and epochs consumed by the end of each run
            "datasets": straight.get(spec.steps, {}).get("datasets"),
            "datasets_resumed": resumed.get(spec.steps, {}).get("datasets"),
        }
    )
    write_report(out, result)
    plot(straight, {**before, **resumed}, resume_step, out / "loss.png")
    return result
