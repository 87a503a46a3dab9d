"""What the generators share: the seed every random stream derives from, and English helpers."""

from __future__ import annotations

SEED = 20240611


def article(word: str) -> str:
    """``"an"`` before a word that starts with a vowel, else ``"a"``."""
    return "an" if word[0] in "aeiou" else "a"
