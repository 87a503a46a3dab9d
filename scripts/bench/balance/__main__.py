"""``python -m scripts.bench_balance`` (from the repository) or ``python scripts/bench_balance``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.bench_balance.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
