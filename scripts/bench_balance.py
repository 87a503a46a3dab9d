"""``python scripts/bench_balance.py ...``, as the docs and the measurements page type it: the
balance benchmark, the package ``scripts/bench_balance/`` (its docstring says what it measures)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_balance.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
