"""``energon-platform replay``: re-run part of a run with other config values (typically the
``loader.exclude`` rules of ``spikes --exclude-from``) into a new folder (see docs/spikes.md).

The newest checkpoint saved before step ``--from`` is copied into the new folder (the run's own
folder is only read) and the reference trainer continues from it for ``--steps`` steps. The rules
apply from their own step on, so every replayed step before ``--from`` must be the original's:
its keys and batch digests are checked against the original log, as ``check-resume`` checks a
resumed run; the losses show where the replay departs from the original.

A replay that fails once it has started writing (a full disk while its checkpoint is copied or
its steps trained, any error of the trainer) leaves nothing half-written: what it wrote in
``--out`` is removed, and so is the folder when the replay made it. A full disk or any other
failed write is a `ReplayError` (one line naming ``--out`` and the cause).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from energon_platform.config import RunConfig
from energon_platform.training import checkpoint
from energon_platform.training.resume_check.comparison import compare
from energon_platform.training.run_record import RUN_JSON, RUN_YAML
from energon_platform.training.spike_samples import LogRows
from energon_platform.training.step_log_readers import JsonLines
from energon_platform.training.train import train
from storage.outputs import OutputError, check_folder

#: the file that marks a folder as a replay's (what it replays); ``--overwrite`` needs it
MARK = "replay.json"
#: what a replay writes in its folder: all an ``--overwrite`` may delete
RUN_NAMES = {"log.jsonl", "checkpoints", MARK, RUN_YAML, RUN_JSON}


class ReplayError(ValueError):
    """A replay that cannot start (bad inputs); one line naming the input and what to do."""


@dataclass(frozen=True)
class ReplayPlan:
    """Where a replay starts and ends: the original run's checkpoint (saved after step
    ``start``), the first step that may differ (``first``, the ``--from`` step) and the last
    step it trains (``last``)."""

    checkpoint: Path
    start: int
    first: int
    last: int


def _last_logged_step(log: Path) -> int | None:
    """The highest step of the run's log; None when it logs none."""
    return max((row["step"] for row in LogRows(log, JsonLines())), default=None)


def plan_replay(run: Path, first: int, steps: int) -> ReplayPlan:
    """The `ReplayPlan` of replaying ``run`` from step ``first`` for ``steps`` steps after
    its checkpoint; `ReplayError` for a run without a log, a step beyond the log, no
    checkpoint saved before ``first``, or ``steps`` too few to reach ``first``."""
    log = run / "log.jsonl"
    if not log.is_file():
        raise ReplayError(f"{log}: no step log there; pass the folder of a reference-trainer run")
    logged = _last_logged_step(log)
    if logged is None or first > logged:
        raise ReplayError(
            f"--from {first}: {log} logs {'no step' if logged is None else f'steps up to {logged}'}; "
            f"pick a step it logs (see energon-platform spikes --run {run})"
        )
    found = checkpoint.newest_at_or_before(run / "checkpoints", first - 1)
    if found is None:
        raise ReplayError(
            f"--from {first}: {run / 'checkpoints'} holds no complete checkpoint saved before step "
            f"{first}; pick a later --from, or train the run again from the start"
        )
    start = int(found.name.removeprefix("step_"))
    if start + steps < first:
        raise ReplayError(
            f"--steps {steps}: the replay would stop at step {start + steps}, before --from "
            f"{first} (it starts after the checkpoint of step {start}); pass --steps "
            f"{first - start} or more"
        )
    return ReplayPlan(found, start, first, start + steps)


#: what a replay's `MARK` records (`replay` writes it first)
MARK_KEYS = {"run": str, "from": int, "steps": int}


