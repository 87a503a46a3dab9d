#!/usr/bin/env python
"""The pictures on the docs pages (``docs/assets/*.png``), each drawn by our own tools from the run
the page describes, on the embedded data, then shrunk with Pillow to stay small::

    python -m scripts.docs_pictures [--work out/docs-pictures] [--only NAME ...]

Datasets and runs go under ``--work`` (kept, so a second call reuses the converted data); every
command run is printed as typed. Nothing is downloaded. Beside each picture ``NAME.png`` goes
``NAME.json``, its sidecar: ``{"picture", "command", "figures"}``, the command that made it
(paths relative to the repository, ``energon-platform`` for ``python -m energon_platform``) and
the figures the pages state of it (steps, kill step, spike steps, z threshold, ...), each read
from the run's own output; ``tests/project/test_docs_pictures.py`` checks them against the text
around the picture. The pictures (``--only`` takes their names):

* ``check-resume-pass``: ``loss.png`` of ``make demo``'s ``check-resume`` (our trainer on the
  three-modality blend, ``configs/train_blend.yaml``, 30 steps, killed during step 17);
* ``check-resume-fail``: ``loss.png`` of the check on ``docs/check-resume.md``'s torchtitan-style
  example loop (two ranks, 12 steps, killed during step 8) told to skip restoring its loader: the
  data starts over;
* ``preview-image-text``, ``preview-vlm-tiles``, ``preview-video``, ``preview-3d``: contact
  sheets of ``energon-platform preview``;
* ``balance-rank-cost``: the run report's balance chart of a two-rank run with
  ``loader.balance: attention``;
* ``report``: ``make demo``'s run report of its planted spike and the replay without the spike's
  samples (``scripts/demo.py``'s ``spike_loop``), photographed by ``scripts/report_screenshot.py``;
* ``mixing-report``: the mixing chart of the report of ``make demo``'s online data mixing run
  (``scripts/demo.py``'s ``mixing_run``: the three-modality blend, ``loader.blend_adapt`` on).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from energon_platform.training.resume_check.processes import torchrun_argv
from scripts import demo, report_screenshot
from scripts.bench.data import (
    coco_dataset,
    librispeech_dataset,
    text_dataset,
    three_modality_blend,
)
from scripts.browser import chromium_or_reason, run_chromium

REPO = Path(__file__).resolve().parents[1]

ASSETS = REPO / "docs/assets"
ENCODERS = REPO / "configs/encoders"
#: the largest a picture may be after shrinking (bytes) and the widest it is kept (pixels)
BUDGET = 300_000
MAX_WIDTH = 1400
#: the tiny model and short run of the check-resume-fail and balance pictures (checkpoints every 2)
SMALL_RUN = {
    "model": {"dim": 16, "layers": 1, "heads": 2, "patch": 16},
    "train": {"steps": 10, "checkpoint_every": 2, "warmup": 1},
}
#: how a picture's sidecar names the program of a command line: what each launcher is typed as
SHOWN = {
    (sys.executable, "-m", "energon_platform"): "energon-platform",
    (sys.executable, "-m", "torch.distributed.run"): "torchrun",
}


def shown(args: list[str], quote: bool = True) -> str:
    """``args`` as the docs type them: ``energon-platform`` and ``torchrun`` for their Python
    launchers, paths relative to the repository, each quoted for the shell where ``quote``."""
    for launcher, name in SHOWN.items():
        if tuple(args[: len(launcher)]) == launcher:
            args = [name, *args[len(launcher) :]]
    return (shlex.join(args) if quote else " ".join(args)).replace(f"{REPO}/", "")


def run(*cmd: str | Path, check: bool = True, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``cmd`` run in ``cwd``, printed first as typed; its stdout shown as it comes and kept
    (``.stdout``: the figures of a sidecar are read from it)."""
    args = [str(c) for c in cmd]
    if cwd != REPO:
        print(f"(in {shown([str(cwd)])})")
    print(f"$ {shown(args)}", flush=True)
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    done = subprocess.CompletedProcess(args, proc.wait(), "".join(lines))
    if check and done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {shown(args)}")
    return done


