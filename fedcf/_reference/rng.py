"""NumPy twins of ``fedcf._kernels.rng`` (random streams): slow, obvious, the tests' oracle."""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    z &= _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def stream_key(seed: int, a: int, b: int) -> int:
    k = mix64(seed + _GOLDEN)
    k = mix64(k + a + _GOLDEN)
    return mix64(k + b + _GOLDEN)


class Stream:
    """Python twin of a kernel random stream."""

    def __init__(self, seed: int):
        self.state = int(seed) & _MASK

    def next_u64(self) -> int:
        self.state = (self.state + _GOLDEN) & _MASK
        return mix64(self.state)

    def next_float(self) -> float:
        return float(self.next_u64() >> 11) * (1.0 / 9007199254740992.0)

    def next_below(self, n: int) -> int:
        return int(self.next_float() * n)

    def shuffle(self, arr: np.ndarray) -> None:
        for i in range(len(arr) - 1, 0, -1):
            j = self.next_below(i + 1)
            arr[i], arr[j] = arr[j], arr[i]


def as_stream(seed_or_stream) -> Stream:
    """A Stream from a seed, or the given Stream itself (to share one stream across phases)."""
    return seed_or_stream if isinstance(seed_or_stream, Stream) else Stream(seed_or_stream)
