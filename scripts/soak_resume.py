"""Kill soak: many SIGKILLs at random moments of one training run, each resume on a random layout.

    python scripts/soak_resume.py --kills 50 --seed 1 --json out/soak.json

Trains the reference trainer (``energon-platform train``) once straight through (the reference),
then runs the same training as a chain of processes in one folder: each process resumes from the
latest checkpoint (``--resume``) on a random layout (1 to ``--max-nproc`` ranks, via torchrun
when more than 1, dividing the global batch; 0 to ``--max-workers`` loader workers) and, until
``--kills`` kills are made, is killed with SIGKILL (its whole process tree) at a random moment:

* ``step``: inside a step (after step s-1 is logged, a random fraction of a step later);
* ``checkpoint``: while a checkpoint is being written (its ``.tmp-step_*`` folder exists);
* ``startup``: while the trainer's first child processes start (the length index's build pool of
  a balanced run, the loader's workers) or, without workers, at a random time before the first
  step. The length index the reference stored with the data is removed before the chain starts,
  so the chain's first processes build it again, as a new job does.

At the end the union of all logged steps must equal the reference: the steps each process kept
(those up to the checkpoint the next process resumed from) chain to every global batch once, in
order, and every row ever logged (redone ones included) has the reference's sample keys and
tensor digest (``batch_sha256``). A kill is survived when the next process that trains resumes
from the newest complete checkpoint at the kill and logs only rows identical to the reference.
Seeded (``--seed``): the same arguments make the same kill plan (the moments themselves depend on
timing). Bounded: no kill is made after ``--max-minutes``; the run is then finished unkilled.
Exit status 0 when every kill was survived and the union matches, else 1.

Without ``--config`` it converts ``data/coco_mini`` into ``OUT/data`` (once) and trains a tiny
model on it (global batch 4, checkpoint every 2 steps).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import yaml

from energon_platform.config import load_config
from energon_platform.training import checkpoint
from energon_platform.training.resume_check import (
    LogTail,
    RunSpec,
    kill_when,
    launch,
    run_command,
    trainer_command,
)

REPO = Path(__file__).resolve().parents[1]


def tiny_config(out: Path, seed: int) -> Path:
    from converters.convert import ConvertOptions, run_conversion

    data = out / "data" / "coco_mini"
    run_conversion(
        "coco",
        {
            "annotations": str(REPO / "data/coco_mini/captions.json"),
            "images": str(REPO / "data/coco_mini/images"),
        },
        ConvertOptions(out=str(data), samples_per_shard=64, val_fraction=0.1, progress=False),
    )
    path = out / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(data)},
                "encoder": str(REPO / "configs/encoders/image_text_small.yaml"),
                "loader": {
                    "global_batch_size": 4,
                    "num_workers": 0,
                    "seed": seed,
                    "shuffle_buffer": 64,
                },
                "model": {"dim": 16, "layers": 1, "heads": 2, "patch": 16},
                "train": {"steps": 100, "checkpoint_every": 2, "warmup": 1, "keep_checkpoints": 3},
            }
        )
    )
    return path


def forget_stored_indexes(cfg) -> None:
    """Remove the length indexes stored with ``cfg``'s datasets (``DATASET/.energon-platform``):
    the next run builds them at start-up, as a new job does, and start-up kills can land there."""
    from energon_platform.loader.datasets import open_datasets
    from storage.paths import DERIVED_FOLDER, is_remote

    for entry in open_datasets(str(cfg.data.path), cfg.data.train_split).entries:
        if not is_remote(entry.source.path):
            shutil.rmtree(Path(entry.source.path) / DERIVED_FOLDER, ignore_errors=True)


def log_lines(path: Path) -> list[dict]:
    """The complete rows of a trainer log (a torn last line is no row)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1] if line.strip()]


