#!/usr/bin/env python
"""Restore speed: time to the first batch after a resume vs a fresh start, ours vs Energon's.

Why it matters: Energon's savable loader replays up to ``checkpoint_every_sec`` (60 s
by default) of worker work on restore, so its restore time grows with the position. energon_platform's
``TrainLoader`` state is one integer position and restore needs no replay; the target is
``restore_s / fresh_s <= 1.2`` at every position.

Method
------
Data. Unless ``--dataset DIR`` names an existing converted image-caption dataset, a corpus of
``--samples`` (default 24,576) 64x64 RGB PNG files with ``.txt`` captions is generated (a few dozen
distinct noisy base images written under different keys, each with its own caption, so generation
takes seconds) and converted with our converter (``converters.convert.run_conversion("folder", ...)``,
512 samples per shard). 24,576 samples hold 3,072 batches of 8, so the default positions (up to
3,000 batches, plus the one batch read after the save) stay inside the first epoch of our loader;
smaller datasets simply continue into the next epoch, which both loaders do.

Loaders (same dataset, same task encoder ``configs/encoders/image_text_small.yaml`` built with
``task_encoders.registry.get_encoder(path, seed=SEED)``, batch 8, ``--workers`` workers):
  ours              ``energon_platform.loader.TrainLoader`` (windowed shuffle of ``--shuffle-buffer``);
                    state = ``state_dict()`` as JSON, restore = ``load_state_dict()``.
  energon_default   ``get_savable_loader(get_train_dataset(path, batch_size=8, shuffle_buffer_size=100,
                    max_samples_per_sequence=100, ...))`` with its defaults (``checkpoint_every_sec=60``);
                    state = ``save_state_rank()`` written with ``torch.save``, restore =
                    ``torch.load(weights_only=False)`` + ``restore_state_rank()``.
  energon_frequent  the same with ``checkpoint_every_sec=0, checkpoint_every_min_n_samples=8,
                    n_checkpoints=16`` (the setting of ENERGON-NOTES that bounds the replay).

Per loader, one *save* child process iterates ``max(positions) + 1`` batches; after batch ``P`` (for
each ``P`` in ``--positions``) it writes the state to a file and records the keys and a digest of
the tensors of the next batch (``P + 1``), which is what a resumed run must produce first.

Timing. Every measurement is its own fresh Python process (a real resume starts a new process;
ENERGON-NOTES found in-process restores misleading). The child imports everything first (torch,
Energon, energon_platform, task_encoders: the same set for every loader, not timed), then starts
the clock right before building the task encoder and the loader, and stops it when the first batch
arrives:
  fresh_s     build encoder + loader, ``next()``;
  restore_s   build encoder + loader, read the state file, restore it, ``next()``.
For each loader and position, fresh and restore processes alternate ``--repeats`` times (default 5,
the pair's order flipping every repeat); ``restore_s``, ``fresh_s`` and ``ratio = restore_s / fresh_s``
use the **minimum** of the repeats by default (``--statistic median`` for the median). Other processes
on a shared machine only ever add time, so the minimum is the least disturbed estimate of what the
loader itself costs; ``*_median`` and ``*_min`` fields, the raw runs, and ``ratio_pooled`` (against
the fresh runs of that loader at all positions, a steadier baseline) are in the JSON too.
``restored_batch_matches`` is true when the first restored batch has exactly the keys of batch
``P + 1`` of the saving run in every repeat; ``restored_tensors_match`` compares the digest of all
its tensors too. For Energon the JSON also has ``replay_batches_per_worker``: the ``offset`` of each
worker's restored internal checkpoint, i.e. the batches it recomputes and discards.

Throughput. A fresh process per loader setting reads ``--throughput-batches`` (default 200) batches
after the first one and reports samples/s over those (median of ``--throughput-repeats``); the
first-batch time is excluded, so this is the steady-state cost of the setting (e.g. Energon's
internal checkpoint after every batch).

Output: a table on stdout and, with ``--json PATH``, every figure as JSON. No figure is stored in
this file; all are measured at run time. The machine is shared, so load average is recorded.

Examples::

    python -m scripts.bench.restore --json out/bench_restore.json
    python -m scripts.bench.restore --samples 600 --positions 3,20 --repeats 1 --throughput-batches 0
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.common import REPO as ROOT
from scripts.bench.common import check_json_out, load_average, write_json

DEFAULT_ENCODER = ROOT / "configs" / "encoders" / "image_text_small.yaml"
SETTINGS = ("ours", "energon_default", "energon_frequent")
DESCRIPTIONS = {
    "ours": "energon_platform TrainLoader (state: one position, JSON)",
    "energon_default": "Energon get_savable_loader defaults (checkpoint_every_sec=60)",
    "energon_frequent": "Energon checkpoint_every_sec=0, checkpoint_every_min_n_samples=8, n_checkpoints=16",
}
ENERGON_FREQUENT = {
    "checkpoint_every_sec": 0,
    "checkpoint_every_min_n_samples": 8,
    "n_checkpoints": 16,
}
TARGET_RATIO = 1.2
_WORDS = (
    "a small red cat sits on the green mat near two dogs while blue birds fly over an old "
    "wooden house by the river at night under bright stars and grey clouds"
).split()


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def make_image_folder(root: Path, n: int, side: int = 64, n_base: int = 32) -> None:
    """``n`` PNG files ``{i:06d}.png`` with ``{i:06d}.txt`` captions. ``n_base`` distinct images
    (smoothed noise, so PNG decode does real work) are encoded once and written under many keys."""
    import numpy as np
    from PIL import Image

    marker = root / ".complete"
    if marker.is_file() and marker.read_text().strip() == f"{n} {side} {n_base}":
        return
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    bases = []
    for _ in range(n_base):
        small = rng.integers(0, 256, (side // 4, side // 4, 3), dtype=np.uint8)
        noise = rng.integers(-24, 25, (side, side, 3))
        pixels = np.clip(np.kron(small, np.ones((4, 4, 1), dtype=np.int64)) + noise, 0, 255).astype(
            np.uint8
        )
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        bases.append(buf.getvalue())
    for i in range(n):
        (root / f"{i:06d}.png").write_bytes(bases[i % n_base])
        words = [_WORDS[(i * 7 + 3 * j) % len(_WORDS)] for j in range(3 + i % 15)]
        (root / f"{i:06d}.txt").write_text(f"image {i}: " + " ".join(words) + "\n")
    marker.write_text(f"{n} {side} {n_base}")


def build_dataset(workdir: Path, n: int, workers: int) -> tuple[Path, dict]:
    """Generate the corpus and convert it (reuses a finished conversion in ``workdir``)."""
    from converters.convert import ConvertOptions, run_conversion

    folder, out = workdir / "corpus", workdir / "dataset"
    t0 = time.perf_counter()
    make_image_folder(folder, n)
    t1 = time.perf_counter()
    outcome = run_conversion(
        "folder",
        {"root": str(folder)},
        ConvertOptions(out=str(out), samples_per_shard=512, workers=workers, progress=False),
    )
    t2 = time.perf_counter()
    if not outcome.ok:
        raise SystemExit(
            f"conversion of the generated corpus failed: {outcome.report.get('totals')}"
        )
    return out, {
        "generated_samples": n,
        "generate_s": round(t1 - t0, 3),
        "convert_s": round(t2 - t1, 3),
        "conversion_reused": outcome.already_done,
        "written": outcome.report["totals"]["written"],
    }


def dataset_facts(path: Path) -> dict:
    from energon_platform.loader.source import SampleSource

    src = SampleSource(str(path), "train")
    return {"path": str(path), "num_samples": len(src), "num_shards": len(src.shard_counts)}


# --------------------------------------------------------------------------------------------
# Child processes (one measurement each)
# --------------------------------------------------------------------------------------------


def _import_all() -> None:
    """Everything any loader needs, imported before the clock starts (same set for every loader)."""
    import torch  # noqa: F401
    from megatron.energon import get_savable_loader, get_train_dataset  # noqa: F401
    from transformers import (
        PreTrainedTokenizerFast,  # noqa: F401  (lazy module: this attribute access imports it)
    )

    import energon_platform.loader.train_loader  # noqa: F401
    from energon_platform.config import load_config  # noqa: F401
    from task_encoders.registry import available

    available()  # imports the built-in encoder modules (torchvision, tokenizers); building one is timed


class Loader:
    """One of the compared loaders behind a common face: ``next()``, ``save(path)``, ``restore(path)``."""

    def __init__(self, setting: str, spec: dict):
        self.setting = setting
        if setting == "ours":
            from energon_platform.config import load_config
            from energon_platform.loader.train_loader import TrainLoader

            cfg = load_config(
                {
                    "data": {"path": spec["dataset"], "train_split": "train", "val_split": None},
                    "encoder": spec["encoder"],
                    "loader": {
                        "global_batch_size": spec["batch_size"],
                        "num_workers": spec["workers"],
                        "seed": spec["seed"],
                        "shuffle_buffer": spec["shuffle_buffer"],
                    },
                }
            )
            self.loader = TrainLoader(cfg)
            self._it = self.loader
        else:
            from megatron.energon import get_savable_loader, get_train_dataset

            from task_encoders.registry import get_encoder

            encoder = get_encoder(spec["encoder"], seed=spec["seed"])
            wc = encoder.worker_config(rank=0, world_size=1, num_workers=spec["workers"])
            ds = get_train_dataset(
                spec["dataset"],
                batch_size=spec["batch_size"],
                shuffle_buffer_size=spec["shuffle_buffer"],
                max_samples_per_sequence=spec["max_samples_per_sequence"],
                worker_config=wc,
                task_encoder=encoder,
            )
            kwargs = ENERGON_FREQUENT if setting == "energon_frequent" else {}
            self.loader = get_savable_loader(ds, **kwargs)
            self._it = None
        self.replay = None

    def next(self):
        if self._it is None:
            self._it = iter(self.loader)
        return next(self._it)

    def save(self, path: Path) -> int:
        if self.setting == "ours":
            data = json.dumps(self.loader.state_dict(), sort_keys=True).encode()
            path.write_bytes(data)
        else:
            import torch

            torch.save(self.loader.save_state_rank(), path)
        return path.stat().st_size

    def restore(self, path: Path) -> None:
        if self.setting == "ours":
            self.loader.load_state_dict(json.loads(path.read_bytes()))
        else:
            import torch

            state = torch.load(path, weights_only=False)  # Energon's state holds custom classes
            self.replay = [int(getattr(ws, "offset", -1)) for ws in state.worker_states]
            self.loader.restore_state_rank(state)

    def close(self) -> None:
        if self.setting == "ours":
            self.loader.close()
        else:
            self._it = None
            shutdown = getattr(self.loader, "shutdown", None)
            if callable(shutdown):
                shutdown()
        self.loader = None


def batch_keys(batch) -> list[str]:
    keys = getattr(batch, "keys", None)
    if keys is None or callable(keys):
        keys = batch.__key__
    return [str(k) for k in keys]


def batch_digest(batch) -> str:
    """sha256 over every tensor field of the batch (its name, dtype, shape and bytes; by name) with
    `energon_platform.training.digests`, cut to 24 hex digits."""
    from energon_platform.training.digests import batch_digest as digest
    from energon_platform.training.digests import tensors_of

    return digest(tensors_of(batch))[:24]


def child_main(spec: dict) -> dict:
    """Run one measurement (``spec["mode"]``) and return its result."""
    t_proc = time.perf_counter()
    _import_all()
    import_s = time.perf_counter() - t_proc
    mode, setting = spec["mode"], spec["setting"]
    result: dict = {
        "mode": mode,
        "setting": setting,
        "import_s": round(import_s, 4),
        "pid": os.getpid(),
    }

    if mode in ("fresh", "restore"):
        t0 = time.perf_counter()
        loader = Loader(setting, spec)
        t_built = time.perf_counter()
        if mode == "restore":
            loader.restore(Path(spec["state"]))
        t_restored = time.perf_counter()
        batch = loader.next()
        t1 = time.perf_counter()
        result.update(
            seconds=t1 - t0,
            build_s=t_built - t0,
            restore_call_s=t_restored - t_built,
            first_next_s=t1 - t_restored,
            keys=batch_keys(batch),
            digest=batch_digest(batch),
            replay_batches_per_worker=loader.replay,
        )
        loader.close()
    elif mode == "save":
        positions = sorted(set(spec["positions"]))
        out_dir = Path(spec["state_dir"])
        loader = Loader(setting, spec)
        t0 = time.perf_counter()
        saved: dict = {}
        pending = None  # position whose next batch is the reference
        for i in range(1, positions[-1] + 2):
            batch = loader.next()
            if pending is not None:
                saved[pending].update(ref_keys=batch_keys(batch), ref_digest=batch_digest(batch))
                pending = None
            if i in positions:
                path = out_dir / f"{setting}-P{i}.state"
                size = loader.save(path)
                saved[i] = {
                    "state": str(path),
                    "state_bytes": size,
                    "elapsed_at_save_s": round(time.perf_counter() - t0, 3),
                }
                pending = i
        result.update(seconds=time.perf_counter() - t0, saved={str(k): v for k, v in saved.items()})
        loader.close()
    elif mode == "throughput":
        t0 = time.perf_counter()
        loader = Loader(setting, spec)
        loader.next()
        t1 = time.perf_counter()
        n = spec["throughput_batches"]
        for _ in range(n):
            loader.next()
        t2 = time.perf_counter()
        result.update(
            first_batch_s=t1 - t0,
            steady_s=t2 - t1,
            batches=n,
            samples_per_s=n * spec["batch_size"] / (t2 - t1),
        )
        loader.close()
    else:
        raise ValueError(f"unknown child mode {mode!r}")
    return result


def failed(result: dict, errors: list) -> bool:
    """True when a child run failed; its error is recorded and printed with the log's tail."""
    if "error" not in result:
        return False
    errors.append(result["error"])
    print(f"  ERROR: {result['error']}\n{result['log_tail']}", flush=True)
    return True


