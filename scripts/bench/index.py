#!/usr/bin/env python3
"""The length index at scale: building it ahead of training (``energon-platform index``), its
memory as the dataset grows, and opening it at start-up.

For each size N (``--sizes``, default 10^5 and 10^6) it writes a synthetic text dataset (tar shards
of ``--per-shard`` documents of lognormal length, one ``text.json`` each) and makes it
Energon-ready with Energon's own prepare (timed: the alternative's rate on the same data). Then,
each in a fresh process:

* **build**: the index under ``configs/encoders/text_small.yaml`` with 1 and 2 local processes and
  with 1 and 2 local Ray workers (samples per second, the scaling from 1 to 2, the peak resident
  memory of the building process and of its largest worker);
* **open**: a prebuilt index mapped and 10,000 random samples' facts and keys read (seconds, and
  the resident memory it added);
* **start-up**: a loader (``TrainLoader``, no workers) to its first global batch on the dataset,
  with ``balance: tokens`` (prebuilt index, ``loader.length_index: require``) and without balance;
* **object storage** (``--msc``): the dataset uploaded to a SeaweedFS server on loopback
  (``scripts/s3_server.py``) and the index published beside it; a fresh "node" (an empty cache
  folder) opens it (seconds, index bytes fetched at open and after the 10,000 reads, against the
  index's size), and the same two start-ups from ``msc://``.

It ends with what the figures mean at 10^9 samples: hours per process, nodes of ``--node-cores``
processes for a build of one hour, and bytes stored.

    .venv/bin/python -m scripts.bench.index [--sizes 100000 1000000] [--msc] [--json bench-index.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

from scripts.bench.common import REPO, check_json_out, finish_record, run_record, write_json

ENCODER = "configs/encoders/text_small.yaml"
WORDS = ("the", "model", "reads", "a", "long", "document", "about", "cats", "and", "data")
OPEN_READS = 10_000


# --- the data -------------------------------------------------------------------------------------


def synthetic_text(folder: Path, n: int, per_shard: int, seed: int = 0) -> dict:
    """``n`` documents in tar shards under ``folder/train``, made Energon-ready by Energon's own
    prepare; returns the seconds prepare took."""
    from converters.energon_meta import prepare

    rng = random.Random(seed)
    (folder / "train").mkdir(parents=True, exist_ok=True)
    shards = []
    for s in range(math.ceil(n / per_shard)):
        name = f"train/shard-{s:06d}.tar"
        with tarfile.open(folder / name, "w") as tar:
            for i in range(s * per_shard, min(n, (s + 1) * per_shard)):
                words = max(1, int(rng.lognormvariate(3.0, 0.8)))
                body = json.dumps({"text": " ".join(rng.choices(WORDS, k=words))}).encode()
                info = tarfile.TarInfo(f"doc-{i:010d}.text.json")
                info.size = len(body)
                tar.addfile(info, BytesIO(body))
        shards.append(name)
    began = time.perf_counter()
    prepare(str(folder), shards, "text", [], f"bench-index-{n}-{seed}")
    return {"prepare_s": time.perf_counter() - began}


def run_config(folder: Path, data, balance: str, require: bool, name: str = "") -> Path:
    import yaml

    loader = {"global_batch_size": 64, "num_workers": 0, "balance": balance}
    if require:
        loader["length_index"] = "require"
        loader["length_cache"] = str(folder / f"cache-{name or balance}")
    path = folder / f"run-{name}{balance}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "data": {"path": str(data), "val_split": None},
                "encoder": str(REPO / ENCODER),
                "loader": loader,
            }
        )
    )
    return path


# --- the measurements, each in its own process -------------------------------------------------


def child(kind: str, **args) -> dict:
    """Run ``--child KIND`` of this script in a fresh process; its JSON result."""
    argv = [
        sys.executable,
        "-m",
        "scripts.bench.index",
        "--child",
        kind,
        "--args",
        json.dumps(args),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"{kind} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def do_build(data: str, place: str, workers: int, ray: bool) -> dict:
    from energon_platform.loader.balance.length_store import build
    from energon_platform.loader.fingerprint import encoder_digest
    from energon_platform.loader.source import SampleSource
    from task_encoders.registry import get_encoder

    source, encoder = SampleSource(data), get_encoder(str(REPO / ENCODER))
    if ray:  # started before the clock: a cluster is up before a job indexes on it
        import ray as ray_module

        ray_module.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    before = rss_mib()
    began = time.perf_counter()
    stats = build(
        source, encoder, encoder_digest(encoder), Path(place), workers, False, use_ray=ray
    )
    seconds = time.perf_counter() - began
    if ray:
        import ray as ray_module

        if ray_module.is_initialized():
            ray_module.shutdown()
    return {
        "samples": stats["samples"],
        "seconds": seconds,
        "samples_per_s": stats["samples"] / seconds,
        "rss_before_mib": before,
        "peak_mib": peak_mib(resource.RUSAGE_SELF),
        "worker_peak_mib": peak_mib(resource.RUSAGE_CHILDREN),
        "folder": stats["folder"],
    }


def random_reads(index) -> float:
    """Microseconds per read of `OPEN_READS` random samples' facts and keys of ``index``."""
    import numpy as np

    rng = np.random.default_rng(0)
    began = time.perf_counter()
    for i in rng.integers(0, len(index), OPEN_READS):
        index.facts(int(i))
        index.key(int(i))
    return (time.perf_counter() - began) / OPEN_READS * 1e6


