"""Small Numba helpers shared by the client and server kernels (leaf functions, no prange).

Numba note: with numba 0.68.1, some plain stores inside a ``prange`` body into arrays unpacked
from a tuple argument were lost, and a store of an integer-derived value was dropped by the parfor
pass even with indexed access. Kernels therefore take tuple members by index and write such values
through ``store`` (a store inside a called function is kept). tests/test_kernels.py pins the
affected outputs.

Compile time: a ``prange`` body is typed twice, with an int64 loop index and again with a uint64
one in the parallel function, so a helper that receives the raw index is compiled twice. Kernels
pass ``np.int64(k)`` instead.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .rng import shuffle_inplace


@njit(cache=True)
def store(arr, k, value):
    """arr[k] = value, through a call (see the module docstring)."""
    arr[k] = value


@njit(cache=True)
def chunk_span(ptr, ch, size, n):
    """Rows [lo, hi) of chunk ``ch`` (``size`` rows per chunk, n rows in all) of a CSR-style
    pointer array, and the longest row among them (at least 1): a prange chunk's scratch size."""
    lo, hi = ch * size, min(n, (ch + 1) * size)
    longest = 1
    for r in range(lo, hi):
        longest = max(longest, ptr[r + 1] - ptr[r])
    return lo, hi, longest


CLIENT_FIXED_COST = 16.0  # a client's work beyond its ratings, in ratings (load balance only)
# ``for _ in prange(QUEUE_WORKERS)`` around a ``take`` loop: each thread's first worker drains
# the shared queue beside the others (any thread count up to this), the rest find it empty
QUEUE_WORKERS = 64


@intrinsic
def claim(typingctx, counter):
    """counter[0] += 1 as one atomic step; returns the value before (a shared work queue for
    the threads of a ``prange``: each value is handed out exactly once)."""
    sig = types.int64(counter)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, signature.args[0], ary,
                                       [context.get_constant(types.intp, 0)])
        return builder.atomic_rmw("add", ptr, context.get_constant(types.int64, 1), "monotonic")

    if not (isinstance(counter, types.Array) and counter.dtype == types.int64):
        raise TypeError("claim needs an int64 array")
    return sig, codegen


PREFETCH_LINES = 4  # cache lines of a row ``prefetch_row`` asks for, at most