def descendants(pid: int) -> int:
    import psutil

    try:
        return len(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return 0


def tmp_checkpoints(ckpt: Path) -> set[tuple[str, int]]:
    """Checkpoint folders being written: (name, inode) of each ``.tmp-step_*``."""
    try:
        return {(e.name, e.inode()) for e in os.scandir(ckpt) if e.name.startswith(".tmp-step_")}
    except FileNotFoundError:
        return set()


def newest_checkpoint(ckpt: Path) -> int:
    found = checkpoint.find(ckpt) if ckpt.is_dir() else None
    return found.content["step"] if found else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--config",
        help="run config (default: a tiny one on data/coco_mini, converted into OUT/data)",
    )
    p.add_argument("--out", default="out/soak", help="work folder (its runs are replaced)")
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--steps", type=int, help="steps of the run (default: 3 per kill, at least 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-nproc", type=int, default=2, help="largest world size drawn (default 2)")
    p.add_argument(
        "--max-workers", type=int, default=3, help="most loader workers per rank drawn (default 3)"
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        default=20.0,
        help="no kill after this (the run is then finished)",
    )
    p.add_argument("--json", help="write the figures and every attempt there")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = Path(args.config).resolve() if args.config else tiny_config(out, args.seed)
    cfg = load_config(config)
    steps = args.steps or max(12, 3 * args.kills)
    every = cfg.train.checkpoint_every
    sizes = [n for n in range(1, args.max_nproc + 1) if cfg.loader.global_batch_size % n == 0]
    t_soak = time.perf_counter()

    # the reference: straight through, one rank
    ref_dir, run_dir = out / "reference", out / "soak"
    for d in (ref_dir, run_dir):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    t0 = time.perf_counter()
    run_command(
        trainer_command(RunSpec(str(config), steps, 1, 0), ref_dir),
        ref_dir / "stdout.txt",
    )
    ref_wall = time.perf_counter() - t0
    reference = {r["step"]: r for r in log_lines(ref_dir / "log.jsonl")}
    assert sorted(reference) == list(range(1, steps + 1)), (
        "the reference run did not log every step"
    )
    # mean step time, checkpoints and evaluations included
    step_s = reference[steps]["elapsed_s"] / steps
    first_step_s = ref_wall - reference[steps]["elapsed_s"]  # start-up until the first step
    print(
        f"reference: {steps} steps in {ref_wall:.1f} s ({step_s * 1000:.0f} ms/step, {first_step_s:.1f} s start-up)",
        flush=True,
    )

    forget_stored_indexes(cfg)
    log_path, ckpt = run_dir / "log.jsonl", run_dir / "checkpoints"
    attempts: list[dict] = []
    deadline = time.time() + args.max_minutes * 60
    while True:
        done = log_lines(log_path)
        if done and done[-1]["step"] == steps and attempts and attempts[-1]["exit"] == 0:
            break
        start = newest_checkpoint(ckpt)
        layout = {"nproc": rng.choice(sizes), "num_workers": rng.randint(0, args.max_workers)}
        kill = len([a for a in attempts if a["killed"]]) < args.kills and time.time() < deadline
        kind = (
            rng.choices(["step", "checkpoint", "startup"], weights=[2, 1, 1])[0] if kill else None
        )
        if kind == "step" and start + 2 > steps:
            kind = "checkpoint" if start + every <= steps else "startup"
        target = (
            rng.randint(start + 2, min(steps, start + 2 * every + 1)) if kind == "step" else None
        )
        delay = rng.random()  # where in the window the kill lands
        stale = tmp_checkpoints(ckpt)
        tail = LogTail(log_path)
        lines_before = len(done)
        spec = RunSpec(str(config), steps, layout["nproc"], layout["num_workers"])
        record = {
            "layout": layout,
            "resume_from": start,
            "kind": kind,
            "target": target,
            "killed": False,
        }
        t_launch = time.perf_counter()
        with open(run_dir / "stdout.txt", "ab") as f:
            proc = launch(trainer_command(spec, run_dir, resume=True), f)
            base = layout["nproc"] if layout["nproc"] > 1 else 0  # torchrun's ranks are not workers
            at = {}

            def ready() -> bool:
                if kind == "step":
                    if target - 1 in tail.steps():
                        at.setdefault("seen", time.perf_counter())
                        return time.perf_counter() - at["seen"] >= delay * step_s
                    return False
                if kind == "checkpoint":
                    if tmp_checkpoints(ckpt) - stale:
                        at.setdefault("seen", time.perf_counter())
                        return time.perf_counter() - at["seen"] >= delay * 0.005
                    return False
                if layout["num_workers"]:  # startup: loader workers appearing
                    if descendants(proc.pid) > base:
                        at.setdefault("seen", time.perf_counter())
                        return time.perf_counter() - at["seen"] >= delay * 0.1
                    return bool(tail.steps())
                return time.perf_counter() - t_launch >= 0.3 + delay * first_step_s or bool(
                    tail.steps()
                )

            if kind is not None:
                try:
                    kill_when(proc, ready, 600, f"the {kind} moment")
                    record.update(killed=True, exit=None)
                # the process ended before the moment came (run finished, or crashed)
                except Exception as e:
                    record.update(exit=proc.returncode, note=str(e).splitlines()[0])
            else:
                record["exit"] = proc.wait(timeout=3600)
        record["wall_s"] = round(time.perf_counter() - t_launch, 3)
        rows = log_lines(log_path)[lines_before:]
        record.update(
            rows=[r["step"] for r in rows],
            resumed_from=rows[0].get("resumed_from") if rows else None,
            mismatched=[r["step"] for r in rows if not same_batch(r, reference.get(r["step"]))],
        )
        if record["killed"]:
            record["in_checkpoint_write"] = bool(tmp_checkpoints(ckpt) - stale)
            record["landed"] = (
                "checkpoint" if record["in_checkpoint_write"] else "step" if rows else "startup"
            )
            record["checkpoint_after"] = newest_checkpoint(ckpt)
        attempts.append(record)
        print(
            f"  {len(attempts):3d}: {layout['nproc']} rank(s) x {layout['num_workers']} worker(s), from step "
            f"{start}: "
            + (
                f"killed ({record['landed']}) after step {rows[-1]['step'] if rows else start}"
                if record["killed"]
                else f"exit {record['exit']}"
            ),
            flush=True,
        )
        if not record["killed"] and record["exit"] != 0:
            print(
                f"a process failed (exit {record['exit']}); see {run_dir / 'stdout.txt'}",
                flush=True,
            )
            break
    report = judge(attempts, reference, steps, step_s, ref_wall, time.perf_counter() - t_soak)
    report.update(seed=args.seed, config=str(config), out=str(out))
    print(summary(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**report, "attempts": attempts}, indent=1))
    return 0 if report["passed"] else 1


