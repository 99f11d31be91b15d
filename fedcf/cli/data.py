"""fedcf data: the dataset cache (fetch, verify, where) and train/test splits."""

from __future__ import annotations

import json

from .common import SUMMARY, UsageError, _data_options, _read, _say, output_path


def cmd_split(args):
    """Two CSV files from one ratings file: held-out users (``--by users``, for ReconEval) or
    each user's held-out rows (``--by rows``, random or latest by time, for StandardEval)."""
    from ..datasets import atomic_write
    from ..model_selection import PerUserSplit, UserShuffleSplit

    if args.data is None or args.train is None or args.test is None:
        raise UsageError("data split needs --data FILE --train OUT --test OUT")
    outs = [output_path(args.train, "--train"), output_path(args.test, "--test")]
    if outs[0].resolve() == outs[1].resolve():
        raise UsageError(f"--train and --test are the same file {args.train!r}; name two files")
    df = _read(args, args.data)
    cv = UserShuffleSplit(1, test_size=args.test_size, random_state=args.seed) \
        if args.by == "users" else \
        PerUserSplit(1, test_size=args.test_size, order=args.order, random_state=args.seed)
    train_idx, test_idx = next(cv.split(df))
    for path, idx in zip(outs, (train_idx, test_idx)):
        atomic_write(path, lambda fh, idx=idx: df.iloc[idx].to_csv(fh, index=False))
    _say(args, f"wrote {args.train} ({len(train_idx)} rows) and {args.test} ({len(test_idx)} "
               f"rows, {df.iloc[test_idx]['user'].nunique()} users)")


def cmd_data(args):
    from ..datasets import VARIANTS, data_home, fetch_movielens, import_movielens, verify_movielens

    home = data_home(args.data_home)
    if args.action == "split":
        return cmd_split(args)
    if args.action == "where":
        print(home)
        for variant in VARIANTS:
            folder = home / "movielens" / variant
            files = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
            print(f"  movielens {variant}: {', '.join(files) if files else '(not cached)'}")
        return
    variant = args.variant
    if args.action == "fetch":
        if args.path is not None:
            path = import_movielens(variant, args.path, data_home_dir=home)
        else:
            path = fetch_movielens(variant, data_home_dir=home, download=not args.no_download)
        print(path)
        return
    info = verify_movielens(variant, data_home_dir=home)
    print(json.dumps(info) if args.json else
          f"ok: {info['path']}\n  sha256 {info['sha256']}\n  {info['ratings']} ratings, "
          f"{info['users']} users, {info['items']} items")


def add_parser(sub):
    from ..datasets import VARIANTS  # the data command's own parser: loads the data layer

    d = sub.add_parser("data", help=SUMMARY["data"],
                       description="fetch: put MovieLens in the cache (--path: from a local copy, "
                       "no network); verify: check the cached copy's shape and checksum; where: "
                       "list the cache; split: write train/test CSVs of a ratings file.")
    d.add_argument("action", choices=("fetch", "verify", "where", "split"))
    d.add_argument("variant", nargs="?", default="100k", choices=VARIANTS)
    d.add_argument("--path", help="(fetch) a local copy to put into the cache: no download")
    d.add_argument("--no-download", action="store_true")
    d.add_argument("--data-home", help="cache root (default $FEDCF_DATA or ~/.cache/fedcf)")
    d.add_argument("--json", action="store_true")
    g = d.add_argument_group("split")
    g.add_argument("--data", help="ratings file to split")
    g.add_argument("--by", choices=("users", "rows"), default="users",
                   help="hold out whole users (ReconEval) or part of each user's rows")
    g.add_argument("--order", choices=("random", "time"), default="random",
                   help="(--by rows) which rows: random, or each user's latest")
    g.add_argument("--test-size", type=float, default=0.1)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--train", help="output CSV of the training part")
    g.add_argument("--test", help="output CSV of the held-out part")
    _data_options(d)
    return d
