"""A balanced run SIGKILLed during start-up (its length index being built, its loader workers
starting) leaves nothing behind: no process of the run outlives it, its checkpoint folder is free,
and the immediate resume (an auto-restarting cluster job's first try) trains exactly like a run
that never stopped.

Only the trainer's own pid is killed (as the kernel's OOM killer or a node agent would), never its
process tree: what its forked children do after it is what is checked.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from energon_platform.training.resume_check import (
    RunSpec,
    launch,
    read_log,
    run_command,
    trainer_command,
)
from scripts.bench.data import coco_dataset, librispeech_dataset
from storage.paths import DERIVED_FOLDER
from tests.helpers import REPO

STEPS = 4
#: samples per shard of the blend's text part (three shards: its length index is built by a pool)
SHARD = 2048


@pytest.fixture(scope="module")
def balanced_config(tmp_path_factory) -> Path:
    """A packed, balanced three-modality blend whose text part spans three shards, so that its
    length index is built by a pool of worker processes (a shard each)."""
    from converters.convert import ConvertOptions, run_conversion

    base = tmp_path_factory.mktemp("startup-kills")
    manifest = base / "docs.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"id": f"doc-{i:05d}", "text": f"document {i} says {i % 97} things."}) + "\n"
            for i in range(2 * SHARD + 100)
        )
    )
    text = base / "text"
    run_conversion(
        "text",
        {"manifest": str(manifest), "text_column": "text", "id_column": "id", "fmt": None},
        ConvertOptions(out=str(text), samples_per_shard=SHARD, progress=False),
    )
    blend = base / "blend.yaml"
    blend.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {
                    "train": {
                        "blend": [
                            {"weight": 2, "path": str(coco_dataset(base))},
                            {"weight": 1, "path": str(librispeech_dataset(base))},
                            {"weight": 1, "path": str(text)},
                        ]
                    }
                },
            }
        )
    )
    config = base / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(blend), "val_split": None},
                "encoder": str(REPO / "configs/encoders/multimodal_packed.yaml"),
                "loader": {
                    "global_batch_size": 8,
                    "micro_batch_size": 4,
                    "num_workers": 2,
                    "seed": 5,
                    "balance": "attention",
                },
                "model": {"dim": 16, "layers": 1, "heads": 2, "patch": 16},
                "train": {"steps": STEPS, "checkpoint_every": 2, "warmup": 1},
            }
        )
    )
    return config


@pytest.fixture(scope="module")
def reference(balanced_config, tmp_path_factory) -> tuple[dict, Path]:
    """The uninterrupted run's rows, and the length cache it built."""
    out = tmp_path_factory.mktemp("reference")
    run_command(
        trainer_command(_spec(balanced_config, out / "lengths"), out),
        out / "stdout.txt",
        timeout=600,
    )
    return read_log(out / "log.jsonl"), out / "lengths"


def _spec(config: Path, cache: Path) -> RunSpec:
    return RunSpec(str(config), STEPS, 1, 2, overrides=(f"loader.length_cache={cache}",))


def _lives(p: psutil.Process) -> bool:
    """Whether ``p`` still runs (a zombie has ended: an orphan's waits for a reaper that may never come)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _processes_naming(out: Path) -> list[psutil.Process]:
    """Live processes whose command line names ``out`` (forked children keep their parent's)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if (
            str(out) in " ".join(p.info["cmdline"] or ())
            and p.info["status"] != psutil.STATUS_ZOMBIE
        ):
            found.append(p)
    return found


