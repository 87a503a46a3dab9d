"""How much a folder holds at its fullest while something runs: a thread samples it every few ms.
Used by ``bench_convert.py`` and the bounded-staging tests."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


class FolderSampler:
    """Samples a folder's total file bytes every few ms in a thread: ``peak`` (all files),
    ``peak_shards`` (``*.tar*`` files) and ``shard_dirs`` (the first four parts of every folder a
    shard was seen in)."""

    def __init__(self, root: Path):
        self.root, self.peak, self.peak_shards, self.shard_dirs = root, 0, 0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            total = shards = 0
            for dirpath, _, files in os.walk(self.root):
                for f in files:
                    try:
                        size = os.stat(os.path.join(dirpath, f)).st_size
                    except OSError:
                        continue
                    total += size
                    if ".tar" in f:
                        shards += size
                        self.shard_dirs.add(Path(dirpath).relative_to(self.root).parts[:4])
            self.peak, self.peak_shards = max(self.peak, total), max(self.peak_shards, shards)
            time.sleep(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
