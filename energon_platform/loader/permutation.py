"""A keyed bijection of ``[0, n)``: any position's image in O(1) time and memory.

Why a Feistel network with cycle walking (and not a stored permutation, an LCG or a blocked
shuffle)? At 10⁹ samples a stored epoch order is 4-8 GB per process and seconds to build; a
keyed bijection is computed per position, so a restore at any position costs what a start does,
and every process (rank, worker) computes the same value without sharing anything.

* The domain is padded to ``2^(2h) >= n``; a balanced Feistel network of ``ROUNDS`` rounds on
  ``h``-bit halves is a bijection of ``[0, 2^(2h))`` for *any* round function (Luby–Rackoff),
  and with 4 rounds of a good mixer it is indistinguishable from a random permutation for our
  purposes (``scripts/bench/scale.py`` measures neighbour correlation against NumPy's
  ``permutation``).
* Cycle walking (apply again while the image is ``>= n``) restricts it to a bijection of
  ``[0, n)``. The padded domain is below ``4n``, so a walk takes under 4 applications on average.
* The round function is SplitMix64's finalizer over (round key XOR the right half): 64-bit
  integer arithmetic in NumPy, vectorised over positions.

Determinism: the output depends only on ``(n, key)`` and the input; identical across processes,
machines and NumPy versions (pure unsigned 64-bit integer arithmetic, no floats).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

ROUNDS = 4
_M64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1, _C2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 of a ``uint64`` array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _C1
        z = (z ^ (z >> np.uint64(27))) * _C2
        return z ^ (z >> np.uint64(31))


def derive_key(*parts: int) -> int:
    """A 64-bit key from integers (seed, stream ids, epoch): SplitMix64 chained over the parts."""
    acc = np.zeros(1, dtype=np.uint64)
    for p in parts:
        acc = mix64(acc ^ np.uint64(int(p) & _M64))
    return int(acc[0])


class KeyedPermutation:
    """``perm(i)`` for ``i`` in ``[0, n)``: a bijection of ``[0, n)`` chosen by ``key``.

    ``perm(array)`` maps an integer array elementwise (returns ``int64``); ``perm(int)`` an int.
    """

    __slots__ = ("n", "key", "_half", "_mask", "_round_keys")

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got {n}")
        self.n, self.key = int(n), int(key) & _M64
        bits = max(2, (self.n - 1).bit_length())
        self._half = np.uint64((bits + 1) // 2)
        self._mask = np.uint64((1 << int(self._half)) - 1)
        self._round_keys = [np.uint64(derive_key(self.key, r)) for r in range(ROUNDS)]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for k in self._round_keys:
            left, right = right, left ^ (mix64(right ^ k) & self._mask)
        return (left << self._half) | right

    def _feistel_inverse(self, y: np.ndarray) -> np.ndarray:
        left, right = y >> self._half, y & self._mask
        for k in reversed(self._round_keys):
            left, right = right ^ (mix64(left ^ k) & self._mask), left
        return (left << self._half) | right

    @overload
    def inverse(self, j: int | np.integer) -> int: ...
    @overload
    def inverse(self, j: np.ndarray | Sequence[int]) -> np.ndarray: ...
    def inverse(self, j: int | np.integer | np.ndarray | Sequence[int]) -> int | np.ndarray:
        """The position ``i`` with ``perm(i) == j`` (same shapes and cost as ``perm``): the Feistel
        rounds backwards, cycle walking backwards (a walk from ``j`` meets no other image in ``[0, n)``)."""
        return self._walk(j, self._feistel_inverse)

    @overload
    def __call__(self, i: int | np.integer) -> int: ...
    @overload
    def __call__(self, i: np.ndarray | Sequence[int]) -> np.ndarray: ...
    def __call__(self, i: int | np.integer | np.ndarray | Sequence[int]) -> int | np.ndarray:
        return self._walk(i, self._feistel)

    def _walk(self, i, rounds):
        scalar = np.isscalar(i)
        x = np.atleast_1d(np.asarray(i, dtype=np.int64))
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"position out of [0, {self.n})")
        y = rounds(x.astype(np.uint64))
        out = y >= np.uint64(self.n)
        while out.any():
            y[out] = rounds(y[out])
            out = y >= np.uint64(self.n)
        y = y.astype(np.int64)
        return int(y[0]) if scalar else y.reshape(np.shape(i))