def do_open(folder: str) -> dict:

    from energon_platform.loader.balance.lengths import LengthIndex

    before = rss_mib()
    began = time.perf_counter()
    index = LengthIndex(Path(folder))
    opened_s = time.perf_counter() - began
    read_us = random_reads(index)
    return {
        "samples": len(index),
        "open_s": opened_s,
        "read_us": read_us,
        "rss_added_mib": rss_mib() - before,
        "bytes": index.nbytes,
    }


def do_open_msc(data: str, digest: str, cache: str) -> dict:
    """A node with an empty cache opens the index published beside ``data`` on object storage."""

    from energon_platform.loader.balance import length_store
    from energon_platform.loader.balance.lengths import LengthIndex
    from energon_platform.loader.source import SampleSource

    source = SampleSource(data)
    jobs = length_store.shard_jobs(source)
    began = time.perf_counter()
    folder = length_store.fetch_published(source, digest, jobs, cache)
    index = LengthIndex(folder)
    opened_s = time.perf_counter() - began
    meta = (folder / "meta.json").stat().st_size
    at_open = meta + sum(c.fetched for c in index.ranged.values())
    read_us = random_reads(index)
    return {
        "open_s": opened_s,
        "read_us": read_us,
        "fetched_at_open": at_open,
        "fetched_after_reads": meta + sum(c.fetched for c in index.ranged.values()),
        "bytes": index.nbytes,
    }


def do_startup(config: str) -> dict:
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    began = time.perf_counter()
    loader = TrainLoader(load_config(config), num_workers=0)
    next(loader)
    return {"seconds": time.perf_counter() - began, "peak_mib": peak_mib(resource.RUSAGE_SELF)}


CHILDREN = {
    "build": do_build,
    "open": do_open,
    "open_msc": do_open_msc,
    "startup": do_startup,
}


# --- one size ---------------------------------------------------------------------------------


def measure_msc(base: Path, data: Path, folder: Path, n: int, server) -> dict:
    """The dataset and its index (``folder``, built locally) on object storage: opened by a fresh
    node, and the two start-ups from ``msc://``."""
    from converters.remote import upload_dataset
    from energon_platform.loader.balance.length_store import WITH_DATA
    from energon_platform.loader.source import SampleSource

    url = server.url(f"text-{n}")
    began = time.perf_counter()
    upload_dataset(data, url)
    uploaded_s = time.perf_counter() - began
    published = f"{url}/{WITH_DATA.as_posix()}/{folder.name}"
    from converters.remote import upload_file

    # the local build's files, its stamps those of the uploaded shards (ETags): the same index
    from energon_platform.loader.balance.length_parts import shard_jobs

    meta = json.loads((folder / "meta.json").read_text())
    meta["stamps"] = [job.stamp for job in shard_jobs(SampleSource(url))]
    (base / f"meta-{n}.json").write_text(json.dumps(meta))
    for name in ("facts.i32", "keys.bin", "keys.off"):
        upload_file(str(folder / name), f"{published}/{name}")
    upload_file(str(base / f"meta-{n}.json"), f"{published}/meta.json")
    before = server.counters()
    opened = child("open_msc", data=url, digest=folder.name, cache=str(base / f"node-{n}"))
    opened["requests"] = (server.counters() - before).requests
    opened["shards"] = len(SampleSource(url).shard_names)
    balanced = child(
        "startup", config=str(run_config(base, url, "tokens", require=True, name=f"msc-{n}"))
    )
    plain = child("startup", config=str(run_config(base, url, "none", False, name=f"msc-{n}")))
    return {
        "upload_s": uploaded_s,
        "open": opened,
        "fetched_at_open_over_index": opened["fetched_at_open"] / opened["bytes"],
        "startup": {
            "balanced_s": balanced["seconds"],
            "unbalanced_s": plain["seconds"],
            "balanced_over_unbalanced": balanced["seconds"] / plain["seconds"],
        },
    }


