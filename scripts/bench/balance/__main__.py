"""``python -m scripts.bench.balance`` (from the repository root)."""

import sys

from scripts.bench.balance.runner import main

if __name__ == "__main__":
    sys.exit(main())
