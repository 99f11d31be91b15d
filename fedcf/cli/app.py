"""The command line's parser and dispatch (``fedcf.cli.main`` loads this after it has
installed its Ctrl-C handling)."""

from __future__ import annotations

import argparse
import importlib
import sys

from .common import SUMMARY, UsageError, _Parser, user_errors, with_lines

__all__ = ["build_parser", "main"]
DESCRIPTION = ("The ``fedcf`` command line: train, evaluate, recommend, benchmark, data, plot, "
               "compile.")
# command -> its module in fedcf.cli (add_parser, cmd_<command>); a module loads only when its
# command runs or its --help is asked for, so `fedcf --help` and `fedcf X --help` stay light
ORDER = ("train", "evaluate", "recommend", "benchmark", "data", "compile", "plot")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command's own options, or with ``only`` those of that
    command alone (the others are listed with their summary)."""
    ap = _Parser(prog="fedcf", description=DESCRIPTION)
    ap.add_argument("--version", action="version", version=f"fedcf {_version()}")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bars or notes")
    sub_add = sub.add_parser
    sub.add_parser = lambda *a, **kw: sub_add(*a, parents=[common], **kw)
    for name in ORDER:
        if only is None or name == only:
            _module(name).add_parser(sub)
        else:
            sub.add_parser(name, help=SUMMARY[name], add_help=False)
    return ap


def _module(name: str):
    return importlib.import_module(f"{__package__}.{name}")


def _command(argv) -> str:
    """The command named on the command line ("" when none is)."""
    return next((a for a in argv if a in SUMMARY), "")


def _version() -> str:
    from .. import __version__

    return __version__


def _with_flag(parser, args, argv, msg: str) -> str:
    """The message with the flag a command-line user typed in front, when it names a Python
    parameter that flag set (``test_size must be …`` → ``--test-size 1.5: test_size must be
    …``; ``--factors`` sets ``n_factors``)."""
    import re

    from .common import SHORTCUTS

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = sub.choices[args.command]._actions
    for action in actions:  # "pass duplicates='last'" → "pass --duplicates last"
        if action.option_strings:
            msg = re.sub(rf"(?<![\w-]){re.escape(action.dest)}='?([\w.-]+)'?",
                         rf"{action.option_strings[-1]} \1", msg)
    for item in getattr(args, "set", None) or []:  # "--set n_factors=abc: n_factors must"
        key = item.partition("=")[0]
        named = re.search(rf"(?<![\w-]){re.escape(key)}(=| must\b)", msg)
        if named and item not in msg and "--set" not in msg:
            return f"--set {item}: {msg}"
    for action in actions:
        flags = [f for f in action.option_strings if f in argv]
        if not flags or flags[0] in msg:
            continue
        names = {action.dest, SHORTCUTS.get(action.dest, action.dest)}
        if any(re.search(rf"(?<![\w-]){re.escape(n)}(=| must\b)", msg) for n in names):
            i = argv.index(flags[0])
            value = argv[i + 1] if action.nargs is None and i + 1 < len(argv) else ""
            return f"{flags[0]} {value}".strip() + f": {msg}"
    return msg


def main(argv=None) -> int:
    """Entry point of the ``fedcf`` console script; returns the exit code."""
    argv = list(argv)
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    try:
        getattr(_module(args.command), f"cmd_{args.command}")(args)
    except KeyboardInterrupt:  # first: an interrupt during an import leaves that import broken,
        print(f"fedcf {args.command}: interrupted; no output file was left half-written",
              file=sys.stderr)  # and user_errors() below imports
        return 130
    except (UsageError, *user_errors()) as exc:
        msg = " ".join((str(exc) if isinstance(exc, OSError) and exc.filename else
                        str(exc.args[0]) if exc.args else type(exc).__name__).split())
        msg = with_lines(_with_flag(parser, args, argv, msg), getattr(args, "tables_read", []))
        print(f"fedcf {args.command}: error: {msg}", file=sys.stderr)
        return 2
    return 0