def ep(*args: str | Path, check: bool = True, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``energon-platform ARGS``, printed as typed."""
    return run(sys.executable, "-m", "energon_platform", *args, check=check, cwd=cwd)


def found(pattern: str, text: str, what: str) -> re.Match:
    """The first match of ``pattern`` in a command's output ``text``; exits naming ``what``
    when there is none (the output changed: the sidecar would state nothing)."""
    match = re.search(pattern, text, re.M)
    if match is None:
        raise SystemExit(f"no {what} in the output ({pattern!r})")
    return match


def number(text: str) -> int | float:
    """``"4"`` as 4, ``"2.5"`` as 2.5."""
    value = float(text)
    return int(value) if value.is_integer() else value


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


def write_sidecar(picture: Path, made: dict) -> Path:
    """``picture``'s sidecar ``NAME.json`` beside it: ``{"picture", "command", "figures"}`` (and
    ``variables``, the shell variables the command uses, where it has them)."""
    sidecar = picture.with_suffix(".json")
    sidecar.write_text(json.dumps({"picture": picture.name, **made}, indent=2) + "\n")
    print(f"  {sidecar.relative_to(REPO)}: {json.dumps(made['figures'])}")
    return sidecar


# --- data ----------------------------------------------------------------------------------------


def converted(work: Path, name: str, *args: str) -> Path:
    """``energon-platform convert NAME ARGS`` into ``work/data/NAME`` unless already there."""
    out = work / "data" / name
    if not (out / ".nv-meta").is_dir():
        shutil.rmtree(out, ignore_errors=True)
        ep("convert", name, *args, "--out", out, "--samples-per-shard", "16")
    return out


def coco(work: Path) -> Path:
    print("(the embedded COCO-style corpus, converted as make demo converts it)", flush=True)
    return coco_dataset(work / "data")


def small_run_config(path: Path, work: Path) -> Path:
    """A run config at ``path``: the image-text corpus, the small encoder, no loader workers, a
    tiny model checkpointed every 2 steps."""
    config = {
        "data": {"path": str(coco(work))},
        "encoder": str(ENCODERS / "image_text_small.yaml"),
        "loader": {"global_batch_size": 4, "num_workers": 0, "seed": 3},
        **SMALL_RUN,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


# --- pictures ------------------------------------------------------------------------------------
# Each draws its picture into ``out`` and returns its sidecar's ``command`` and ``figures``.


def check_figures(check: Path) -> dict:
    """What a check's ``report.json`` says of it: its steps, the step the kill came during, the
    checkpoint step the resumed run continued from, and its verdict."""
    report = json.loads((check / "report.json").read_text())
    return {
        "steps": max(row["step"] for row in report["rows"]),
        "kill_at": report["kill_at"],
        "resumed_from": report["resume_step"],
        "verdict": "PASS" if report["passed"] else "FAIL",
    }


def check_resume_pass(work: Path, out: Path) -> dict:
    """``make demo``'s check (``scripts/demo.py``, step 3): our trainer on the demo's
    three-modality blend, 30 steps, killed during step 17 and resumed: the curves coincide."""
    base = work / "demo"
    base.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    print("(the demo's blend: configs/blend_demo.yaml pointed at the converted corpora)")
    blend = demo._blend_file(base, coco(work), librispeech_dataset(data), text_dataset(data))
    args = ["check-resume", "--config", "configs/train_blend.yaml", "--set", f"data.path={blend}"]
    args += ["--steps", "30", "--kill-at", "17", "--out", str(base / "check-resume")]
    # an earlier call's check: check-resume refuses to clear runs holding the run.yaml and
    # run.json the trainer records, as files it did not write
    shutil.rmtree(base / "check-resume", ignore_errors=True)
    ep(*args)
    shutil.copyfile(base / "check-resume" / "loss.png", out)
    command = shown([sys.executable, "-m", "energon_platform", *args])
    return {"command": command, "figures": check_figures(base / "check-resume")}


def check_resume_fail(work: Path, out: Path) -> dict:
    """``docs/check-resume.md``'s torchtitan-style loop on two ranks resumed without its loader
    state (``--skip-loader-restore``): the data starts over and the loss leaves the
    uninterrupted run's. Run as the page types it, in a folder holding its ``run.yaml``; the
    check writes to its default ``--out``, ``out/check-resume`` there."""
    folder = work / "check-fail"
    small_run_config(folder / "run.yaml", work)
    loop = torchrun_argv(2, REPO / "scripts/examples/torchtitan_style_loop.py")
    loop += ["--config", "run.yaml", "--out", "{out}", "--steps", "12"]
    resume = "--resume --skip-loader-restore"
    cmd = " ".join(loop)
    args = ["check-resume", "--steps", "12", "--kill-at", "8"]
    shutil.rmtree(folder / "out", ignore_errors=True)  # an earlier call's check
    done = ep(*args, "--cmd", cmd, "--resume-cmd", f"{cmd} {resume}", check=False, cwd=folder)
    if done.returncode != 1:
        raise SystemExit(f"check-resume was to fail (exit 1), it exited {done.returncode}")
    check = folder / "out" / "check-resume"
    shutil.copyfile(check / "loss.png", out)
    return {
        "command": f'energon-platform {" ".join(args)} --cmd "$L" --resume-cmd "$L {resume}"',
        "variables": {"L": shown(loop, quote=False)},
        "figures": check_figures(check),
    }


def preview(data: Callable[[Path], Path], encoder: str | None, n: int) -> Callable:
    """A picture: ``energon-platform preview`` of ``data(work)`` with ``encoder``; its figure:
    the samples (documents) the sheet shows, as preview counts them."""

    def draw(work: Path, out: Path) -> dict:
        extra = ["--encoder", str(ENCODERS / encoder)] if encoder else []
        sheet = work / "previews" / out.name  # preview replaces no file of another's making
        sheet.parent.mkdir(parents=True, exist_ok=True)
        sheet.unlink(missing_ok=True)
        args = ["preview", str(data(work)), *extra, "--n", str(n), "--out", str(sheet)]
        done = ep(*args)
        shutil.copyfile(sheet, out)
        drawn = found(r": (\d+) documents, \d+x\d+ px$", done.stdout, "documents drawn")
        return {
            "command": shown([sys.executable, "-m", "energon_platform", *args]),
            "figures": {"samples": int(drawn[1])},
        }

    return draw


def video(work: Path) -> Path:
    return converted(work, "video", "--root", "data/video_mini/clips", "--val-fraction", "0.1")


def shapes(work: Path) -> Path:
    return converted(work, "3d", "--root", "data/mesh_mini/shapes")


def balanced_run(work: Path) -> tuple[list[str], Path]:
    """Two data-parallel ranks (torchrun) training 16 steps on the packed three-modality blend
    with ``loader.balance: attention``; returns the command and the run folder."""
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
    train = ["-m", "energon_platform", "train", "--config", str(path), "--out", str(out), "--quiet"]
    cmd = torchrun_argv(2, *train)
    run(*cmd)
    return cmd, out


def balance_rank_cost(work: Path, out: Path) -> dict:
    """The report's balance chart (per-rank cost max/mean and padding) of :func:`balanced_run`,
    photographed alone on a page in headless Chromium; its figures from the run's log and the
    config it recorded: steps, ranks, balance mode."""
    from energon_platform.tools.report import balance_chart, read_run_log

    cmd, run_dir = balanced_run(work)
    print(f"(the report's balance chart of {run_dir.relative_to(work)}/log.jsonl)", flush=True)
    page = work / "balance.html"
    page.write_text(
        "<html><body style='margin:0;background:#fff'>"
        + balance_chart(read_run_log(run_dir))
        + "</body></html>"
    )
    shot = run_chromium(page, f"--screenshot={out}", "--window-size=1000,600")
    if shot.returncode != 0 or not out.is_file():
        raise SystemExit(shot.stderr[-2000:])
    report_screenshot.trim_bottom(out)  # the legend below the chart kept, the blank cut
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    ranks = {row["world_size"] for row in rows if "step" in row}
    balance = yaml.safe_load((run_dir / "run.yaml").read_text())["loader"]["balance"]
    if len(ranks) != 1:
        raise SystemExit(f"{run_dir}: its steps ran on {sorted(ranks)} ranks")
    return {
        "command": shown(cmd),
        "figures": {
            "steps": max(row["step"] for row in rows if "step" in row),
            "ranks": ranks.pop(),
            "balance": balance["mode"] if isinstance(balance, dict) else balance,
        },
    }


def report(work: Path, out: Path) -> dict:
    """``make demo``'s loss spike (``scripts/demo.py``'s ``spike_loop``, in a process of its own:
    it plants the junk into the trainer of the process it runs in) into ``work/demo``, and its
    ``report.html`` photographed (``scripts/report_screenshot.py``). The figures from what the
    loop printed: the run's steps (as ``report`` counts them), the spikes ``spikes`` found and
    its z threshold, and the step where the replayed loss first differs."""
    base = work / "demo"
    # an earlier call's replay: `replay --overwrite` refuses the run.yaml and run.json the
    # trainer records there beside what it counts as a replay's own
    shutil.rmtree(base / "spike" / "replay", ignore_errors=True)
    code = "import sys; from pathlib import Path; from scripts import demo; "
    code += "demo.spike_loop(Path(sys.argv[1]), Path(sys.argv[2]))"
    done = run(sys.executable, "-c", code, base, coco(work))  # run in REPO: scripts.* found
    listing = found(
        r"^\$ energon-platform spikes .* --top 3\n((?:.*\n)*?)(\d+) spike\(s\) "
        r"\(z >= ([\d.]+) over",
        done.stdout,
        "spikes listing",
    )
    spike_steps = [int(s) for s in re.findall(r"^step (\d+)  loss", listing[1], re.M)]
    if len(spike_steps) != int(listing[2]):
        raise SystemExit(f"spikes listed {spike_steps} but counted {listing[2]}")
    drawn = found(r"^\$ (energon-platform report .*)$", done.stdout, "report command")
    if " --z " in drawn[1]:
        raise SystemExit("the demo's report sets its own --z: read it from the command")
    made = found(r"report\.html: (\d+) steps, (\d+) spikes", done.stdout, "report summary")
    if int(made[2]) != len(spike_steps):
        raise SystemExit(f"the report draws {made[2]} spikes, spikes found {spike_steps}")
    differs = found(r"the replayed loss first differs at step (\d+)", done.stdout, "replay")
    status = report_screenshot.screenshot(base / "report.html", out)
    if status:
        raise SystemExit(status)
    return {
        "command": drawn[1].replace(f"{REPO}/", ""),
        "figures": {
            "steps": int(made[1]),
            "spike_steps": spike_steps,
            "z": number(listing[3]),
            "replay_differs_at": int(differs[1]),
        },
    }


def mixing_report(work: Path, out: Path) -> dict:
    """``make demo``'s online data mixing (``scripts/demo.py``'s ``mixing_run``, in a process of
    its own) on the three-modality blend into ``work/demo/mixing``, and its report's mixing chart
    (weights over time beside each dataset's loss) photographed alone on a page, as
    :func:`balance_rank_cost` photographs the balance chart. Its figures from what the run
    printed: the steps its report counts."""
    from energon_platform.tools.report import mixing_chart, read_run_log

    base = work / "demo"
    base.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    blend = demo._blend_file(base, coco(work), librispeech_dataset(data), text_dataset(data))
    code = "import sys; from pathlib import Path; from scripts import demo; "
    code += "demo.mixing_run(Path(sys.argv[1]), Path(sys.argv[2]))"
    done = run(sys.executable, "-c", code, base, blend)  # run in REPO: scripts.* found
    trained = found(r"^\$ (energon-platform train .*)$", done.stdout, "train command")
    made = found(r"mixing/report\.html: (\d+) steps", done.stdout, "report summary")
    page = work / "mixing.html"
    page.write_text(
        "<html><body style='margin:0;background:#fff'>"
        + mixing_chart(read_run_log(base / "mixing"))
        + "</body></html>"
    )
    shot = run_chromium(page, f"--screenshot={out}", "--window-size=1000,600")
    if shot.returncode != 0 or not out.is_file():
        raise SystemExit(shot.stderr[-2000:])
    report_screenshot.trim_bottom(out)
    return {
        "command": trained[1].replace(f"{REPO}/", ""),
        "figures": {"steps": int(made[1])},
    }


#: every picture: its name (``--only``, and its file ``docs/assets/NAME.png``) and how it is drawn
PICTURES: dict[str, Callable[[Path, Path], dict]] = {
    "check-resume-pass": check_resume_pass,
    "check-resume-fail": check_resume_fail,
    "preview-image-text": preview(coco, None, 8),
    "preview-vlm-tiles": preview(coco, "image_text_vlm_small.yaml", 4),
    "preview-video": preview(video, "video_text_small.yaml", 6),
    "preview-3d": preview(shapes, "pointcloud_text.yaml", 8),
    "balance-rank-cost": balance_rank_cost,
    "report": report,
    "mixing-report": mixing_report,
}


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.docs_pictures",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        made = PICTURES[name](work, out)
        shrink(out)
        write_sidecar(out, made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
