"""fedcf compile: compile the Numba kernels into the cache ahead of use."""

from __future__ import annotations

import time

from .common import SUMMARY, UsageError, _say


def cmd_compile(args):
    from ..warmup import PATHS, cache_dir, compile_kernels

    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    t0 = time.perf_counter()
    try:
        seconds = compile_kernels(args.paths, n_jobs=args.jobs)
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    for path, sec in seconds.items():
        _say(args, f"{path:<20} {sec:6.1f} s")
    _say(args, f"{len(seconds)} of {len(PATHS)} paths in {time.perf_counter() - t0:.1f} s; "
         f"cache: {cache_dir()}")


def add_parser(sub):
    c = sub.add_parser("compile", help=SUMMARY["compile"],
                       description="Compiles the kernels of the named code paths into the Numba "
                       "cache, so later runs load them instead of compiling on first use.")
    c.add_argument("--paths", help="comma-separated path names (default: all)")
    c.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    return c
