"""The masks of secure aggregation: the PRG that expands a mask key into uint32 words
(AES-128-CTR from ``cryptography``) and the in-place addition of masks modulo 2³², on threads
(the expansion and the additions release Python's lock)."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


@functools.lru_cache(maxsize=2)
def _zeros(n_bytes: int) -> bytes:
    return bytes(n_bytes)


def prg(seed_key: bytes, size: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """``size`` uint32 words of the AES-128-CTR keystream (counter block 0 upward) keyed by the
    first 16 bytes of a derived key, written straight into the array's memory (the keystream
    of zeros, with no copy). AES-CTR is the PRG Bonawitz et al.'s implementations use; with
    AES-NI it expands faster than ChaCha20 (measured side by side on this project's machine).
    ``scratch`` (from ``prg_scratch(size)``) is written and returned instead of a new array: a
    client that expands one mask per peer reuses one buffer."""
    enc = Cipher(algorithms.AES(seed_key[:16]), modes.CTR(b"\0" * 16)).encryptor()
    out = prg_scratch(size) if scratch is None else scratch
    enc.update_into(_zeros(4 * size), memoryview(out).cast("B"))
    return out[:size]


def prg_scratch(size: int) -> np.ndarray:
    return np.empty(size + 16, np.dtype("<u4"))  # update_into wants block_size − 1 spare bytes


def add_mask(total: np.ndarray, seed_key: bytes, sign: int, scratch: np.ndarray) -> None:
    """total ± PRG(seed_key) (mod 2³²) in place, the keystream expanded into ``scratch``."""
    (np.add if sign > 0 else np.subtract)(total, prg(seed_key, len(total), scratch), out=total)


def add_masks(total: np.ndarray, masks: list, threads: int = 1) -> None:
    """total + Σ sign · PRG(key) (mod 2³²) in place over ``masks`` [(key, ±1)], the expansions
    spread over ``threads`` threads (AES-CTR and the additions release the GIL), each into its
    own sum: addition modulo 2³² is exact in any order, so the result is the same."""
    groups = [masks[j::threads] for j in range(min(threads, len(masks)))] or [[]]

    def run(group, acc):
        scratch = prg_scratch(len(total))
        for key, sign in group:
            add_mask(acc, key, sign, scratch)
        return acc

    if len(groups) == 1:
        run(groups[0], total)
        return
    with ThreadPoolExecutor(len(groups)) as pool:
        sums = list(pool.map(run, groups, [total] + [np.zeros_like(total) for _ in groups[1:]]))
    for acc in sums[1:]:
        total += acc


def pack_words(y: np.ndarray, word_bytes: np.ndarray) -> np.ndarray:
    """A masked vector as it travels: the low ``word_bytes[j]`` bytes of each word y_j
    (little-endian), concatenated. The sum modulo 2^(8b) of words reduced modulo 2^(8b) is the
    sum modulo 2³² reduced, so the server loses nothing it needs; the dropped high bytes are
    mask bits (uniform, like the rest)."""
    words = np.ascontiguousarray(y, np.dtype("<u4")).view(np.uint8).reshape(-1, 4)
    return words[np.arange(4) < np.asarray(word_bytes)[:, None]]


def unpack_words(data: np.ndarray, word_bytes: np.ndarray) -> np.ndarray:
    """The uint32 words of ``pack_words`` (each below 2^(8b)); a ValueError when ``data`` is
    not exactly Σ word_bytes bytes."""
    keep = np.arange(4) < np.asarray(word_bytes)[:, None]
    data = np.asarray(data, np.uint8).ravel()
    if data.size != int(keep.sum()):
        raise ValueError(f"a packed masked vector must have {int(keep.sum())} bytes, got "
                         f"{data.size}")
    words = np.zeros(keep.shape, np.uint8)
    words[keep] = data
    return words.view(np.dtype("<u4")).ravel().astype(np.uint32)
