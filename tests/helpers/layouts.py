"""Global batches of a run config on a ranks x workers layout, and a script run that is SIGKILLed
once it logged enough steps: for the exact and elastic resume tests of the encoders."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def loaders_at(config, ranks: int, state: dict | None = None, workers: int = 0) -> list:
    """One in-process ``TrainLoader`` per rank of a ``ranks``-rank run, each restored from
    ``state`` (a saved loader state) when given."""
    from energon_platform.loader.train_loader import TrainLoader

    loaders = [
        TrainLoader(config, rank=r, world_size=ranks, num_workers=workers) for r in range(ranks)
    ]
    if state is not None:
        for loader in loaders:
            loader.load_state_dict(state)
    return loaders


def layout_batches(config, ranks: int, workers: int, steps: int, digests: Callable, states=None):
    """``steps`` global batches as ``[(key, digest), ...]`` (ranks in order; ``digests(batch)`` gives a
    key → digest mapping), then every rank's state as JSON data. ``states``: restore each rank from
    ``states[rank]`` (or ``states[0]`` for ranks the saved run did not have) first."""
    from energon_platform.loader.train_loader import TrainLoader

    loaders = [
        TrainLoader(config, rank=r, world_size=ranks, num_workers=workers) for r in range(ranks)
    ]
    if states is not None:
        for r, loader in enumerate(loaders):
            loader.load_state_dict(states[r] if r < len(states) else states[0])
    out = []
    for _ in range(steps):
        parts = [next(loader) for loader in loaders for _ in range(loader.accumulation)]
        out.append([(k, d) for p in parts for k, d in digests(p).items()])
    saved = [json.loads(json.dumps(loader.state_dict())) for loader in loaders]
    for loader in loaders:
        loader.close()
    return out, saved


def logged_lines(out: Path) -> int:
    """Lines of ``out/log.jsonl`` so far (0 before it exists)."""
    log = out / "log.jsonl"
    return len(log.read_text().splitlines()) if log.exists() else 0


def run_logging_script(
    script: str, args: list, out: Path, cwd: Path, kill_after: int | None = None
) -> None:
    """Run ``python -c script *args`` (it writes ``out/log.jsonl``): to its end (a non-zero exit
    fails with its stderr), or SIGKILLed as soon as it logged ``kill_after`` lines."""
    out.mkdir(exist_ok=True)
    with subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    ) as proc:
        if kill_after is None:
            assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-3000:]
            return
        deadline = time.time() + 300
        while time.time() < deadline and logged_lines(out) < kill_after and proc.poll() is None:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)


KILL_SCRIPT = """
import json, os, sys
from energon_platform.loader.train_loader import TrainLoader
from {module} import digests, shards_config
config = shards_config(sys.argv[1], num_workers=int(sys.argv[3]))
out = sys.argv[2]
loader = TrainLoader(config)
state_file = os.path.join(out, "state.json")
if os.path.exists(state_file):
    loader.load_state_dict(json.load(open(state_file)))
with open(os.path.join(out, "log.jsonl"), "a") as log:
    while loader.next_microbatch < int(sys.argv[4]):  # up to this many steps in all
        step = loader.next_microbatch
        batch = next(loader)
        log.write(json.dumps({{"step": step, "docs": sorted(digests(batch).items())}}) + "\\n")
        log.flush()
        tmp = state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(loader.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, state_file)
"""


def assert_sigkill_resume_identical(module: str, shards: Path, out: Path, steps: int) -> None:
    """The per-modality resume check: a loader process (``shards_config(shards, num_workers=2)`` and
    ``digests`` of the test module ``module``, which saves its state after every step) SIGKILLed
    mid-run and resumed with 1 worker logs, for every step, the documents an uninterrupted loader
    in this process gives (a step logged twice, killed after its log line, must agree)."""
    from energon_platform.loader.train_loader import TrainLoader

    tests = importlib.import_module(module)
    loader = TrainLoader(tests.shards_config(shards, num_workers=2))
    reference = [sorted(tests.digests(next(loader)).items()) for _ in range(steps)]
    loader.close()
    script = KILL_SCRIPT.format(module=module)
    repo = Path(__file__).resolve().parents[2]
    run_logging_script(script, [shards, out, 2, steps], out, repo, kill_after=4)
    assert 4 <= logged_lines(out) < steps, "the kill must land in the middle of the run"
    run_logging_script(script, [shards, out, 1, steps], out, repo)  # up to the same last step
    resumed = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in resumed}) == list(range(steps))
    # the state is saved after each logged step: at most the step the kill interrupted runs twice
    assert len(resumed) <= steps + 1, "the resumed process must continue, not start over"
    for r in resumed:
        assert [list(d) for d in reference[r["step"]]] == r["docs"], r["step"]
