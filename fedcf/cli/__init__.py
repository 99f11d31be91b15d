"""The ``fedcf`` command line: train, evaluate, recommend, benchmark, data, plot, compile.

Every command has ``--help``. Bad input (a missing file, a wrong column, an unknown model, a bad
value) prints one line on stderr and exits with code 2; output files are written atomically, so
an interrupted or failed command never leaves half a file. Ctrl-C at any moment, also while the
libraries load, exits with code 130 and one line.
"""

from __future__ import annotations

import os
import sys

__all__ = ["build_estimator", "build_parser", "main", "plot_history", "read_table", "UsageError"]


def main(argv=None) -> int:
    """Entry point of the ``fedcf`` console script; returns the exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:  # no heavy import for this one
        from .. import __version__

        print(f"fedcf {__version__}")
        return 0
    pending = _interrupt_twice() if argv is None else []
    try:
        from .app import main as run

        code = run(args)
    except BaseException as exc:  # noqa: BLE001 - re-raised unless it is an interrupt
        if not interrupted(exc):
            raise
        print("fedcf: interrupted; no output file was left half-written", file=sys.stderr)
        code = 130
    finally:
        for timer in pending:
            timer.cancel()
    if argv is None and code == 130:
        _exit_interrupted()
    return code


def run_script(main, name: str, strict: bool = False) -> None:
    """Run a benchmark script's ``main()`` and exit: with ``strict``, 1 when it returns a false
    value, else 0; on Ctrl-C, one line on stderr and exit code 130 (result files are written
    atomically, so none is left half-written)."""
    pending = _interrupt_twice()
    try:
        result = main()
    except BaseException as exc:  # noqa: BLE001 - re-raised unless it is an interrupt
        if not interrupted(exc):
            raise
        print(f"{name}: interrupted; no result file was left half-written", file=sys.stderr)
        _exit_interrupted()
    finally:
        for timer in pending:
            timer.cancel()
    sys.exit(1 if strict and not result else 0)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C, or an error it caused: an interrupt that lands while a
    library defines a class reaches us wrapped ("RuntimeError: Error calling __set_name__",
    the KeyboardInterrupt as its cause)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _exit_interrupted():
    """The console script after an interrupt: exit now with 130. A second SIGINT already on
    its way (``_interrupt_twice``'s, or the user's) is ignored — at interpreter shutdown it
    would turn the exit into a death by SIGINT — and so is an interrupt that landed in a
    library's import and would otherwise resurface during the cleanup."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def _interrupt_twice() -> list:
    """Ctrl-C as a KeyboardInterrupt that cannot be lost: an interrupt that lands in a ctypes
    callback (Numba compiling a kernel) is printed as "ignored" and the work goes on, so the
    handler also sends the process a second SIGINT a few seconds later, cancelled once the
    first has reached ``main``. Returns the list that will hold the pending timer."""
    import signal
    import threading

    pending: list = []

    def handler(signum, frame):
        if not pending:
            timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
            timer.daemon = True
            timer.start()
            pending.append(timer)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    return pending


# public name -> the module that defines it (loaded on first use)
_HOMES = {"build_estimator": "train", "build_parser": "app", "plot_history": "plot",
          "read_table": "common", "UsageError": "common"}


def __getattr__(name: str):
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'fedcf.cli' has no attribute {name!r}")
