"""Debian's Chromium, headless, for tests and scripts that look at an HTML page as a person would.

:func:`chromium_or_reason` installs it with apt-get where it is missing and the user is root (the
test set-up's way), else says why it cannot be had; :func:`run_chromium` opens a page in a fresh
profile with everything that reaches out to the network switched off; :func:`console_messages`
picks the page's console lines (script errors, Content-Security-Policy refusals) from its log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
#: headless, no sandbox (containers run as root), nothing fetched or synced in the background
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
)


def chromium_or_reason() -> str | None:
    """None when :data:`CHROMIUM` is there (installed now if missing and the user is root and
    apt-get works), else why it is not."""
    if CHROMIUM.is_file():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{CHROMIUM} is missing; install Debian's chromium package (needs root and apt-get)"
    r = subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
        capture_output=True,
        text=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    if r.returncode != 0 or not CHROMIUM.is_file():
        return f"apt-get install chromium failed: {(r.stderr or r.stdout).strip()[-300:]}"
    return None


def run_chromium(page: Path, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Chromium (:data:`FLAGS` and ``flags``, e.g. ``--dump-dom``, ``--screenshot=PATH``) on the
    local file ``page``, in a new empty profile; stdout and stderr captured as text."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *flags, page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def console_messages(log: str) -> list[str]:
    """The lines of Chromium's ``--enable-logging=stderr`` output that the page's console wrote
    (uncaught script errors, refused loads)."""
    return [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]