def _kill_trainer_when(spec: RunSpec, out: Path, moment, what: str) -> None:
    """Start the run and SIGKILL the trainer process alone once ``moment(pid)`` is true; then
    assert that no process of the run is left (within a second: the kernel's own delivery)."""
    with open(out / "stdout.txt", "ab") as f:
        proc = launch(trainer_command(spec, out, resume=True), f)
        deadline = time.time() + 300
        while proc.poll() is None and time.time() < deadline and not moment(proc.pid):
            time.sleep(0.002)
        assert proc.poll() is None, (
            f"the run ended before {what}: " + (out / "stdout.txt").read_text()[-2000:]
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    left = _processes_naming(out)
    for _ in range(50):
        if not left:
            break
        time.sleep(0.02)
        left = _processes_naming(out)
    for p in left:  # do not leak them into other tests
        p.kill()
    assert not left, (
        f"processes of the run killed {what} outlived it: {[(p.pid, p.name()) for p in left]}"
    )


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []


def _resume_is_exact(spec: RunSpec, out: Path, rows: dict) -> None:
    """The immediate resume succeeds and logs every step with the reference's batches and loss."""
    run_command(trainer_command(spec, out, resume=True), out / "stdout.txt", timeout=600)
    resumed = read_log(out / "log.jsonl")
    assert sorted(resumed) == list(range(1, STEPS + 1))
    for step, row in rows.items():
        got = resumed[step]
        assert (got["keys"], got["batch_sha256"], got["loss"]) == (
            row["keys"],
            row["batch_sha256"],
            row["loss"],
        ), step


@pytest.mark.slow
def test_run_killed_while_its_length_index_builds_resumes_at_once_and_exactly(
    balanced_config, reference, tmp_path
):
    rows, _ = reference
    spec = _spec(balanced_config, tmp_path / "lengths")
    # the reference run stored the text part's index with the data: this run must build it again
    store = balanced_config.parent / "text" / DERIVED_FOLDER / "lengths"
    shutil.rmtree(store)

    def building(pid: int) -> bool:  # the index's shard parts are being written by the pool
        return any(store.glob("parts-*/*.npz")) and bool(_children(pid))

    _kill_trainer_when(spec, tmp_path, building, "while its length index was built")
    assert not any(store.glob("*/meta.json")), "the kill must land while the index is built"
    _resume_is_exact(spec, tmp_path, rows)


@pytest.mark.slow
def test_run_killed_while_its_loader_workers_start_resumes_at_once_and_exactly(
    balanced_config, reference, tmp_path
):
    rows, cache = (
        reference  # the index is built: the trainer's first children are its loader workers
    )
    spec = _spec(balanced_config, cache)
    _kill_trainer_when(
        spec, tmp_path, lambda pid: bool(_children(pid)), "while its loader workers started"
    )
    assert not read_log(tmp_path / "log.jsonl"), "the kill must land before the first step"
    _resume_is_exact(spec, tmp_path, rows)


def test_loader_workers_die_with_a_killed_parent(balanced_config, reference, tmp_path):
    """Idle loader workers (their prefetch done) notice a dead parent only every few seconds by
    themselves; they must be gone at once."""
    _, cache = reference
    script = tmp_path / "hold_workers.py"
    script.write_text(
        "import sys, time\n"
        "from energon_platform.config import load_config\n"
        "from energon_platform.loader.train_loader import TrainLoader\n"
        f"cfg = load_config({str(balanced_config)!r}, overrides={{'loader.length_cache': {str(cache)!r}}})\n"
        "loader = TrainLoader(cfg, num_workers=2)\n"
        "next(loader)\n"
        "print(' '.join(str(p) for p in loader.executor.pids()), flush=True)\n"
        "time.sleep(120)\n"
    )
    with subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True
    ) as holder:
        workers = [psutil.Process(int(pid)) for pid in holder.stdout.readline().split()]
        assert len(workers) == 2
        holder.kill()
        holder.wait()
    _assert_gone_at_once(workers, "loader workers")


def test_length_index_build_workers_die_with_a_killed_parent(tmp_path):
    """Pool workers busy on a slow chunk (object storage, say) would finish it before noticing a
    dead parent; they must be gone at once."""
    script = tmp_path / "slow_build.py"
    script.write_text(
        "import sys, time, types\n"
        "from energon_platform.loader.balance import length_parts as parts\n"
        "parts.light_sample = lambda source, i: types.SimpleNamespace(__key__=str(i))\n"
        "class Slow:\n"
        "    facts_width = 1\n"
        "    def sample_facts(self, sample):\n"
        f"        open({str(tmp_path / 'inside')!r}, 'a').close()\n"
        "        time.sleep(120)\n"
        "        return [1]\n"
        "spec = parts.IndexSpec('slow', 'train', 'null', 'digest', None)\n"
        "parts.opened(spec, object(), Slow())\n"
        "jobs = [parts.ShardJob(k, f'shard-{k}.tar', 10 * k, 10, '1-1') for k in range(3)]\n"
        f"parts.run_jobs(jobs, parts.Path({str(tmp_path)!r}), spec, lambda job, stats: None,\n"
        "               workers=2)\n"
    )
    with subprocess.Popen([sys.executable, str(script)]) as holder:
        deadline = time.time() + 120
        while (
            (len(workers := _children(holder.pid)) < 2 or not (tmp_path / "inside").exists())
            and holder.poll() is None
            and time.time() < deadline
        ):
            time.sleep(0.01)
        assert len(workers) == 2, "the build's pool did not start"
        assert (tmp_path / "inside").exists(), "no worker reached the slow encoder"
        time.sleep(0.2)  # both workers are inside their first chunk
        holder.kill()
        holder.wait()
    _assert_gone_at_once(workers, "length index workers")


def _assert_gone_at_once(workers: list, what: str) -> None:
    """Every process of ``workers`` is gone within a second of its parent's SIGKILL (killed if not)."""
    deadline = time.time() + 1.0
    while (alive := [p for p in workers if _lives(p)]) and time.time() < deadline:
        time.sleep(0.02)
    for p in alive:
        p.kill()
    assert not alive, f"{what} outlived their killed parent: {[p.pid for p in alive]}"
