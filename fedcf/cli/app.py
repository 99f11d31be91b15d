"""The command line's parser and dispatch (``fedcf.cli.main`` loads this after it has
installed its Ctrl-C handling)."""

from __future__ import annotations

import argparse
import sys

from . import benchmark, compile, data, evaluate, plot, recommend, train
from .common import USER_ERRORS, UsageError, _Parser, read_table
from .plot import plot_history
from .train import build_estimator

__all__ = ["build_estimator", "build_parser", "main", "plot_history", "read_table", "UsageError"]
DESCRIPTION = ("The ``fedcf`` command line: train, evaluate, recommend, benchmark, data, plot, "
               "compile.")

COMMANDS = {"train": train.cmd_train, "evaluate": evaluate.cmd_evaluate,
            "recommend": recommend.cmd_recommend, "benchmark": benchmark.cmd_benchmark,
            "data": data.cmd_data, "plot": plot.cmd_plot, "compile": compile.cmd_compile}


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="fedcf", description=DESCRIPTION)
    ap.add_argument("--version", action="version", version=f"fedcf {_version()}")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bars or notes")
    sub_add = sub.add_parser
    sub.add_parser = lambda *a, **kw: sub_add(*a, parents=[common], **kw)
    for module in (train, evaluate, recommend, benchmark, data, compile, plot):
        module.add_parser(sub)
    return ap


def _version() -> str:
    from .. import __version__

    return __version__


def main(argv=None) -> int:
    """Entry point of the ``fedcf`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except (UsageError, *USER_ERRORS) as exc:
        msg = str(exc.args[0]) if exc.args else type(exc).__name__
        print(f"fedcf {args.command}: error: {' '.join(msg.split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fedcf {args.command}: interrupted; no output file was left half-written",
              file=sys.stderr)
        return 130
    return 0
