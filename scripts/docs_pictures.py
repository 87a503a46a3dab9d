#!/usr/bin/env python
"""The pictures on the docs pages (``docs/assets/*.png``), each drawn by our own tools from a real
run on the embedded data, then shrunk with Pillow to stay small::

    python scripts/docs_pictures.py [--work out/docs-pictures] [--only NAME ...]

Datasets and runs go under ``--work`` (kept, so a second call reuses the converted data); every
command run is printed as typed. Nothing is downloaded. The pictures (``--only`` takes their
names):

* ``check-resume-pass``, ``check-resume-fail``: ``loss.png`` of ``check-resume`` on a small run
  config, our trainer (passes) and the torchtitan-style example loop told to skip restoring its
  loader (fails: the data starts over);
* ``preview-image-text``, ``preview-vlm-tiles``, ``preview-video``, ``preview-3d``: contact
  sheets of ``energon-platform preview``;
* ``balance-rank-cost``: the run report's balance chart of a two-rank run with
  ``loader.balance: attention``;
* ``report``: the run report of a three-modality blend run (``scripts/report_screenshot.py``).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from scripts import report_screenshot  # noqa: E402
from scripts.bench_data import coco_dataset, three_modality_blend  # noqa: E402
from scripts.browser import chromium_or_reason, run_chromium  # noqa: E402

ASSETS = REPO / "docs/assets"
ENCODERS = REPO / "configs/encoders"
#: the largest a picture may be after shrinking (bytes) and the widest it is kept (pixels)
BUDGET = 300_000
MAX_WIDTH = 1400
#: the tiny model and short run of the check-resume pictures (checkpoints every 2 steps)
SMALL_RUN = {
    "model": {"dim": 16, "layers": 1, "heads": 2, "patch": 16},
    "train": {"steps": 10, "checkpoint_every": 2, "warmup": 1},
}


def run(*cmd: str | Path, check: bool = True) -> subprocess.CompletedProcess:
    """``cmd`` run from the repository root, printed first as typed."""
    args = [str(c) for c in cmd]
    shown = " ".join(shlex.quote(a) for a in args).replace(sys.executable, "python")
    print(f"$ {shown}", flush=True)
    done = subprocess.run(args, cwd=REPO)
    if check and done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {shown}")
    return done


def ep(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
    """``energon-platform ARGS``, printed as typed."""
    return run(sys.executable, "-m", "energon_platform", *args, check=check)


def shrink(path: Path) -> None:
    """``path`` rewritten as an optimized PNG at most :data:`MAX_WIDTH` wide and, by fewer colours
    and then smaller sizes, at most :data:`BUDGET` bytes."""
    from PIL import Image

    with Image.open(path) as im:
        image = im.convert("RGB")
    if image.width > MAX_WIDTH:
        image = image.resize((MAX_WIDTH, round(image.height * MAX_WIDTH / image.width)))
    image.save(path, optimize=True)
    if path.stat().st_size > BUDGET:
        image = image.quantize(256, dither=Image.Dither.NONE)
        image.save(path, optimize=True)
    while path.stat().st_size > BUDGET:
        image = image.resize((int(image.width * 0.85), int(image.height * 0.85)))
        image.save(path, optimize=True)
    print(f"  {path.relative_to(REPO)}: {image.width}x{image.height}, {path.stat().st_size} bytes")


# --- data ----------------------------------------------------------------------------------------


def converted(work: Path, name: str, *args: str) -> Path:
    """``energon-platform convert NAME ARGS`` into ``work/data/NAME`` unless already there."""
    out = work / "data" / name
    if not (out / ".nv-meta").is_dir():
        shutil.rmtree(out, ignore_errors=True)
        ep("convert", name, *args, "--out", out, "--samples-per-shard", "16")
    return out


def coco(work: Path) -> Path:
    print("(the embedded COCO-style corpus, converted)", flush=True)
    return coco_dataset(work / "data")


def small_run_config(work: Path) -> Path:
    """A run config: the image-text corpus, the small encoder, one worker-less rank, tiny model."""
    config = {
        "data": {"path": str(coco(work))},
        "encoder": str(ENCODERS / "image_text_small.yaml"),
        "loader": {"global_batch_size": 4, "num_workers": 0, "seed": 3},
        **SMALL_RUN,
    }
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# --- pictures ------------------------------------------------------------------------------------


def check_resume_loss(check: Path, out: Path) -> None:
    """``check``'s ``loss.png`` copied to ``out``."""
    shutil.copyfile(check / "loss.png", out)


def check_resume_pass(work: Path, out: Path) -> None:
    """Our trainer killed during step 7 of 10 and resumed: the curves coincide."""
    check = work / "check-pass"
    args = ["check-resume", "--config", small_run_config(work), "--steps", "10", "--kill-at", "7"]
    ep(*args, "--out", check)
    check_resume_loss(check, out)


