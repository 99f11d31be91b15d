"""Counter-based random streams for kernels (splitmix64).

Every client derives its own stream from (seed, round, client id), so what a client draws does not
depend on which thread runs it or on how many threads there are. ``fedcf._reference`` holds a pure
Python twin of these functions that produces the same numbers.

A stream state is a one-element ``uint64`` array, mutated in place.
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


@njit(cache=True, inline="always")
def mix64(z):
    """The splitmix64 finalizer: a bijective 64-bit hash."""
    z = uint64(z)
    z = (z ^ (z >> uint64(30))) * _M1
    z = (z ^ (z >> uint64(27))) * _M2
    return z ^ (z >> uint64(31))


@njit(cache=True, inline="always")
def stream_key(seed, a, b):
    """Seed of the stream for (seed, a, b), e.g. (random_state, round, client id)."""
    k = mix64(uint64(seed) + GOLDEN)
    k = mix64(k + uint64(a) + GOLDEN)
    return mix64(k + uint64(b) + GOLDEN)


@njit(cache=True, inline="always")
def client_key(ids, u):
    """Seed of client row u's stream in a round: ``ids`` = [seed, round] keys row u by u
    itself (a population's dense ids); [seed, round, key_0, key_1, …] keys row u by key_u (a
    CSR of some users only — a Flower node's — whose streams are the population's)."""
    return stream_key(ids[0], ids[1], ids[2 + u] if ids.shape[0] > 2 else uint64(u))


@njit(cache=True, inline="always")
def next_u64(state):
    state[0] = state[0] + GOLDEN
    return mix64(state[0])


@njit(cache=True, inline="always")
def next_float(state):
    """Uniform in [0, 1) with 53 random bits."""
    return float(next_u64(state) >> uint64(11)) * _INV53


@njit(cache=True, inline="always")
def next_below(state, n):
    """Uniform integer in [0, n)."""
    return int(next_float(state) * n)


@njit(cache=True)
def shuffle_inplace(arr, state):
    """Fisher-Yates shuffle driven by the stream (same permutation as the Python twin)."""
    for i in range(arr.shape[0] - 1, 0, -1):
        j = next_below(state, i + 1)
        tmp = arr[i]
        arr[i] = arr[j]
        arr[j] = tmp


@njit(cache=True)
def stream_keys(seed, a, keys):
    """stream_key(seed, a, keys[r]) for every r (e.g. every user's inference stream)."""
    out = np.empty(keys.shape[0], np.uint64)
    for r in range(keys.shape[0]):
        out[r] = stream_key(seed, a, keys[r])
    return out