def run_child(spec: dict, log_dir: Path, name: str, timeout: float) -> dict:
    """Run ``child_main(spec)`` in a new Python process; its output goes to ``log_dir/name.log``."""
    out = log_dir / f"{name}.json"
    log = log_dir / f"{name}.log"
    spec = {**spec, "result": str(out)}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
    }
    t0 = time.perf_counter()
    try:
        with open(log, "w") as f:
            proc = subprocess.run(
                [sys.executable, "-m", "scripts.bench.restore", "--child", json.dumps(spec)],
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=str(ROOT),
                env=env,
                timeout=timeout,
            )
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.perf_counter() - t0
    if rc == 0 and out.is_file():
        result = json.loads(out.read_text())
        result["process_wall_s"] = round(wall, 3)
        return result
    tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
    return {
        "error": f"child {name} failed (exit {rc}); log {log}",
        "log_tail": tail,
        "process_wall_s": round(wall, 3),
    }


# --------------------------------------------------------------------------------------------
# Parent: orchestration, summary, table
# --------------------------------------------------------------------------------------------


def _stat(values: list[float]) -> dict:
    return (
        {"median": statistics.median(values), "min": min(values)}
        if values
        else {"median": None, "min": None}
    )


def _r(x, nd=4):
    return None if x is None else round(x, nd)


