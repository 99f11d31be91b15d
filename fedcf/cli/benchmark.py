"""fedcf benchmark: run a benchmark script's job with its flags."""

from __future__ import annotations

import argparse
import importlib

from .common import SUMMARY, UsageError, _Parser

BENCHMARKS = {"movielens": "movielens_benchmark", "speed": "bench", "ctr": "ctr_simulation",
              "implicit": "implicit_benchmark", "privacy": "privacy_benchmark",
              "scale": "fedrecon_scale", "hyper": "hypergradient_benchmark", "ope": "ope_study"}


def cmd_benchmark(args):
    try:
        module = importlib.import_module(f"fedcf.benchmarks.{BENCHMARKS[args.name]}")
    except ModuleNotFoundError as exc:
        raise UsageError(f"the benchmark scripts are not installed with this fedcf ({exc}); run "
                         "them from a source checkout: python scripts/<name>.py") from exc
    rest = list(args.args)
    if args.quiet and "--no-progress" not in rest and args.name in ("movielens",):
        rest.append("--no-progress")
    script_error = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _Parser.error  # the script's usage errors in one line too
    try:
        module.main(rest)
    except SystemExit as exc:
        if exc.code == 2:  # the script's usage error, already reported in one line
            raise
        if exc.code not in (None, 0):
            raise UsageError(str(exc.code) if not isinstance(exc.code, int)
                             else f"the {args.name} benchmark stopped with code {exc.code}"
                             ) from None
    finally:
        argparse.ArgumentParser.error = script_error


def add_parser(sub):
    b = sub.add_parser("benchmark", help=SUMMARY["benchmark"],
                       description="Runs scripts/<name>.py's main with the remaining flags "
                       "(see fedcf benchmark NAME --help).")
    b.add_argument("name", choices=sorted(BENCHMARKS))
    b.add_argument("args", nargs=argparse.REMAINDER)
    return b