def measure(base: Path, n: int, per_shard: int, server=None) -> dict:
    data = base / f"text-{n}"
    print(f"== N = {n:,}: writing and preparing the dataset", flush=True)
    prepared = synthetic_text(data, n, per_shard)
    row: dict = {"n": n, "shards": math.ceil(n / per_shard), **prepared}
    row["prepare_samples_per_s"] = n / prepared["prepare_s"]
    builds = {}
    for ray in (False, True):
        for workers in (1, 2):
            name = f"{'ray' if ray else 'local'}_{workers}"
            place = base / f"place-{n}-{name}"
            builds[name] = child(
                "build", data=str(data), place=str(place), workers=workers, ray=ray
            )
            print(f"   build {name}: {builds[name]['samples_per_s']:,.0f} samples/s", flush=True)
    row["build"] = builds
    row["local_scaling_1_to_2"] = (
        builds["local_2"]["samples_per_s"] / builds["local_1"]["samples_per_s"]
    )
    row["ray_scaling_1_to_2"] = builds["ray_2"]["samples_per_s"] / builds["ray_1"]["samples_per_s"]
    row["open"] = child("open", folder=builds["local_1"]["folder"])
    if server is not None:
        row["msc"] = measure_msc(base, data, Path(builds["local_1"]["folder"]), n, server)
        print(
            f"   msc://: open {row['msc']['open']['open_s']:.3f} s, "
            f"{row['msc']['open']['fetched_at_open']:,} of {row['msc']['open']['bytes']:,} "
            f"index bytes fetched; start-up balanced / unbalanced "
            f"{row['msc']['startup']['balanced_over_unbalanced']:.2f}",
            flush=True,
        )
    # the loaders find the index with the data: put one there (the local build's)
    store = data / ".energon-platform" / "lengths"
    store.mkdir(parents=True, exist_ok=True)
    folder = Path(builds["local_1"]["folder"])
    os.symlink(folder, store / folder.name)
    balanced = child("startup", config=str(run_config(base, data, "tokens", require=True)))
    plain = child("startup", config=str(run_config(base, data, "none", require=False)))
    row["startup"] = {
        "balanced_s": balanced["seconds"],
        "unbalanced_s": plain["seconds"],
        "balanced_over_unbalanced": balanced["seconds"] / plain["seconds"],
    }
    row["bytes_per_sample"] = row["open"]["bytes"] / n
    return row


def at_1e9(rows: list[dict], node_cores: int) -> dict:
    """What the largest size's figures mean at 10^9 samples."""
    last = rows[-1]
    per_process = last["build"]["local_1"]["samples_per_s"]
    hours = 1e9 / per_process / 3600
    return {
        "hours_per_process": hours,
        "nodes_for_one_hour": math.ceil(hours / node_cores),
        "node_cores": node_cores,
        "bytes": last["bytes_per_sample"] * 1e9,
        "energon_prepare_hours_one_process": 1e9 / last["prepare_samples_per_s"] / 3600,
    }