def summarize_cell(
    save_info: dict | None,
    fresh: list[dict],
    restore: list[dict],
    setting: str,
    position: int,
    batch_size: int,
    num_samples: int,
    pooled_fresh: list[float],
    statistic: str,
) -> dict:
    errors = [r["error"] for r in fresh + restore if "error" in r]
    if save_info is not None and "error" in save_info:
        errors.append(save_info["error"])
    f_ok = [r["seconds"] for r in fresh if "error" not in r]
    r_ok = [r for r in restore if "error" not in r]
    fs, rs = _stat(f_ok), _stat([r["seconds"] for r in r_ok])
    ref_keys = (save_info or {}).get("ref_keys")
    ref_digest = (save_info or {}).get("ref_digest")
    keys_match = [r["keys"] == ref_keys for r in r_ok] if ref_keys is not None else []
    tens_match = [r["digest"] == ref_digest for r in r_ok] if ref_digest is not None else []
    pf = _stat(pooled_fresh)

    def ratio(a, b):
        return _r(a / b, 3) if a and b else None

    cell = {
        "restore_s": _r(rs[statistic]),
        "fresh_s": _r(fs[statistic]),
        "ratio": ratio(rs[statistic], fs[statistic]),
        "statistic": f"{statistic} of {len(r_ok)} restore and {len(f_ok)} fresh processes",
        "restore_s_median": _r(rs["median"]),
        "fresh_s_median": _r(fs["median"]),
        "ratio_median": ratio(rs["median"], fs["median"]),
        "restore_s_min": _r(rs["min"]),
        "fresh_s_min": _r(fs["min"]),
        "ratio_min": ratio(rs["min"], fs["min"]),
        "fresh_s_pooled": _r(pf[statistic]),
        "ratio_pooled": ratio(rs[statistic], pf[statistic]),
        "pooled_note": f"fresh_s_pooled: {statistic} of this loader's {len(pooled_fresh)} fresh runs at all positions",
        "state_bytes": (save_info or {}).get("state_bytes"),
        "restored_batch_matches": bool(keys_match) and all(keys_match),
        "restored_tensors_match": bool(tens_match) and all(tens_match),
        "restore_runs_s": [_r(r["seconds"]) for r in r_ok],
        "fresh_runs_s": [_r(x) for x in f_ok],
        "restore_breakdown": [
            {
                "build_s": _r(r["build_s"]),
                "restore_call_s": _r(r["restore_call_s"]),
                "first_next_s": _r(r["first_next_s"]),
            }
            for r in r_ok
        ],
        "saved_after_s_of_iteration": (save_info or {}).get("elapsed_at_save_s"),
        "resumes_in_second_epoch": setting == "ours" and (position + 1) * batch_size > num_samples,
    }
    if setting != "ours":
        replays = [r.get("replay_batches_per_worker") for r in r_ok]
        cell["replay_batches_per_worker"] = replays[0] if replays else None
    if ref_keys is not None and r_ok and not cell["restored_batch_matches"]:
        cell["mismatch_example"] = {"expected_keys": ref_keys, "restored_keys": r_ok[0]["keys"]}
    if errors:
        cell["errors"] = errors
    return cell