def check_resume_fail(work: Path, out: Path) -> None:
    """The torchtitan-style loop resumed without its loader state: the data starts over and the
    loss leaves the uninterrupted run's."""
    loop = REPO / "scripts/examples/torchtitan_style_loop.py"
    cmd = f"{shlex.quote(sys.executable)} {shlex.quote(str(loop))} --config "
    cmd += f"{shlex.quote(str(small_run_config(work)))} --out {{out}} --steps 10"
    check = work / "check-fail"
    done = ep(
        "check-resume",
        "--cmd",
        cmd,
        "--resume-cmd",
        cmd + " --resume --skip-loader-restore",
        "--steps",
        "10",
        "--kill-at",
        "7",
        "--out",
        check,
        check=False,
    )
    if done.returncode != 1:
        raise SystemExit(f"check-resume was to fail (exit 1), it exited {done.returncode}")
    check_resume_loss(check, out)


def preview(data: Path, encoder: str | None, n: int) -> Callable[[Path, Path], None]:
    """A picture: ``energon-platform preview`` of ``data(work)`` with ``encoder``."""

    def draw(work: Path, out: Path) -> None:
        extra = ["--encoder", str(ENCODERS / encoder)] if encoder else []
        ep("preview", data(work), *extra, "--n", str(n), "--out", out)

    return draw


def video(work: Path) -> Path:
    return converted(work, "video", "--root", "data/video_mini/clips", "--val-fraction", "0.1")


def shapes(work: Path) -> Path:
    return converted(work, "3d", "--root", "data/mesh_mini/shapes")


def balanced_run(work: Path) -> Path:
    """Two data-parallel ranks (torchrun) training 16 steps on the packed three-modality blend
    with ``loader.balance: attention``; returns the run folder."""
    blend = three_modality_blend(work / "data")
    config = {
        "data": {"path": str(blend), "val_split": None},
        "encoder": str(ENCODERS / "multimodal_packed.yaml"),
        "loader": {
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "num_workers": 0,
            "seed": 1,
            "balance": "attention",
            "length_cache": str(work / "lengths"),
        },
        **SMALL_RUN,
    }
    config["train"] = {**config["train"], "steps": 16, "checkpoint_every": 8}
    path = work / "balanced.yaml"
    path.write_text(yaml.safe_dump(config))
    out = work / "balanced-run"
    shutil.rmtree(out, ignore_errors=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    train = ["-m", "energon_platform", "train", "--config", path, "--out", out, "--quiet"]
    run(*torchrun, "--nproc-per-node", "2", *train)
    return out


def balance_rank_cost(work: Path, out: Path) -> None:
    """The report's balance chart (per-rank cost max/mean and padding) of :func:`balanced_run`,
    photographed alone on a page in headless Chromium."""
    from energon_platform.tools.report import balance_chart, read_run_log

    run_dir = balanced_run(work)
    print(f"(the report's balance chart of {run_dir.relative_to(work)}/log.jsonl)", flush=True)
    page = work / "balance.html"
    page.write_text(
        "<html><body style='margin:0;background:#fff'>"
        + balance_chart(read_run_log(run_dir))
        + "</body></html>"
    )
    shot = run_chromium(page, f"--screenshot={out}", "--window-size=1000,330")
    if shot.returncode != 0 or not out.is_file():
        raise SystemExit(shot.stderr[-2000:])


def report(work: Path, out: Path) -> None:
    """The run report of a three-modality blend run (``scripts/report_screenshot.py``)."""
    status = report_screenshot.screenshot(work / "report", out)
    if status:
        raise SystemExit(status)


#: every picture: its name (``--only``, and its file ``docs/assets/NAME.png``) and how it is drawn
PICTURES: dict[str, Callable[[Path, Path], None]] = {
    "check-resume-pass": check_resume_pass,
    "check-resume-fail": check_resume_fail,
    "preview-image-text": preview(coco, None, 8),
    "preview-vlm-tiles": preview(coco, "image_text_vlm_small.yaml", 4),
    "preview-video": preview(video, "video_text_small.yaml", 6),
    "preview-3d": preview(shapes, "pointcloud_text.yaml", 6),
    "balance-rank-cost": balance_rank_cost,
    "report": report,
}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", default="out/docs-pictures", help="datasets and runs go here")
    ap.add_argument(
        "--only", action="append", choices=sorted(PICTURES), help="redo this picture (repeatable)"
    )
    args = ap.parse_args()
    reason = chromium_or_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    work = (REPO / args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ASSETS.mkdir(parents=True, exist_ok=True)
    for name in args.only or PICTURES:
        out = ASSETS / f"{name}.png"
        print(f"\n== {out.relative_to(REPO)} ==", flush=True)
        PICTURES[name](work, out)
        shrink(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
