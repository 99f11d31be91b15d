"""Small parallel work on one thread.

fedcf's OpenMP threads wait passively (``_numba_cache._passive_threads``): between parallel
kernels they sleep, and waking a sleeping thread costs about 50 µs per parallel region on this
machine's virtual CPUs (measured: a 100-task region after a 0.5 ms gap took 68 µs on two
sleeping threads against 25 µs on two spinning ones). A round of a federated fit runs a few
small kernels beside its one large client kernel (the finite check of the uploads, the sums
per item, the server step over the touched rows); with too little work for a second thread
to repay that wake-up they run on the calling thread, which wakes no one. Every such kernel
computes each row on its own, so its result does not depend on the thread count.
"""

from __future__ import annotations

import numba

SERIAL_BELOW = 1 << 19  # values a small kernel touches: below this, one thread


def small(kernel, work: int, *args):
    """``kernel(*args)``, on the calling thread alone when ``work`` (the values it touches) is
    below ``SERIAL_BELOW``."""
    threads = numba.get_num_threads()
    if work >= SERIAL_BELOW or threads == 1:
        return kernel(*args)
    numba.set_num_threads(1)
    try:
        return kernel(*args)
    finally:
        numba.set_num_threads(threads)
