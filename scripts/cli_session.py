#!/usr/bin/env python
"""Run the manual's command-line session for real and record each command with its output.

The `fedcf` console script is run in a fresh temporary folder on MovieLens-100K: fetch the data,
split off held-out users, train FedRecon, evaluate on the held-out users, recommend for a new user.
``scripts/report.py`` copies the recorded commands and outputs into docs/guide/cli.md.

    python scripts/cli_session.py --json eval/results/cli_session.json
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time

from fedcf.provenance import run_meta, write_json

SESSION = [
    "fedcf data fetch 100k",
    "fedcf data split --data {data} --by users --test-size 0.1 --train train.csv --test test.csv",
    "fedcf train --data train.csv --model fedrecon --rounds 500 --seed 0 --out model.npz",
    "fedcf evaluate --model model.npz --data test.csv",
    "fedcf recommend --model model.npz --items 50 181 258 --ratings 5 4 5 -n 5",
]


def run_session(fedcf: list[str], folder: str) -> list[dict]:
    """Each command of SESSION run in ``folder``; ``{data}`` is the path the fetch printed."""
    steps, data = [], None
    for line in SESSION:
        cmd = line.format(data=data or "")
        t0 = time.perf_counter()
        res = subprocess.run(fedcf + shlex.split(cmd)[1:], cwd=folder, capture_output=True,
                             text=True, timeout=1800)
        if res.returncode != 0:
            raise SystemExit(f"`{cmd}` failed ({res.returncode}): {res.stderr.strip()}")
        out = (res.stdout + res.stderr).strip("\n")
        if data is None:
            data = res.stdout.strip()
        shown = cmd.replace(data, "$(fedcf data fetch 100k)") if "{data}" in line else cmd
        steps.append({"command": shown, "output": out.replace(folder + os.sep, ""),
                      "seconds": time.perf_counter() - t0})
    return steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH", help="write the session here")
    ap.add_argument("--fedcf", default="fedcf",
                    help="how to call the CLI (default: the fedcf console script)")
    args = ap.parse_args(argv)
    meta = run_meta("cli_session.py", argv)
    fedcf = [sys.executable, "-m", "fedcf"] if args.fedcf == "module" else [args.fedcf]
    with tempfile.TemporaryDirectory() as folder:
        steps = run_session(fedcf, folder)
    for s in steps:
        print(f"$ {s['command']}\n{s['output']}\n")
    if args.json:
        write_json(args.json, {"meta": meta, "steps": steps})
        print(f"wrote {args.json}")
    return steps


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "cli_session.py")
