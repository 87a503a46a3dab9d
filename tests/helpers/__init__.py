"""What the tests share: corpora and datasets, servers, harnesses, the CLI runner."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root (holds ``data/``, ``configs/``, ``scripts/`` and the packages)."""