def same_batch(row: dict, ref: dict | None) -> bool:
    return (
        ref is not None
        and row["keys"] == ref["keys"]
        and row["batch_sha256"] == ref["batch_sha256"]
        and row["global_batch"] == ref["global_batch"]
    )


def judge(
    attempts: list[dict],
    reference: dict,
    steps: int,
    step_s: float,
    ref_wall: float,
    soak_wall: float,
) -> dict:
    kills = [i for i, a in enumerate(attempts) if a["killed"]]
    training = [i for i, a in enumerate(attempts) if a["rows"]]
    survived = 0
    # the next process that trains must continue from the newest complete checkpoint
    for i in kills:
        nxt = next((j for j in training if j > i), None)
        ok = (
            nxt is not None
            and attempts[nxt]["resumed_from"] == attempts[i]["checkpoint_after"]
            and not attempts[nxt]["mismatched"]
            and not attempts[i]["mismatched"]
            and all(
                attempts[j]["killed"] or attempts[j]["exit"] == 0 for j in range(i + 1, nxt + 1)
            )
        )
        attempts[i]["survived"] = ok
        survived += ok
    # the lineage: each training process's steps up to where the next one resumed
    lineage, lost = [], []
    for n, j in enumerate(training):
        upto = attempts[training[n + 1]]["resumed_from"] if n + 1 < len(training) else steps
        kept = [s for s in attempts[j]["rows"] if attempts[j]["resumed_from"] < s <= upto]
        lineage += kept
        attempts[j]["kept_steps"] = len(kept)
    for i in kills:
        lost.append(attempts[i]["wall_s"] - attempts[i].get("kept_steps", 0) * step_s)
    mismatched = sorted({s for a in attempts for s in a["mismatched"]})
    in_order = lineage == list(range(1, steps + 1))
    layouts = sorted({f"{a['layout']['nproc']}x{a['layout']['num_workers']}" for a in attempts})
    landed = {
        k: sum(1 for i in kills if attempts[i]["landed"] == k)
        for k in ("step", "checkpoint", "startup")
    }
    return {
        "passed": survived == len(kills)
        and in_order
        and not mismatched
        and attempts[-1].get("exit") == 0,
        "kills_made": len(kills),
        "kills_survived": survived,
        "kills_landed": landed,
        "processes": len(attempts),
        "layouts_used": layouts,
        "steps": steps,
        "batches_checked": len(lineage),
        "every_batch_once_in_order": in_order,
        "rows_logged": sum(len(a["rows"]) for a in attempts),
        "rows_mismatched": mismatched,
        "time_lost_per_kill_s": {
            "mean": round(statistics.fmean(lost), 2) if lost else 0.0,
            "median": round(statistics.median(lost), 2) if lost else 0.0,
            "max": round(max(lost), 2) if lost else 0.0,
        },
        "extra_wall_per_kill_s": round(
            (sum(a["wall_s"] for a in attempts) - ref_wall) / max(1, len(kills)), 2
        ),
        "reference_wall_s": round(ref_wall, 1),
        "soak_wall_s": round(soak_wall, 1),
    }


def summary(r: dict) -> str:
    t = r["time_lost_per_kill_s"]
    return "\n".join(
        [
            f"{'PASS' if r['passed'] else 'FAIL'}: kills survived {r['kills_survived']}/{r['kills_made']} "
            f"(landed: {r['kills_landed']['step']} inside steps, "
            f"{r['kills_landed']['checkpoint']} during checkpoint writes, "
            f"{r['kills_landed']['startup']} during start-up), {r['processes']} processes",
            f"layouts used (ranks x workers): {', '.join(r['layouts_used'])}",
            f"batches checked: {r['batches_checked']} of {r['steps']}: every global batch once, in order: "
            f"{r['every_batch_once_in_order']}; {r['rows_logged']} rows logged, "
            f"{len(r['rows_mismatched'])} with other keys or tensors than the reference",
            f"time lost per kill: mean {t['mean']} s, median {t['median']} s, max {t['max']} s "
            f"(process wall time minus the steps it kept); soak {r['soak_wall_s']} s, "
            f"reference {r['reference_wall_s']} s",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
