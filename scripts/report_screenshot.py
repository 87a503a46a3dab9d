#!/usr/bin/env python
"""The screenshot of the run report on the docs page (``docs/assets/report.png``).

Converts the embedded corpora into a three-modality blend, trains the reference model on it
(``configs/train_blend.yaml``), finds its loss spikes with the tests' stand-in spike finder
(``tests/helpers/spikes.py``: z-score over the preceding steps), writes the report with
``energon-platform report``'s builder and photographs it in headless Chromium
(``tests/helpers/browser.py``)::

    python scripts/report_screenshot.py --work out/report-shot --out docs/assets/report.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from energon_platform.config import load_config  # noqa: E402
from energon_platform.tools.report import build_report  # noqa: E402
from tests.helpers.browser import chromium_or_reason, run_chromium  # noqa: E402
from tests.helpers.demo_datasets import three_modality_blend  # noqa: E402
from tests.helpers.spikes import spikes_of  # noqa: E402


def train(blend: Path, run: Path, steps: int) -> None:
    """The reference trainer on ``blend`` for ``steps`` steps into ``run`` (a fresh folder)."""
    cmd = [sys.executable, "-m", "energon_platform", "train", "--config"]
    cmd += [str(REPO / "configs/train_blend.yaml"), "--set", f"data.path={blend}"]
    cmd += ["--steps", str(steps), "--out", str(run), "--quiet", "--num-workers", "0"]
    subprocess.run(cmd, check=True, cwd=REPO)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="out/report-shot", help="datasets and the run go here")
    ap.add_argument("--out", default="docs/assets/report.png", help="the screenshot to write")
    ap.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    ap.add_argument("--z", type=float, default=2.5, help="spike threshold (default 2.5)")
    ap.add_argument("--window", type=int, default=5, help="steps a z-score looks back over")
    args = ap.parse_args()
    reason = chromium_or_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    work = (REPO / args.work).resolve()
    blend = three_modality_blend(work / "data")
    run = work / "run"
    if not (run / "log.jsonl").is_file():
        train(blend, run, args.steps)
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    cfg = load_config(REPO / "configs/train_blend.yaml", {"data.path": str(blend)})
    page = work / "report.html"
    info = build_report(run, page, spikes=spikes_of(rows, args.z, args.window), config=cfg)
    out = (REPO / args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    shot = run_chromium(page, f"--screenshot={out}", "--window-size=1100,2400")
    if shot.returncode != 0 or not out.is_file():
        print(shot.stderr[-2000:], file=sys.stderr)
        return 1
    print(f"{out}: screenshot of {page} ({info['steps']} steps, {info['spikes']} spikes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