def target(text: str, value: float, limit: float, higher: bool = True) -> dict:
    """A target of the run: its text, the value measured and whether it is met."""
    met = value >= limit if higher else value <= limit
    return {"target": text, "value": value, "met": bool(met)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.index",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--per-shard", type=int, default=10_000, help="documents per shard")
    p.add_argument("--node-cores", type=int, default=64, help="processes per node at 10^9")
    p.add_argument(
        "--msc", action="store_true", help="also measure from object storage (a SeaweedFS server)"
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--args", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    if args.child:
        print(json.dumps(CHILDREN[args.child](**json.loads(args.args))))
        return 0
    record = run_record()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-index-") as tmp, contextlib.ExitStack() as stack:
        server = None
        if args.msc:
            from scripts.s3_server import S3Server

            server = S3Server.launch(Path(tmp) / "s3")
            stack.callback(server.stop)
            os.environ["MSC_CONFIG"] = str(server.msc_config)
        rows = [measure(Path(tmp), n, args.per_shard, server) for n in sorted(args.sizes)]
    first, last = rows[0], rows[-1]
    flat = {
        "build_peak": last["build"]["local_1"]["peak_mib"] / first["build"]["local_1"]["peak_mib"],
        "open_rss_added": (last["open"]["rss_added_mib"] + 1)
        / (first["open"]["rss_added_mib"] + 1),
    }
    biggest = f"N = {last['n']:,}"
    targets = [
        target(
            f"{biggest}: local build, 2 processes / 1 >= 1.8", last["local_scaling_1_to_2"], 1.8
        ),
        target(f"{biggest}: Ray build, 2 workers / 1 >= 1.8", last["ray_scaling_1_to_2"], 1.8),
        target(
            f"build peak memory, N = {last['n']:,} / N = {first['n']:,} <= 1.2",
            flat["build_peak"],
            1.2,
            higher=False,
        ),
        target(f"{biggest}: opening the index, seconds <= 1", last["open"]["open_s"], 1, False),
        target(
            f"{biggest}: start-up, balanced (index prebuilt) / unbalanced <= 1.2",
            last["startup"]["balanced_over_unbalanced"],
            1.2,
            higher=False,
        ),
    ]
    if "msc" in last:
        targets += [
            target(
                f"{biggest}, msc://: opening, seconds <= 1", last["msc"]["open"]["open_s"], 1, False
            ),
            target(
                f"{biggest}, msc://: start-up, balanced / unbalanced <= 1.2",
                last["msc"]["startup"]["balanced_over_unbalanced"],
                1.2,
                higher=False,
            ),
        ]
    result = {
        "benchmark": "index",
        **finish_record(record),
        "settings": {
            "sizes": sorted(args.sizes),
            "per_shard": args.per_shard,
            "encoder": ENCODER,
            "msc": args.msc,
        },
        "results": rows,
        "growth_first_to_last": flat,
        "targets": targets,
        "at_1e9": at_1e9(rows, args.node_cores),
        "seconds": time.perf_counter() - began,
    }
    print(
        f"\n{'N':>10} {'prepare/s':>10} {'build 1/s':>10} {'build 2/s':>10} {'x':>5} "
        f"{'ray 1/s':>9} {'ray 2/s':>9} {'x':>5} {'build MiB':>9} {'open s':>7} {'open MiB':>8} "
        f"{'start bal/plain':>15}"
    )
    for r in rows:
        b = r["build"]
        print(
            f"{r['n']:>10,} {r['prepare_samples_per_s']:>10,.0f} {b['local_1']['samples_per_s']:>10,.0f} "
            f"{b['local_2']['samples_per_s']:>10,.0f} {r['local_scaling_1_to_2']:>5.2f} "
            f"{b['ray_1']['samples_per_s']:>9,.0f} {b['ray_2']['samples_per_s']:>9,.0f} "
            f"{r['ray_scaling_1_to_2']:>5.2f} {b['local_1']['peak_mib']:>9.0f} "
            f"{r['open']['open_s']:>7.3f} {r['open']['rss_added_mib']:>8.1f} "
            f"{r['startup']['balanced_over_unbalanced']:>15.2f}"
        )
    e = result["at_1e9"]
    print(
        f"at 10^9: {e['hours_per_process']:.1f} h on one process, {e['nodes_for_one_hour']} nodes of "
        f"{e['node_cores']} for one hour, {e['bytes'] / 1e9:.1f} GB stored; Energon's prepare "
        f"{e['energon_prepare_hours_one_process']:.1f} h on one process"
    )
    write_json(args.json, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
