"""``energon-platform check-resume``: does a killed-and-resumed run train exactly like one that
never stopped?

Runs the trainer twice as separate processes (``torchrun`` when ``--nproc > 1``): once straight
through, once killed with SIGKILL while step K is in progress (after step K-1 was logged, before
step K is) and resumed from its latest checkpoint, optionally with another number of ranks or
workers. Compares every step after the resume point: the global batch's sample keys, the sha256
of its tensors, and the loss. Writes ``OUT/report.json`` and ``OUT/loss.png``; the verdict fails
on any difference of keys or tensors and on a loss difference above ``tolerance`` (0 by default:
on CPU, same layout, the loss must be bit-identical).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


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
    cmd = base + ["energon_platform", "train", "--config", spec.config, "--out", str(out), "--steps",
                  str(spec.steps), "--quiet"]
    if spec.num_workers is not None:
        cmd += ["--num-workers", str(spec.num_workers)]
    for o in spec.overrides:
        cmd += ["--set", o]
    return cmd + (["--resume"] if resume else [])


def read_log(path: Path, skip_lines: int = 0) -> dict[int, dict]:
    """Rows by step, from line ``skip_lines`` on; a step logged twice keeps the last."""
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines()[skip_lines:]:
            if line.strip():
                row = json.loads(line)
                rows[row["step"]] = row
    return rows


def _count_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once, like a node failure. (torchrun starts
    its workers in sessions of their own, so killing its process group is not enough.)"""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "ab") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"trainer failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                           + log.read_text()[-3000:])


def run_killed(spec: RunSpec, out: Path, kill_at: int, timeout: float = 900, resume: bool = False) -> int:
    """Start a run (``resume``: continue from its latest checkpoint) and SIGKILL its whole process
    tree once step ``kill_at - 1`` is logged. Returns the last step logged before the kill."""
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "log.jsonl"
    with open(out / "stdout.txt", "ab") as f:
        proc = subprocess.Popen(trainer_command(spec, out, resume), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            if kill_at - 1 in read_log(log_path):
                break
            time.sleep(0.002)
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before step {kill_at - 1}; see {out / 'stdout.txt'}")
        kill_tree(proc.pid)
        proc.wait()
    return max(read_log(log_path), default=0)


def compare(straight: dict[int, dict], resumed: dict[int, dict], first: int, last: int, tolerance: float) -> dict:
    rows = []
    for step in range(first, last + 1):
        a, b = straight.get(step), resumed.get(step)
        if a is None or b is None:
            rows.append({"step": step, "missing": "straight" if a is None else "resumed"})
            continue
        rows.append({"step": step, "keys_identical": a["keys"] == b["keys"],
                     "tensors_identical": a["batch_sha256"] == b["batch_sha256"],
                     "loss_straight": a["loss"], "loss_resumed": b["loss"],
                     "abs_loss_diff": abs(a["loss"] - b["loss"])})
    complete = [r for r in rows if "missing" not in r]
    max_diff = max((r["abs_loss_diff"] for r in complete), default=float("nan"))
    result = {
        "steps_compared": len(complete),
        "missing_steps": [r["step"] for r in rows if "missing" in r],
        "keys_identical": all(r["keys_identical"] for r in complete),
        "tensors_identical": all(r["tensors_identical"] for r in complete),
        "max_abs_loss_diff": max_diff,
        "tolerance": tolerance,
        "rows": rows,
    }
    result["passed"] = bool(complete) and not result["missing_steps"] and result["keys_identical"] \
        and result["tensors_identical"] and max_diff <= tolerance
    return result


def plot(straight: dict[int, dict], resumed: dict[int, dict], resume_step: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(straight)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot(steps, [straight[s]["loss"] for s in steps], label="uninterrupted", lw=2)
    rs = sorted(resumed)
    ax.plot(rs, [resumed[s]["loss"] for s in rs], "--", label="killed + resumed", lw=1.5)
    ax.axvline(resume_step, color="gray", ls=":", label=f"resumed from step {resume_step}")
    ax.set_ylabel("loss")
    ax.legend()
    common = [s for s in steps if s in resumed]
    bx.plot(common, [abs(straight[s]["loss"] - resumed[s]["loss"]) for s in common], color="crimson")
    bx.set_ylabel("|Δloss|")
    bx.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def check_resume(spec: RunSpec, kill_at: int, out: Path, resume_nproc: int | None = None,
                 resume_workers: int | None = None, tolerance: float = 0.0, log=print) -> dict:
    if not 2 <= kill_at <= spec.steps:
        raise ValueError(f"--kill-at must be between 2 and --steps ({spec.steps}), got {kill_at}")
    out.mkdir(parents=True, exist_ok=True)
    straight_dir, killed_dir = out / "straight", out / "killed"
    for d in (straight_dir, killed_dir):
        if d.exists():
            import shutil

            shutil.rmtree(d)
        d.mkdir(parents=True)
    log(f"[1/3] uninterrupted run: {spec.steps} steps on {spec.nproc} rank(s)")
    _run(trainer_command(spec, straight_dir), straight_dir / "stdout.txt")
    log(f"[2/3] run killed with SIGKILL during step {kill_at}")
    last_logged = run_killed(spec, killed_dir, kill_at)
    before = read_log(killed_dir / "log.jsonl")
    resume_spec = RunSpec(spec.config, spec.steps, resume_nproc or spec.nproc,
                          resume_workers if resume_workers is not None else spec.num_workers, spec.overrides)
    latest = (killed_dir / "checkpoints" / "latest")
    resume_step = int(latest.read_text().strip().split("_")[1]) if latest.is_file() else 0
    log(f"      killed after step {last_logged} was logged; latest checkpoint: step {resume_step}")
    log(f"[3/3] resume on {resume_spec.nproc} rank(s)"
        + (f" x {resume_workers} worker(s)" if resume_workers is not None else ""))
    lines_before = _count_lines(killed_dir / "log.jsonl")
    _run(trainer_command(resume_spec, killed_dir, resume=True), killed_dir / "stdout.txt")
    # only rows the resumed process wrote count: nothing may have survived the kill
    straight, resumed = read_log(straight_dir / "log.jsonl"), read_log(killed_dir / "log.jsonl", lines_before)
    result = compare(straight, resumed, resume_step + 1, spec.steps, tolerance)
    result.update({"kill_at": kill_at, "killed_after_logged_step": last_logged,
                   "kill_landed_mid_step": last_logged == kill_at - 1 and kill_at not in before,
                   "resume_step": resume_step, "layout": {"nproc": spec.nproc, "num_workers": spec.num_workers},
                   "resume_layout": {"nproc": resume_spec.nproc, "num_workers": resume_spec.num_workers}})
    (out / "report.json").write_text(json.dumps(result, indent=1))
    plot(straight, {**before, **resumed}, resume_step, out / "loss.png")
    return result


def verdict(result: dict) -> str:
    head = "PASS" if result["passed"] else "FAIL"
    return (f"{head}: {result['steps_compared']} steps compared after resuming from step {result['resume_step']} "
            f"(killed during step {result['kill_at']}): keys identical={result['keys_identical']}, "
            f"tensors identical={result['tensors_identical']}, max |Δloss|={result['max_abs_loss_diff']:.3g} "
            f"(tolerance {result['tolerance']:g})")