def _marked(folder: Path) -> bool:
    """Whether ``folder`` holds a replay's `MARK`: a JSON object with the `MARK_KEYS`."""
    try:
        mark = json.loads((folder / MARK).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(mark, dict) and all(isinstance(mark.get(k), t) for k, t in MARK_KEYS.items())


def is_replay(folder: Path) -> bool:
    """Whether ``folder`` holds a replay's run and nothing else: its `MARK` and only `RUN_NAMES`
    (a training run's folder, which has no mark, is never a replay's; a replay's folder with a
    file of the user's in it is not either), or only the run lock of a replay stopped before it
    wrote its mark."""
    names = {p.name for p in folder.iterdir()}
    if names == {"checkpoints"} and (folder / "checkpoints").is_dir():
        return [p.name for p in (folder / "checkpoints").iterdir()] in ([], [".run.lock"])
    return names <= RUN_NAMES and _marked(folder)


def foreign(folder: Path) -> list[str]:
    """The names in ``folder`` no replay wrote, for `is_replay`'s refusal: with a replay's mark,
    those outside `RUN_NAMES`; without one, every name (a replay writes its mark first)."""
    names = [p.name for p in folder.iterdir()]
    return [n for n in names if n not in RUN_NAMES] if _marked(folder) else names


def _empty(out: Path) -> None:
    """Remove from ``out`` every name a replay writes (`RUN_NAMES`), but the run lock."""
    for name in sorted(RUN_NAMES):
        target = out / name
        if target.is_dir() and not target.is_symlink():
            for p in target.iterdir():
                if p.name != ".run.lock":
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        else:
            target.unlink(missing_ok=True)


def claim_out(out: Path) -> None:
    """Empty ``out`` of what a replay wrote (never the run lock, which the caller holds: the
    `checkpoint.RunLock` of ``out / "checkpoints"``), once `storage.outputs.check_folder` has
    accepted it; `ReplayError` if it is no longer a replay's (changed since the check)."""
    if out.is_dir() and any(out.iterdir()) and not is_replay(out):
        raise ReplayError(f"--out {out}: changed since it was checked; choose another --out")
    _empty(out)


def _failed_write(error: BaseException, out: Path) -> ReplayError | None:
    """The one line of a replay stopped by a failed write (a full disk: an ``OSError``, the
    copy's ``shutil.Error`` or the checkpoint's `checkpoint.CheckpointError`), else None."""
    if isinstance(error, shutil.Error):  # the copy's list of (source, destination, why)
        failures = error.args[0] if error.args and isinstance(error.args[0], list) else []
        why = failures[0][2] if failures and len(failures[0]) == 3 else str(error)
    elif isinstance(error, OSError):
        why = error.strerror or str(error)
    elif isinstance(error, checkpoint.CheckpointError):  # the failed write under it, if one
        under = error.__context__
        why = under.strerror if isinstance(under, OSError) and under.strerror else str(error)
    else:
        return None
    return ReplayError(
        f"--out {out}: the replay could not write there ({why}); what it had written was "
        f"removed; free space, or choose another --out"
    )


def _rows(log: Path, start: int, last: int) -> dict[int, dict]:
    """The rows of ``log`` for steps ``start+1 .. last``, by step."""
    return {r["step"]: r for r in LogRows(log, JsonLines()) if start < r["step"] <= last}


def _same_loss(a: float, b: float) -> bool:
    """Whether two logged losses are the same (two NaNs are)."""
    return a == b or (math.isnan(a) and math.isnan(b))


def compare_replay(original: dict[int, dict], replayed: dict[int, dict], plan: ReplayPlan) -> dict:
    """The replay's steps against the original's: ``identical`` (every replayed step before
    ``plan.first`` logged on both sides with the same keys and batch digests), ``mismatch``
    (the first step that is not, with what differs; None when identical), ``loss_differs_at``
    (the first replayed step whose loss is not the original's; None when none is) and ``losses``
    (``[step, original, replayed]`` for every step from ``plan.first`` on that both logged)."""
    before = compare(original, replayed, plan.start + 1, plan.first - 1, math.inf)
    mismatch = None
    for row in before["rows"]:
        if "missing" in row:
            mismatch = {"step": row["step"], "what": f"not logged by the {row['missing']} run"}
        elif row["keys_identical"] is False or row["tensors_identical"] is False:
            what = "keys" if row["keys_identical"] is False else "batch digests"
            mismatch = {"step": row["step"], "what": f"{what} differ"}
        if mismatch:
            break
    both = [s for s in range(plan.start + 1, plan.last + 1) if s in original and s in replayed]
    differs = [s for s in both if not _same_loss(original[s]["loss"], replayed[s]["loss"])]
    return {
        "checkpoint": str(plan.checkpoint),
        "start": plan.start,
        "first": plan.first,
        "last": plan.last,
        "identical": mismatch is None,
        "mismatch": mismatch,
        "loss_differs_at": differs[0] if differs else None,
        "losses": [[s, original[s]["loss"], replayed[s]["loss"]] for s in both if s >= plan.first],
    }


def replay(
    cfg: RunConfig,
    run: str | Path,
    out: str | Path,
    first: int,
    steps: int,
    *,
    num_workers: int | None = None,
    overwrite: bool = False,
) -> dict:
    """Replay ``run`` from step ``first`` with ``cfg`` (the run's config with the overrides) into
    ``out``: the newest checkpoint before ``first`` copied into ``out/checkpoints`` (``run`` is
    only read), ``steps`` steps trained after it by the reference trainer on one process, the
    learning-rate schedule spanning ``train.steps`` as in the original run. Returns
    `compare_replay`'s result; `ReplayError` for bad inputs, before anything is
    written."""
    run, out = Path(run), Path(out)
    plan = plan_replay(run, first, steps)
    made = not out.exists()
    try:  # refused before the lock is taken (which creates out/checkpoints)
        check_folder(
            out,
            is_replay,
            "replay",
            overwrite=overwrite,
            inputs=(run, cfg.source, cfg.data.path),
            foreign=foreign,
        )
    except OutputError as e:
        raise ReplayError(str(e)) from None
    failed = True
    try:
        with checkpoint.RunLock(out / "checkpoints") as lock:
            claim_out(out)
            try:
                mark = {"run": str(run.resolve()), "from": first, "steps": steps}
                (out / MARK).write_text(json.dumps(mark) + "\n")
                checkpoint.copy_as_latest(plan.checkpoint, out / "checkpoints")
                train(
                    cfg,
                    resume=True,
                    num_workers=num_workers,
                    out=str(out),
                    quiet=True,
                    until=plan.last,
                    lock=lock,
                )
                failed = False
            except Exception as e:  # nothing half-written stays (the lock goes on its exit)
                _empty(out)
                failed = _failed_write(e, out)
                if failed is None:
                    raise
                raise failed from None
    finally:  # a failed replay's empty folders: its checkpoints/, and --out if it made it
        for folder in (out / "checkpoints", out) if failed else ():
            if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                if folder != out or made:
                    folder.rmdir()
    original = _rows(run / "log.jsonl", plan.start, plan.last)
    return compare_replay(original, _rows(out / "log.jsonl", plan.start, plan.last), plan)


def summary(result: dict, run: str | Path, out: str | Path) -> list[str]:
    """The lines ``energon-platform replay`` prints for a replay that reproduced the steps
    before ``--from``: what it compared, where the loss departs, and the report to draw."""
    start, first, last = result["start"], result["first"], result["last"]
    lines = [f"replayed steps {start + 1}-{last} from {result['checkpoint']} into {out}"]
    if first > start + 1:
        lines.append(
            f"steps {start + 1}-{first - 1} are the original's (keys and batch digests checked)"
        )
    at = result["loss_differs_at"]
    lines.append(
        "the replayed loss is the original's at every step"
        if at is None
        else f"the replayed loss first differs at step {at}"
    )
    lines.append("step  original loss  replayed loss")
    lines += [f"{s:4d}  {a:13.4f}  {b:13.4f}" for s, a, b in result["losses"]]
    lines.append(
        f"draw both: energon-platform report --run {run} --compare {out} --out report.html"
    )
    return lines


def mismatch_line(result: dict) -> str:
    """The one line a replay that did not reproduce the steps before ``--from`` fails with."""
    m = result["mismatch"]
    return (
        f"step {m['step']} of the replay is not the original's ({m['what']}), though it comes "
        f"before --from {result['first']}: replay with the run's own config and --set values"
    )
