#!/usr/bin/env python
"""The screenshot of the run report on the docs page (``docs/assets/report.png``).

Converts the embedded corpora into a three-modality blend, trains the reference model on it
(``configs/train_blend.yaml``), writes its report with ``energon-platform report`` (spikes found
and their samples traced as the command does) and photographs it in headless Chromium
(``scripts/browser.py``)::

    python scripts/report_screenshot.py --work out/report-shot --out docs/assets/report.png

``scripts/docs_pictures.py --only report`` calls :func:`screenshot` with the other docs pictures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.bench_data import three_modality_blend  # noqa: E402
from scripts.browser import chromium_or_reason, run_chromium  # noqa: E402


def train(blend: Path, run: Path, steps: int) -> None:
    """The reference trainer on ``blend`` for ``steps`` steps into ``run`` (a fresh folder)."""
    cmd = [sys.executable, "-m", "energon_platform", "train", "--config"]
    cmd += [str(REPO / "configs/train_blend.yaml"), "--set", f"data.path={blend}"]
    cmd += ["--steps", str(steps), "--out", str(run), "--quiet", "--num-workers", "0"]
    subprocess.run(cmd, check=True, cwd=REPO)


def screenshot(work: Path, out: Path, steps: int = 60, z: float = 2.5, window: int = 5) -> int:
    """The report of a ``steps``-step blend run (datasets and run under ``work``, reused when
    there) photographed into ``out``; 0 when written, else the exit status (the reason printed)."""
    reason = chromium_or_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    blend = three_modality_blend(work / "data")
    run = work / "run"
    if not (run / "log.jsonl").is_file():
        train(blend, run, steps)
    page = work / "report.html"
    cmd = [sys.executable, "-m", "energon_platform", "report", "--run", str(run)]
    cmd += ["--out", str(page)]
    cmd += ["--config", str(REPO / "configs/train_blend.yaml"), "--set", f"data.path={blend}"]
    cmd += ["--z", str(z), "--window", str(window)]
    made = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if made.returncode != 0:
        print(made.stderr[-2000:], file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    shot = run_chromium(page, f"--screenshot={out}", "--window-size=1100,2400")
    if shot.returncode != 0 or not out.is_file():
        print(shot.stderr[-2000:], file=sys.stderr)
        return 1
    print(f"{out}: screenshot of {made.stdout.strip()}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="out/report-shot", help="datasets and the run go here")
    ap.add_argument("--out", default="docs/assets/report.png", help="the screenshot to write")
    ap.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    ap.add_argument("--z", type=float, default=2.5, help="spike threshold (default 2.5)")
    ap.add_argument("--window", type=int, default=5, help="steps a z-score looks back over")
    args = ap.parse_args()
    work, out = (REPO / args.work).resolve(), (REPO / args.out).resolve()
    return screenshot(work, out, args.steps, args.z, args.window)


if __name__ == "__main__":
    sys.exit(main())
