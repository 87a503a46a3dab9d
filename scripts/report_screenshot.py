#!/usr/bin/env python
"""A run report (the HTML page ``energon-platform report`` writes) photographed in headless
Chromium (``scripts/browser.py``) into a PNG, the blank space below the page cut off::

    python -m scripts.report_screenshot --page out/demo/report.html --out report.png

``python -m scripts.docs_pictures --only report`` draws ``docs/assets/report.png`` with it: the report
``make demo`` writes of its planted loss spike and the replay without the spike's samples.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.browser import chromium_or_reason, run_chromium

REPO = Path(__file__).resolve().parents[1]

#: the browser window: the report's width, and a height above any short run's page
WIDTH, HEIGHT = 1100, 4000
#: white kept below the page's last drawn pixel (pixels)
MARGIN = 24


def trim_bottom(path: Path, margin: int = MARGIN) -> None:
    """``path`` (a screenshot on a white page) cut ``margin`` pixels below its lowest non-white
    pixel."""
    from PIL import Image, ImageChops

    with Image.open(path) as im:
        image = im.convert("RGB")
    box = ImageChops.difference(image, Image.new("RGB", image.size, "white")).getbbox()
    if box and box[3] + margin < image.height:
        image.crop((0, 0, image.width, box[3] + margin)).save(path)


def screenshot(page: Path, out: Path, width: int = WIDTH, height: int = HEIGHT) -> int:
    """``page`` photographed into ``out`` (a ``width`` x ``height`` window, the blank below the
    page cut off); 0 when written, else the exit status (the reason printed)."""
    reason = chromium_or_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    if not page.is_file():
        print(f"{page}: no such page (make demo writes out/demo/report.html)", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    shot = run_chromium(page, f"--screenshot={out}", f"--window-size={width},{height}")
    if shot.returncode != 0 or not out.is_file():
        print(shot.stderr[-2000:], file=sys.stderr)
        return 1
    trim_bottom(out)
    print(f"{out}: screenshot of {page}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.report_screenshot", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--page", default="out/demo/report.html", help="the report to photograph (make demo's)"
    )
    ap.add_argument("--out", default="report.png", help="the screenshot to write")
    args = ap.parse_args()
    return screenshot(Path(args.page).resolve(), Path(args.out).resolve())


if __name__ == "__main__":
    sys.exit(main())