@intrinsic
def prefetch_row(typingctx, arr, row):
    """Ask the CPU to start loading row ``row`` of the C-contiguous 2-d ``arr`` into cache: the
    PREFETCH_LINES cache lines from its start (all of a K = 50 float32 row, which may straddle
    one line more than its 200 bytes fill). A hint: no effect on any value, and no fault even past
    the array's end; the caller passes a valid row."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C"):
        raise TypeError("prefetch_row needs a C-contiguous 2-d array")
    sig = types.none(arr, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i64, i32 = ir.IntType(64), ir.IntType(32)
        row_bytes = builder.mul(builder.extract_value(ary.shape, 1),
                                ir.Constant(i64, context.get_abi_sizeof(
                                    context.get_value_type(arr.dtype))))
        byte_ptr = ir.IntType(8).as_pointer()
        start = builder.gep(builder.bitcast(ary.data, byte_ptr),
                            [builder.mul(context.cast(builder, args[1], signature.args[1],
                                                      types.int64), row_bytes)])
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        for k in range(PREFETCH_LINES):  # no branch: a prefetch past the row is harmless
            builder.call(fn, [builder.gep(start, [ir.Constant(i64, 64 * k)]), ir.Constant(i32, 0),
                              ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def client_queue(indptr, clients):
    """A work queue (see ``take``) of the positions of ``clients``, by decreasing work (row
    count plus CLIENT_FIXED_COST; ties by position), so that no thread is left with a large
    client at the end. Only the timing depends on the order."""
    cost = np.empty(clients.shape[0])
    for k in range(clients.shape[0]):
        cost[k] = indptr[clients[k] + 1] - indptr[clients[k]] + CLIENT_FIXED_COST
    queue = np.empty(clients.shape[0] + 1, np.int64)
    queue[0] = 0
    queue[1:] = np.argsort(-cost, kind="mergesort")
    return queue


@njit(cache=True)
def task_queue(n):
    """A work queue (see ``take``) of the tasks 0 … n − 1 in order."""
    queue = np.arange(-1, n)
    queue[0] = 0
    return queue


@njit(cache=True)
def take(queue):
    """The next task of a queue made by ``client_queue`` / ``task_queue`` (queue[0] counts
    what was handed out, atomically), or −1 when none is left. Threads of a ``prange`` over
    QUEUE_WORKERS call it in turn; each task goes to exactly one of them."""
    i = claim(queue)
    return queue[i + 1] if i + 1 < queue.shape[0] else np.int64(-1)


@njit(cache=True)
def write_outer(W, k, p, scale):
    """W[k] = scale · p pᵀ (through a call, see ``store``)."""
    K = p.shape[0]
    for a in range(K):
        for c in range(K):
            W[k, a, c] = scale * p[a] * p[c]


@njit(cache=True)
def processed_examples(n, bs, max_steps, epochs):
    """How many example visits ``minibatch_schedule`` makes (batches of bs, ≤ max_steps, ≤ epochs)."""
    if n == 0 or max_steps <= 0:
        return 0
    per_epoch = (n + bs - 1) // bs
    full_epochs = min(epochs, max_steps // per_epoch, (2**62) // max(n, 1))
    seen = full_epochs * n
    left_steps = max_steps - full_epochs * per_epoch
    if full_epochs < epochs and left_steps > 0:
        seen += min(n, left_steps * bs)
    return seen


@njit(cache=True)
def minibatch_schedule(n, bs, max_steps, epochs, state):
    """The visit order of k mini-batch steps over n examples: each epoch walks a fresh shuffle of
    0..n-1 (drawn from ``state``) in batches of ``bs``; stop after ``max_steps`` batches or
    ``epochs`` passes, whichever comes first (the TFF recipe "one epoch, at most 50 steps").

    Returns (visit, ends, steps): batch s covers visit[ends[s-1]:ends[s]] (ends[-1] = 0).
    An epoch that would start after the last step draws no shuffle.
    """
    seen = processed_examples(n, bs, max_steps, epochs)
    visit = np.empty(max(seen, 1), np.int64)
    ends = np.empty(max(seen, 1), np.int64)  # every step visits at least one example
    order = np.empty(max(n, 1), np.int64)
    v = 0
    steps = 0
    for _ in range(epochs):
        if steps >= max_steps or n == 0:
            break
        for t in range(n):
            order[t] = t
        shuffle_inplace(order[:n], state)
        for start in range(0, n, bs):
            if steps >= max_steps:
                break
            for t in range(start, min(n, start + bs)):
                visit[v] = order[t]
                v += 1
            ends[steps] = v
            steps += 1
    return visit, ends, steps


@njit(cache=True)
def gather_entries(items, values, s0, perm):
    """(items, values) of a client's examples ``perm`` (positions in its data, which starts at
    row s0)."""
    n = perm.shape[0]
    out_items = np.empty(n, items.dtype)
    out_vals = np.empty(n)
    for t in range(n):
        out_items[t] = items[s0 + perm[t]]
        out_vals[t] = values[s0 + perm[t]]
    return out_items, out_vals


@njit(cache=True)
def _sift_down(keys, order, root, end):
    """Restore the max-heap property of order[root:end] keyed by keys[order[.]]."""
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and keys[order[child]] < keys[order[child + 1]]:
            child += 1
        if not keys[order[root]] < keys[order[child]]:
            return
        order[root], order[child] = order[child], order[root]
        root = child


@njit(cache=True)
def argsort_heap(keys, order):
    """order[:n] = a permutation that sorts keys ascending (heap sort: O(n log n), no allocation,
    and a small fraction of the compile time of ``np.argsort``)."""
    n = keys.shape[0]
    for t in range(n):
        order[t] = t
    top = n - n  # the root, as a variable: a literal 0 argument would compile a second version
    for root in range(n // 2 - 1, -1, -1):
        _sift_down(keys, order, root, n)
    for end in range(n - 1, 0, -1):
        order[top], order[end] = order[end], order[top]
        _sift_down(keys, order, top, end)


@njit(cache=True)
def unique_rows(items, uniq, loc):
    """Dedupe one user's items: uniq[:m] sorted unique ids, loc[t] = row of items[t]. Returns m."""
    n = items.shape[0]
    if n == 0:
        return 0
    srt = np.empty(n, np.int64)
    argsort_heap(items, srt)
    m = 0
    for t in range(n):
        j = items[srt[t]]
        if m == 0 or uniq[m - 1] != j:
            uniq[m] = j
            m += 1
        loc[srt[t]] = m - 1
    return m
