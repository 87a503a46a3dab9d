"""Shared by the trainer integration tests (tests/integrations/test_{accelerate,deepspeed,
lightning}.py): a small run config on the embedded COCO corpus, the command line of an example
under scripts/examples/, ``energon-platform check-resume`` on it, and the check of the sample
losses an example logs."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

from energon_platform.training.resume_check.processes import torchrun_argv
from scripts.bench.data import coco_dataset
from tests.helpers import REPO
from tests.helpers.cli import run_cli
from tests.helpers.run_configs import loader_config, write_config

EXAMPLES = REPO / "scripts" / "examples"
PY = shlex.quote(sys.executable)


def write_run_config(base: Path, out: Path, **loader) -> Path:
    data = coco_dataset(base)
    return write_config(out, loader_config(data, **loader))


def example(
    script: str, config: Path, *args: str, nproc: int = 1, launcher: str | None = None
) -> str:
    """The command line of ``scripts/examples/<script>``: under ``launcher`` if given (a command
    that takes the script's path next), else torchrun with ``nproc`` processes, else python."""
    if launcher is None:
        launcher = shlex.join(torchrun_argv(nproc)) if nproc > 1 else PY
    return " ".join(
        [launcher, shlex.quote(str(EXAMPLES / script)), "--config", shlex.quote(str(config)), *args]
    )


def check_resume(
    out: Path,
    cmd: str,
    resume_cmd: str,
    steps: int,
    kill_at: int,
    tolerance: float | None = None,
    straight_from: Path | None = None,
) -> tuple[subprocess.CompletedProcess, dict]:
    """Run check-resume (exact form: the examples log with StepLog; ``tolerance``: its
    ``--tolerance``, the |Δloss| allowed; ``straight_from``: an earlier check's folder whose
    uninterrupted run is reused); its result and report.json."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    r = run_cli(
        "check-resume",
        "--out",
        out,
        "--cmd",
        cmd,
        "--resume-cmd",
        resume_cmd,
        "--steps",
        steps,
        "--kill-at",
        kill_at,
        *(["--tolerance", tolerance] if tolerance is not None else []),
        *(["--straight-from", straight_from] if straight_from is not None else []),
        timeout=600,
        cwd=REPO,
        env=env,
    )
    path = out / "report.json"
    assert path.exists(), (
        f"check-resume exited {r.returncode} without a report:\n{r.stdout}\n{r.stderr[-4000:]}"
    )
    return r, json.loads(path.read_text())


def assert_exact_pass(
    r: subprocess.CompletedProcess, report: dict, loss_tolerance: float = 0.0
) -> None:
    """Passed on the same keys and tensors; the loss identical (``loss_tolerance``: within it,
    for a resume on another number of processes, whose all-reduce sums in another order)."""
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr[-3000:]
    assert (
        report["mode"] == "exact"
        and report["restored"]
        and report["resumed_from_logged"] == report["resume_step"]
    )
    assert (
        report["keys_identical"]
        and report["tensors_identical"]
        and report["max_abs_loss_diff"] <= loss_tolerance
    )


def assert_fails(r: subprocess.CompletedProcess, report: dict) -> None:
    assert r.returncode == 1 and "FAIL" in r.stdout and not report["passed"], (
        r.stdout + r.stderr[-3000:]
    )
    assert report["keys_identical"] is False and report["tensors_identical"] is False


def target_counts(config: Path, steps: int) -> list[tuple[list[str], list[int]]]:
    """For each of the first ``steps`` global batches of ``config``'s loader (one process): its
    keys and each key's number of target tokens (unpacked rows: a row's ``loss_mask`` sum)."""
    from energon_platform import TrainLoader, load_config

    loader = TrainLoader(load_config(config))
    batches = []
    for _ in range(steps):
        micro = [next(loader) for _ in range(loader.accumulation)]
        batches.append(
            (
                [k for b in micro for k in b.keys],
                [int(n) for b in micro for n in b.loss_mask.sum(dim=1)],
            )
        )
    loader.close()
    return batches


def assert_sample_losses_fit(log: Path | str, config: Path, group: int | None = None) -> None:
    """Every row of the StepLog ``log`` has one finite sample loss per key, and its loss is
    their mean weighted by the keys' target counts (:func:`target_counts`), taken over
    consecutive groups of ``group`` keys (a rank's or micro-batch's; None: all) and averaged:
    the loop's loss is the mean of those groups' token means."""
    rows = [json.loads(line) for line in Path(log).read_text().splitlines()]
    batches = target_counts(config, max(r["step"] for r in rows))
    for row in rows:
        keys, losses = row["keys"], row["sample_losses"]
        expected_keys, counts = batches[row["step"] - 1]
        assert keys == expected_keys and len(losses) == len(keys), row
        assert all(math.isfinite(v) for v in losses), row
        size = group or len(keys)
        means = [
            sum(v * n for v, n in zip(losses[i : i + size], counts[i : i + size]))
            / sum(counts[i : i + size])
            for i in range(0, len(keys), size)
        ]
        assert math.isclose(sum(means) / len(means), row["loss"], rel_tol=1e-5), row