def fmt_table(report: dict) -> str:
    settings = report["settings_run"]
    lines = []
    hdr = (
        f"{'position':>8}  {'loader':<17} {'restore_s':>9} {'fresh_s':>8} {'ratio':>6} "
        f"{'r.median':>8} {'r.min':>6} {'pooled':>6} {'state B':>8}  {'match':<5} {'tensors':<7} "
        "replay/worker"
    )
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for p, row in report["positions"].items():
        for s in settings:
            c = row.get(s)
            if c is None:
                continue

            def f(x, spec):
                return format(x, spec) if isinstance(x, (int, float)) else "-"

            replay = c.get("replay_batches_per_worker")
            lines.append(
                f"{p:>8}  {s:<17} {f(c['restore_s'], '9.3f')} {f(c['fresh_s'], '8.3f')} {f(c['ratio'], '6.2f')} "
                f"{f(c['ratio_median'], '8.2f')} {f(c['ratio_min'], '6.2f')} "
                f"{f(c['ratio_pooled'], '6.2f')} {f(c['state_bytes'], '8d')}  "
                f"{str(c['restored_batch_matches']):<5} "
                f"{str(c['restored_tensors_match']):<7} {replay if replay is not None else '-'}"
            )
    tp = report.get("throughput") or {}
    if tp:
        lines.append("")
        lines.append(
            f"throughput ({report['config']['throughput_batches']} batches of {report['config']['batch_size']} "
            f"after the first, {report['config']['workers']} workers; "
            f"median of {report['config']['throughput_repeats']})"
        )
        for s in settings:
            t = tp.get(s)
            if t is None:
                continue
            rel = t.get("relative_to_ours")
            lines.append(
                f"  {s:<17} {t['samples_per_s'] if t['samples_per_s'] is not None else '-':>10} samples/s"
                f"   {f'{rel:.2f}x ours' if rel else ''}   first batch {t.get('first_batch_s')} s"
            )
    tgt = report["target"]
    lines.append("")
    st = report["config"]["statistic"]
    lines.append(
        f"restore_s, fresh_s, ratio: {st} over {report['config']['repeats']} fresh processes each; ratio = "
        f"restore_s / fresh_s (same position); r.median / r.min: the ratio of medians / of minima; pooled: "
        f"restore_s / {st} fresh_s of that loader over all positions"
    )
    lines.append(
        f"target: ours ratio <= {tgt['ratio_max']} at every position -> max ours ratio {tgt['ours_max_ratio']} "
        f"({'MET' if tgt['met'] else 'NOT MET'}); ours restored batches match: {tgt['ours_all_match']}"
    )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.restore", description=__doc__, formatter_class=Formatter
    )
    p.add_argument("--json", metavar="PATH", help="write every figure as JSON here")
    p.add_argument(
        "--dataset",
        metavar="DIR",
        help="an existing converted image-caption dataset (split 'train'); "
        "default: generate a corpus and convert it",
    )
    p.add_argument(
        "--samples", type=int, default=24576, help="samples to generate when --dataset is not given"
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="keep the generated corpus/dataset, states and child logs here "
        "(a finished conversion there is reused); default: a temporary folder, removed at the end",
    )
    p.add_argument(
        "--positions",
        default="10,100,1000,3000",
        help="comma-separated batch counts after which to save",
    )
    p.add_argument(
        "--loaders",
        default=",".join(SETTINGS),
        help=f"comma-separated subset of {','.join(SETTINGS)}",
    )
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (all loaders)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--shuffle-buffer",
        type=int,
        default=100,
        help="Energon shuffle_buffer_size; ours: windowed shuffle of the same size",
    )
    p.add_argument(
        "--max-samples-per-sequence", type=int, default=100, help="Energon max_samples_per_sequence"
    )
    p.add_argument("--encoder", default=str(DEFAULT_ENCODER), help="task encoder config (YAML)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--repeats", type=int, default=5, help="fresh/restore process pairs per loader and position"
    )
    p.add_argument(
        "--statistic",
        choices=("min", "median"),
        default="min",
        help="which of the repeats restore_s, fresh_s and ratio report (both are in the JSON); the noise "
        "of a shared machine only adds time, so min is the least disturbed estimate",
    )
    p.add_argument(
        "--throughput-batches",
        type=int,
        default=200,
        help="batches timed after the first; 0 skips throughput",
    )
    p.add_argument("--throughput-repeats", type=int, default=2)
    p.add_argument("--convert-workers", type=int, default=2, help="converter worker processes")
    p.add_argument(
        "--child-timeout", type=float, default=1200, help="seconds before a child process is killed"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 2 when ours misses the target or a restored batch of ours mismatches",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.positions = sorted({int(x) for x in args.positions.split(",") if x.strip()})
    args.loaders = [s.strip() for s in args.loaders.split(",") if s.strip()]
    bad = [s for s in args.loaders if s not in SETTINGS]
    if bad:
        p.error(f"unknown loader(s) {bad}; choose from {SETTINGS}")
    if not args.positions or min(args.positions) < 1:
        p.error("--positions must be positive integers")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return args


def _versions() -> dict:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "megatron-energon"):
        try:
            out[pkg] = version(pkg)
        except Exception:
            out[pkg] = None
    try:
        out["git_commit"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
            or None
        )
    except OSError:
        out["git_commit"] = None
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    if args.child:
        spec = json.loads(args.child)
        result = child_main(spec)
        Path(spec["result"]).write_text(json.dumps(result))
        return 0

    t_start = time.perf_counter()
    tmp = None
    if args.workdir:
        work = Path(args.workdir).resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="bench_restore-")
        work = Path(tmp)
    try:
        return _run(args, work, t_start)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(args, work: Path, t_start: float) -> int:
    load_before = load_average()
    build = None
    if args.dataset:
        dataset = Path(args.dataset).resolve()
    else:
        print(f"generating {args.samples} images and converting them in {work} ...", flush=True)
        dataset, build = build_dataset(work, args.samples, args.convert_workers)
        print(
            f"  generated in {build['generate_s']} s, converted in {build['convert_s']} s"
            f"{' (reused)' if build['conversion_reused'] else ''}",
            flush=True,
        )
    facts = dataset_facts(dataset)
    state_dir, log_dir = work / "states", work / "logs"
    for d in (state_dir, log_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)

    base = {
        "dataset": str(dataset),
        "encoder": str(Path(args.encoder).resolve()),
        "seed": args.seed,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "shuffle_buffer": args.shuffle_buffer,
        "max_samples_per_sequence": args.max_samples_per_sequence,
    }
    errors: list[str] = []

    # 1. save runs
    saves: dict[str, dict] = {}
    for s in args.loaders:
        print(
            f"[save] {s}: iterating {args.positions[-1] + 1} batches, saving after {args.positions} ...",
            flush=True,
        )
        r = run_child(
            {
                **base,
                "mode": "save",
                "setting": s,
                "positions": args.positions,
                "state_dir": str(state_dir),
            },
            log_dir,
            f"save-{s}",
            args.child_timeout,
        )
        if not failed(r, errors):
            print(f"  {r['seconds']:.1f} s", flush=True)
        saves[s] = r

    # 2. fresh / restore timings, interleaved (repeat-major, so slow drifts of the shared machine spread out)
    runs: dict[tuple, dict] = {}
    for rep in range(args.repeats):
        for p in args.positions:
            for s in args.loaders:
                info = (saves[s].get("saved") or {}).get(str(p))
                if info is None:
                    continue

                def fresh():
                    return run_child(
                        {**base, "mode": "fresh", "setting": s},
                        log_dir,
                        f"fresh-{s}-P{p}-r{rep}",
                        args.child_timeout,
                    )

                def restore():
                    return run_child(
                        {**base, "mode": "restore", "setting": s, "state": info["state"]},
                        log_dir,
                        f"restore-{s}-P{p}-r{rep}",
                        args.child_timeout,
                    )

                # alternate which of the pair goes first, so an order effect cannot favour either
                if rep % 2 == 0:
                    f = fresh()
                    r = restore()
                else:
                    r = restore()
                    f = fresh()
                runs.setdefault((s, p, "fresh"), {})[rep] = f
                runs.setdefault((s, p, "restore"), {})[rep] = r
                for x in (f, r):
                    failed(x, errors)
                fr = f.get("seconds")
                rr = r.get("seconds")
                ok = r.get("keys") == info.get("ref_keys")
                print(
                    f"[rep {rep + 1}/{args.repeats}] P={p:<5} {s:<17} fresh {fr if fr is None else round(fr, 3)} s  "
                    f"restore {rr if rr is None else round(rr, 3)} s  match={ok}"
                    + (f"  replay={r.get('replay_batches_per_worker')}" if s != "ours" else ""),
                    flush=True,
                )

    pooled = {
        s: [
            x["seconds"]
            for (s2, _, kind), reps in runs.items()
            if s2 == s and kind == "fresh"
            for x in reps.values()
            if "error" not in x
        ]
        for s in args.loaders
    }
    positions: dict[str, dict] = {}
    for p in args.positions:
        row = {}
        for s in args.loaders:
            info = (saves[s].get("saved") or {}).get(str(p))
            if "error" in saves[s]:
                info = {"error": saves[s]["error"]}
            fresh = list(runs.get((s, p, "fresh"), {}).values())
            restore = list(runs.get((s, p, "restore"), {}).values())
            row[s] = summarize_cell(
                info,
                fresh,
                restore,
                s,
                p,
                args.batch_size,
                facts["num_samples"],
                pooled[s],
                args.statistic,
            )
        positions[str(p)] = row

    # 3. throughput
    throughput: dict[str, dict] = {}
    if args.throughput_batches > 0:
        for rep in range(args.throughput_repeats):
            for s in args.loaders:
                r = run_child(
                    {
                        **base,
                        "mode": "throughput",
                        "setting": s,
                        "throughput_batches": args.throughput_batches,
                    },
                    log_dir,
                    f"throughput-{s}-r{rep}",
                    args.child_timeout,
                )
                if not failed(r, errors):
                    print(
                        f"[throughput {rep + 1}/{args.throughput_repeats}] {s:<17} {r['samples_per_s']:.1f} samples/s",
                        flush=True,
                    )
                throughput.setdefault(s, {"runs": []})["runs"].append(r)
        for t in throughput.values():
            ok = [r for r in t["runs"] if "error" not in r]
            sps = [r["samples_per_s"] for r in ok]
            t.update(
                samples_per_s=_r(statistics.median(sps), 1) if sps else None,
                samples_per_s_runs=[_r(x, 1) for x in sps],
                first_batch_s=_r(statistics.median([r["first_batch_s"] for r in ok]))
                if ok
                else None,
                statistic="median of repeats",
            )
            del t["runs"]
        ours_sps = (throughput.get("ours") or {}).get("samples_per_s")
        for t in throughput.values():
            t["relative_to_ours"] = (
                _r(t["samples_per_s"] / ours_sps, 3) if ours_sps and t["samples_per_s"] else None
            )

    ours_ratios = [row["ours"]["ratio"] for row in positions.values() if "ours" in row]
    ours_match = [
        row["ours"]["restored_batch_matches"] for row in positions.values() if "ours" in row
    ]
    target = {
        "ratio_max": TARGET_RATIO,
        "ours_max_ratio": max((r for r in ours_ratios if r is not None), default=None),
        "met": bool(ours_ratios) and all(r is not None and r <= TARGET_RATIO for r in ours_ratios),
        "ours_all_match": bool(ours_match) and all(ours_match),
    }
    report = {
        "description": "time from loader construction to the first batch in a fresh process: after restoring a "
        "state saved after P batches (restore_s) vs a fresh loader (fresh_s); ratio = restore_s / fresh_s",
        "settings_run": args.loaders,
        "settings": {s: DESCRIPTIONS[s] for s in args.loaders},
        "config": {
            "positions": args.positions,
            "workers": args.workers,
            "batch_size": args.batch_size,
            "shuffle_buffer": args.shuffle_buffer,
            "max_samples_per_sequence": args.max_samples_per_sequence,
            "encoder": base["encoder"],
            "seed": args.seed,
            "repeats": args.repeats,
            "statistic": args.statistic,
            "throughput_batches": args.throughput_batches,
            "throughput_repeats": args.throughput_repeats,
            "energon_frequent": ENERGON_FREQUENT,
        },
        "dataset": {**facts, "build": build},
        "save_runs": {s: {k: v for k, v in r.items() if k != "saved"} for s, r in saves.items()},
        "positions": positions,
        "throughput": throughput,
        "target": target,
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": load_average(),
            **_versions(),
        },
        "total_s": round(time.perf_counter() - t_start, 1),
        "errors": errors,
    }
    print()
    print(fmt_table(report))
    write_json(args.json, report)
    if errors:
        print(
            f"\n{len(errors)} child process(es) failed; see the errors in the output above",
            file=sys.stderr,
        )
        return 1
    if args.check and not (target["met"] and target["ours_all_match"]):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
