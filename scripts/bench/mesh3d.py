#!/usr/bin/env python
"""Point clouds per second through energon-platform's loader (``pointcloud_text``) against a plain
trimesh loop doing the same sampling, side by side.

Generates ``--n`` shapes (icospheres, boxes, cylinders and tori with about ``--faces`` faces as
binary PLY, OBJ, binary STL and GLB, and every fifth a stored cloud of 20,000 points as NPY), with
a caption each, converts them with ``energon-platform convert 3d``, then, alternating epoch by
epoch, all in this process:

* **ours**: ``TrainLoader`` (``num_workers=0``, batches of 8): samples read from the shards, the
  file parsed, ``--points`` points sampled on the surface (area-weighted, the sample's own seeded
  generator), normalised, augmented (turn about y, scale, jitter), caption tokenized, batched;
* **plain trimesh**: a loop over the same original files: ``trimesh.load(path, process=False)``
  (NPY through ``numpy.load``), ``trimesh.sample.sample_surface`` with a seeded generator (a
  random draw of a stored cloud's points), the same normalisation.

The ratio is ours over plain clouds/s (target >= 0.9). Prints a table and writes ``--json``; no
figure is typed in: every number is measured here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from scripts.bench.common import check_json_out, finish_record, run_record, write_json


def make_corpus(root: Path, n: int, faces: int) -> list[Path]:
    import trimesh

    root.mkdir(parents=True, exist_ok=True)
    subdiv = max(1, int(round(np.log(max(faces, 80) / 20) / np.log(4))))
    sections = max(8, faces // 4)
    makers = [
        lambda: trimesh.creation.icosphere(subdivisions=subdiv),
        lambda: trimesh.creation.cylinder(radius=0.5, height=2.0, sections=sections),
        lambda: trimesh.creation.torus(
            1.0,
            0.3,
            major_sections=max(8, int(np.sqrt(faces))),
            minor_sections=max(6, int(np.sqrt(faces)) // 2),
        ),
        lambda: trimesh.creation.icosphere(subdivisions=subdiv).apply_scale([1.0, 0.4, 1.5]),
    ]
    formats = ["ply", "obj", "stl", "glb"]
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        if i % 5 == 4:
            path = root / f"s{i:04d}.npy"
            np.save(path, rng.normal(size=(20_000, 3)).astype(np.float32))
        else:
            path = root / f"s{i:04d}.{formats[i % 4]}"
            data = makers[i % len(makers)]().export(file_type=formats[i % 4])
            # OBJ comes back as text
            path.write_bytes(data.encode() if isinstance(data, str) else data)
        path.with_suffix(".txt").write_text(f"shape number {i}\n")
        paths.append(path)
    return paths


def plain_epoch(paths: list[Path], points: int, seed: int) -> int:
    import trimesh

    done = 0
    for i, path in enumerate(paths):
        rng = np.random.default_rng([abs(seed), i])
        if path.suffix == ".npy":
            cloud = np.load(path)
            pts = cloud[rng.choice(len(cloud), size=points, replace=False)].astype(np.float64)
        else:
            mesh = trimesh.load(path, process=False)
            if isinstance(mesh, trimesh.Scene):
                mesh = mesh.to_geometry()
            pts, _ = trimesh.sample.sample_surface(mesh, points, seed=rng)
        pts = pts - pts.mean(axis=0)
        pts /= np.sqrt((pts**2).sum(axis=1).max())
        done += len(pts) == points
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.bench.mesh3d", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--n", type=int, default=60, help="shapes (default 60)")
    ap.add_argument(
        "--faces", type=int, default=5000, help="about this many faces per mesh (default 5000)"
    )
    ap.add_argument("--points", type=int, default=1024, help="points per cloud (default 1024)")
    ap.add_argument(
        "--epochs",
        type=int,
        default=5,
        help="epochs of each, alternating; medians reported (default 5)",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    record = run_record()

    from converters.convert import ConvertOptions, run_conversion
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    with tempfile.TemporaryDirectory() as tmp:
        paths = make_corpus(Path(tmp) / "raw", args.n, args.faces)
        out = Path(tmp) / "shards"
        run_conversion(
            "3d",
            {"root": str(Path(tmp) / "raw")},
            ConvertOptions(out=str(out), samples_per_shard=32, progress=False),
        )
        config = load_config(
            {
                "data": {"path": str(out), "val_split": None},
                "encoder": {
                    "encoder": "pointcloud_text",
                    "text": {"seq_len": 32},
                    "pointcloud": {"num_points": args.points},
                },
                "loader": {"global_batch_size": 8, "num_workers": 0},
            }
        )
        loader = TrainLoader(config)
        next(loader)  # warm-up: open the shards, build the encoder, import trimesh's loaders
        plain_epoch(paths[:10], args.points, -1)  # the same warm-up for the plain loop
        per_epoch = -(-args.n // 8)
        ours, plain = [], []
        for epoch in range(args.epochs):
            t = time.perf_counter()
            clouds = sum(len(next(loader).keys) for _ in range(per_epoch))
            ours.append(clouds / (time.perf_counter() - t))
            t = time.perf_counter()
            clouds = plain_epoch(paths, args.points, epoch)
            plain.append(clouds / (time.perf_counter() - t))
        loader.close()
    result = {
        **record,
        "shapes": args.n,
        "faces": args.faces,
        "points": args.points,
        "epochs": args.epochs,
        "ours_clouds_per_s": round(statistics.median(ours), 1),
        "plain_trimesh_clouds_per_s": round(statistics.median(plain), 1),
    }
    result["ratio"] = round(result["ours_clouds_per_s"] / result["plain_trimesh_clouds_per_s"], 3)
    print(f"{'':28s}{'clouds/s':>10s}")
    print(f"{'energon-platform loader':28s}{result['ours_clouds_per_s']:10.1f}")
    print(f"{'plain trimesh loop':28s}{result['plain_trimesh_clouds_per_s']:10.1f}")
    print(f"{'ratio (ours / plain)':28s}{result['ratio']:10.3f}   (target >= 0.9)")
    finish_record(result)
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
