"""The ``fedcf`` command line: train, evaluate, recommend, benchmark, data, plot, compile.

Every command has ``--help``. Bad input (a missing file, a wrong column, an unknown model, a bad
value) prints one line on stderr and exits with code 2; output files are written atomically, so
an interrupted or failed command never leaves half a file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ._registry import ESTIMATORS, IMPLICIT, load_model
from .datasets import (
    VARIANTS,
    DataUnavailableError,
    DataValidationError,
    Interactions,
    data_home,
    fetch_movielens,
    import_movielens,
    load_movielens,
    verify_movielens,
)

BENCHMARKS = {"movielens": "movielens_benchmark", "speed": "bench", "ctr": "ctr_simulation",
              "implicit": "implicit_benchmark", "privacy": "privacy_benchmark",
              "scale": "fedrecon_scale", "hyper": "hypergradient_benchmark"}
USER_ERRORS = (ValueError, TypeError, KeyError, OSError, DataUnavailableError, MemoryError,
               FloatingPointError, ImportError)
# shortcut flag -> estimator parameter
SHORTCUTS = {"factors": "n_factors", "rounds": "n_rounds", "epochs": "n_epochs",
             "clients": "clients_per_round", "seed": "random_state"}
COLUMNS = {"user": ("user", "userId", "user_id", "userID"),
           "item": ("item", "movieId", "item_id", "itemId", "movie"),
           "rating": ("rating", "ratings", "score"), "timestamp": ("timestamp", "time", "ts")}


class UsageError(Exception):
    """A bad command line: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + message
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------- data files
def read_table(path, *, user_col=None, item_col=None, rating_col=None, time_col=None,
               sep=None) -> pd.DataFrame:
    """A ratings file as a DataFrame with user, item[, rating][, timestamp] columns.

    MovieLens/RecBole formats (u.data, ratings.dat, .inter, a GroupLens zip or recbole wheel, a
    folder) are detected; any other CSV/TSV with a header is read with the named columns (or
    the usual names: user/userId, item/movieId, rating, timestamp)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    named = any(c is not None for c in (user_col, item_col, rating_col, time_col, sep))
    if not named and (path.is_dir() or path.suffix in (".inter", ".data", ".dat", ".zip", ".whl")):
        return load_movielens(None, path=path, as_frame=True)
    if sep is None:
        with open(path, encoding="latin-1") as fh:
            first = fh.readline()
        sep = "\t" if path.suffix in (".tsv", ".tab") or "\t" in first else ","
    try:
        df = pd.read_csv(path, sep=sep)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataValidationError(f"{path}: cannot read it as a table: {exc}") from exc
    given = {"user": user_col, "item": item_col, "rating": rating_col, "timestamp": time_col}
    if rating_col == "none":  # implicit feedback from a file that has ratings: ignore them
        given["rating"] = None
        df = df.drop(columns=[c for c in COLUMNS["rating"] if c in df.columns])
    keep = {}
    for role, name in given.items():
        if name is not None and name not in df.columns:
            raise DataValidationError(f"{path}: column {name!r} (--{_flag(role)}) not found; its "
                                      f"columns are {list(df.columns)}")
        found = name or next((c for c in COLUMNS[role] if c in df.columns), None)
        if found is None and role in ("user", "item"):
            raise DataValidationError(f"{path}: no {role} column (looked for {COLUMNS[role]}); "
                                      f"its columns are {list(df.columns)}; name it with "
                                      f"--{_flag(role)}")
        if found is not None:
            keep[found] = role
    return df[list(keep)].rename(columns=keep)


def _flag(role: str) -> str:
    return {"timestamp": "time-col"}.get(role, f"{role}-col")


def _read(args, path) -> pd.DataFrame:
    return read_table(path, user_col=args.user_col, item_col=args.item_col,
                      rating_col=args.rating_col, time_col=args.time_col, sep=args.sep)


# ---------------------------------------------------------------------------- train
def _parse_value(text: str):
    for parse in (json.loads, {"True": True, "False": False, "None": None}.__getitem__):
        try:
            return parse(text)
        except (ValueError, KeyError):
            pass
    return text


def build_estimator(name: str, args):
    """The estimator ``name`` with the shortcut flags and ``--set key=value`` applied, its
    parameters checked before any data is read."""
    cls = ESTIMATORS[name]
    est = cls()
    params = {SHORTCUTS[k]: getattr(args, k) for k in SHORTCUTS if getattr(args, k) is not None}
    for item in args.set or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--set takes key=value, got {item!r}")
        params[key] = _parse_value(value)
    valid = est.get_params()
    for key in params:
        if key not in valid:
            raise UsageError(f"unknown hyperparameter {key!r} for {name}; it takes: "
                             f"{', '.join(sorted(valid))}")
    est.set_params(**params)
    if "verbose" in valid:  # progress bars on a terminal only (never in logs or pipes)
        est.set_params(verbose=not args.quiet and sys.stderr.isatty())
    est._check_params()
    return est


def _validation_callback(est, args):
    """Per-round ReconEval on held-out users (``--validation``), stored in ``history_``."""
    if args.validation is None:
        return None
    if "eval_every" not in est.get_params():
        raise UsageError(f"--validation evaluates during federated rounds; {args.model} is "
                         "trained centrally (evaluate it after training with fedcf evaluate)")
    from .model_selection import recon_scorer

    val = _read(args, args.validation)
    metric = "ndcg@10" if isinstance(est, IMPLICIT) else "rmse"
    scorer = recon_scorer(metric, random_state=0)
    if not est.eval_every:
        est.set_params(eval_every=max(est.n_rounds // 20, 1))

    def callback(model, round_):
        value = scorer(model, val)
        return {metric.replace("@", "_at_"): abs(value) if metric == "rmse" else value}

    return callback


def cmd_train(args):
    est = build_estimator(args.model, args)
    out = Path(args.out)
    if not out.parent.is_dir():
        raise UsageError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    if args.plot is not None:
        _pyplot()  # fail before training, not after
    df = _read(args, args.data)
    callback = _validation_callback(est, args)
    kwargs = {"callback": callback} if callback is not None else {}
    t0 = time.perf_counter()
    try:
        est.fit(df, duplicates=args.duplicates, **kwargs)
    except DataValidationError as exc:
        raise UsageError(f"{args.data}: {exc}") from None
    path = est.save(out)
    _say(args, f"wrote {path}: {type(est).__name__}, {len(est.user_ids_)} users, "
               f"{len(est.item_ids_)} items, {time.perf_counter() - t0:.1f} s")
    if args.plot is not None:
        _say(args, f"wrote {plot_history(est, args.plot)}")


def _say(args, text):
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


# ---------------------------------------------------------------------------- evaluate
def cmd_evaluate(args):
    model = load_model(args.model)
    test = _read(args, args.data)
    implicit = isinstance(model, IMPLICIT)
    if "rating" not in test.columns and not implicit:
        raise UsageError(f"{args.data}: a rating model is evaluated on ratings; the file has no "
                         "rating column (name it with --rating-col)")
    if args.protocol == "recon":
        result = _recon_metrics(model, test, args, implicit)
    else:
        result = _standard_metrics(model, test, args, implicit)
    result = {"protocol": args.protocol, "model": type(model).__name__, **result}
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>12}  {v:.4f}" if isinstance(v, float) else f"{k:>12}  {v}")


def _recon_metrics(model, test, args, implicit):
    from .model_selection import recon_scorer

    metrics = [f"{m}@{args.k}" for m in ("precision", "recall", "ndcg")] if implicit \
        else ["rmse", "mae", "accuracy"]
    out = {}
    for m in metrics:
        s = recon_scorer(m, support_fraction=args.support_fraction, random_state=args.seed)
        out[m] = abs(s(model, test)) if m in ("rmse", "mae") else s(model, test)
    out.update(users=int(test["user"].nunique()), rows=len(test))
    return out


def _standard_metrics(model, test, args, implicit):
    """Held-out rows of users the model knows: from its user rows, or reconstructed from their
    ``--history`` (what a FedRecon device does)."""
    from ._ranking import ranking_metrics
    from .eval import rating_metrics

    test_inter, P, c, seen = _standard_users(model, test, args)
    if implicit:
        res = ranking_metrics(lambda b: model.score_all_items(P[b], c[b]), seen, test_inter,
                              args.k, with_auc=False)
        out = {f"{m}@{args.k}": res[m] for m in ("precision", "recall", "ndcg")}
    else:
        pred = model.predict_entries(test_inter, P, c)
        out = rating_metrics(test_inter.values, pred, model.rating_scale_)
    out.update(users=test_inter.n_users, rows=test_inter.nnz)
    return out


def _standard_users(model, test, args):
    if getattr(model, "user_factors_", None) is not None:
        known = model._user_index(test["user"].unique())
        users = np.sort(known[known >= 0])
        P, c = model._user_params(users)
        seen = model._seen_interactions().subset_users(users) if isinstance(model, IMPLICIT) \
            else None
        user_ids = model.user_ids_[users]
    elif args.history is not None:
        hist = _read(args, args.history)
        hist = hist[model._item_index(hist["item"]) >= 0]
        user_ids = np.array(sorted(set(hist["user"]) & set(test["user"])), dtype=object)
        hist = hist[hist["user"].isin(user_ids)]
        seen = Interactions.from_pairs(hist[["user", "item"]], None, rating_col=None,
                                       user_catalog=user_ids, item_catalog=model.item_ids_,
                                       duplicates="last")
        hist_inter = Interactions.coerce(hist, user_catalog=user_ids, item_catalog=model.item_ids_,
                                         rating_col="rating" if "rating" in hist else None,
                                         duplicates="last")
        P, c = model.reconstruct_users(hist_inter)
    else:
        raise UsageError(f"{type(model).__name__} keeps no user data; --protocol standard needs "
                         "the users' training rows as --history FILE (or use --protocol recon)")
    test = test[test["user"].isin(set(user_ids))]
    if isinstance(model, IMPLICIT):
        test = test[model._item_index(test["item"]) >= 0]
    if len(test) == 0:
        raise UsageError("no test row belongs to a user the model knows (or has a --history)")
    test_inter = Interactions.coerce(
        test, user_catalog=user_ids, rating_col="rating" if "rating" in test else None,
        item_catalog=model.item_ids_ if isinstance(model, IMPLICIT) else None, duplicates="last")
    return test_inter, P, c, seen


# ---------------------------------------------------------------------------- recommend
def _as_model_ids(values, ids: np.ndarray, what: str) -> list:
    """Command-line strings as the model's raw ids (ints when its ids are ints)."""
    if ids.dtype.kind not in "iu":
        return list(values)
    try:
        return [int(v) for v in values]
    except ValueError as exc:
        raise UsageError(f"{what} ids of this model are integers; got {exc.args[0]}") from exc


def cmd_recommend(args):
    model = load_model(args.model)
    if (args.user is None) == (args.items is None):
        raise UsageError("pass either --items (a new user's history) or --user ID")
    if args.user is not None:
        user = _as_model_ids([args.user], model.user_ids_, "user")[0]
        recs = model.recommend(user=user, n=args.n, filter_seen=not args.keep_seen)
    else:
        items = _as_model_ids(args.items, model.item_ids_, "item")
        unknown = [i for i, k in zip(items, model._item_index(items)) if k < 0]
        if unknown:
            raise UsageError(f"item {unknown[0]!r} is not in this model's catalog "
                             f"({len(model.item_ids_)} items)")
        if args.ratings is None and not isinstance(model, IMPLICIT):
            raise UsageError("a rating model needs --ratings, one per item")
        if args.ratings is not None and len(args.ratings) != len(items):
            raise UsageError(f"--items has {len(items)} ids but --ratings has "
                             f"{len(args.ratings)} values")
        recs = model.recommend(items=items, ratings=args.ratings, n=args.n,
                               filter_seen=not args.keep_seen)
    recs.insert(0, "rank", np.arange(1, len(recs) + 1))
    if args.json:
        print(recs.to_json(orient="records"))
    else:
        print(recs.to_string(index=False, float_format=lambda v: f"{v:.4f}"))


# ---------------------------------------------------------------------------- benchmark, data
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


def cmd_compile(args):
    from ._numba_cache import cache_dir
    from ._warmup import PATHS, compile_kernels

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


def cmd_split(args):
    """Two CSV files from one ratings file: held-out users (``--by users``, for ReconEval) or
    each user's held-out rows (``--by rows``, random or latest by time, for StandardEval)."""
    from .datasets._files import atomic_write
    from .model_selection import PerUserSplit, UserShuffleSplit

    if args.data is None or args.train is None or args.test is None:
        raise UsageError("data split needs --data FILE --train OUT --test OUT")
    df = _read(args, args.data)
    cv = UserShuffleSplit(1, test_size=args.test_size, random_state=args.seed) \
        if args.by == "users" else \
        PerUserSplit(1, test_size=args.test_size, order=args.order, random_state=args.seed)
    train_idx, test_idx = next(cv.split(df))
    for path, idx in ((args.train, train_idx), (args.test, test_idx)):
        atomic_write(Path(path), lambda fh, idx=idx: df.iloc[idx].to_csv(fh, index=False))
    _say(args, f"wrote {args.train} ({len(train_idx)} rows) and {args.test} ({len(test_idx)} "
               f"rows, {df.iloc[test_idx]['user'].nunique()} users)")


def cmd_data(args):
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


# ---------------------------------------------------------------------------- plot
def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError("plots need matplotlib: pip install 'fedcf[plot]'") from exc
    return plt


def plot_history(model, out) -> Path:
    """PNG of a model's ``history_``: loss (and per-round evaluation) per round, clients used and
    dropped, values uploaded, learned hyperparameters if any; a centralized model's training
    RMSE per epoch."""
    from .datasets._files import atomic_write

    plt = _pyplot()
    hist = pd.DataFrame(getattr(model, "history_", []) or [])
    if hist.empty:
        raise UsageError("the model has no training history to plot")
    if "round" not in hist:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        col = "train_rmse" if "train_rmse" in hist else "seconds"
        ax.plot(hist["epoch"] + 1, hist[col], marker="o")
        ax.set(xlabel="epoch", ylabel=col.replace("_", " "), title=type(model).__name__)
    else:
        learned = [c for c in ("server_learning_rate", "momentum", "weight_exponent")
                   if c in hist]
        fig, axes = plt.subplots(1, 3 + bool(learned), figsize=(13 + 4 * bool(learned), 3.5))
        x = hist["round"] + 1
        for col in learned:
            axes[3].plot(x, hist[col], lw=1, label=col.replace("_", " "))
        if learned:
            axes[3].set(xlabel="round", title="learned hyperparameters", yscale="log"
                        if "weight_exponent" not in learned else "linear")
            axes[3].legend()
        axes[0].plot(x, hist["loss"], lw=1, label="client query loss (MSE)")
        if "eval" in hist:
            ev = pd.DataFrame([e if isinstance(e, dict) else {} for e in hist["eval"]], index=x)
            for col in ev.columns:
                axes[0].plot(ev[col].dropna(), marker="o", label=f"validation {col}")
        axes[0].set(xlabel="round", title="loss and evaluation")
        axes[0].legend()
        axes[1].plot(x, hist["clients_used"], lw=1, label="used")
        axes[1].plot(x, hist["clients_dropped"], lw=1, label="dropped")
        axes[1].set(xlabel="round", title="clients per round")
        axes[1].legend()
        axes[2].plot(x, hist["values_up"], lw=1)
        axes[2].set(xlabel="round", title="values uploaded per round")
    fig.tight_layout()
    path = atomic_write(Path(out), lambda fh: fig.savefig(fh, format="png", dpi=110))
    plt.close(fig)
    return path


def cmd_plot(args):
    model = load_model(args.model)
    out = args.out or str(Path(args.model).with_suffix("")) + "_history.png"
    print(plot_history(model, out))


# ---------------------------------------------------------------------------- parser
def _data_options(p):
    g = p.add_argument_group("data file columns (MovieLens/RecBole formats are detected)")
    g.add_argument("--user-col", help="user column of a CSV/TSV (default: user, userId, ...)")
    g.add_argument("--item-col", help="item column (default: item, movieId, ...)")
    g.add_argument("--rating-col", help="rating column (default: rating); 'none' ignores "
                   "the ratings (implicit feedback, strength 1 per row)")
    g.add_argument("--time-col", help="timestamp column (default: timestamp, if present)")
    g.add_argument("--sep", help="field separator (default: tab for .tsv or tabbed files, else ,)")


def _train_parser(sub):
    p = sub.add_parser("train", help="train a model on a ratings file and save it",
                       description="Train a model and save it as one .npz (atomically).")
    p.add_argument("--data", required=True, help="ratings file: CSV/TSV, u.data, ratings.dat, "
                   ".inter, a GroupLens zip or recbole wheel")
    p.add_argument("--model", required=True, choices=sorted(ESTIMATORS))
    p.add_argument("--out", required=True, help="model file to write (.npz)")
    for flag, param in SHORTCUTS.items():
        p.add_argument(f"--{flag}", type=int, help=f"= --set {param}=N")
    p.add_argument("--set", nargs="+", action="extend", metavar="KEY=VALUE",
                   help="any hyperparameter, e.g. --set learning_rate=0.5 biases=false")
    p.add_argument("--validation", help="held-out users' file: ReconEval every eval_every "
                   "rounds, stored in the history (federated models)")
    p.add_argument("--duplicates", choices=("error", "last", "mean"), default="error",
                   help="what to do with a repeated (user, item) pair")
    p.add_argument("--plot", metavar="PNG", help="also write the training-history plot")
    _data_options(p)
    return p


def _evaluate_parser(sub):
    p = sub.add_parser("evaluate", help="score a saved model on held-out data",
                       description="recon: every user of --data is reconstructed from a support "
                       "part of their rows and scored on the rest (unseen users). standard: "
                       "held-out rows of users the model knows (from its user rows, or "
                       "reconstructed from --history).")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--protocol", choices=("recon", "standard"), default="recon")
    p.add_argument("--history", help="(standard) the users' training rows, for models that keep "
                   "no user data")
    p.add_argument("--support-fraction", type=float, default=0.5)
    p.add_argument("-k", "--k", type=int, default=10, help="cut-off of ranking metrics")
    p.add_argument("--seed", type=int, default=0, help="seed of the support/query split")
    p.add_argument("--json", action="store_true")
    _data_options(p)


def _recommend_parser(sub):
    p = sub.add_parser("recommend", help="top-n items for a new user's history or a known user",
                       description="A new user (--items, --ratings) is reconstructed on the fly "
                       "and never stored.")
    p.add_argument("--model", required=True)
    p.add_argument("--items", nargs="+", help="item ids the user rated / interacted with")
    p.add_argument("--ratings", nargs="+", type=float, help="one rating per item")
    p.add_argument("--user", help="a user id seen in training (models that keep user rows)")
    p.add_argument("-n", type=int, default=10)
    p.add_argument("--keep-seen", action="store_true", help="do not filter the user's items")
    p.add_argument("--json", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="fedcf", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", action="version", version=f"fedcf {_version()}")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = _Parser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bars or notes")
    sub_add = sub.add_parser
    sub.add_parser = lambda *a, **kw: sub_add(*a, parents=[common], **kw)
    _train_parser(sub)
    _evaluate_parser(sub)
    _recommend_parser(sub)
    b = sub.add_parser("benchmark", help="run a benchmark script's job with its flags",
                       description="Runs scripts/<name>.py's main with the remaining flags "
                       "(see fedcf benchmark NAME --help).")
    b.add_argument("name", choices=sorted(BENCHMARKS))
    b.add_argument("args", nargs=argparse.REMAINDER)
    d = sub.add_parser("data", help="the dataset cache (fetch, verify, where) and splits",
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
    c = sub.add_parser("compile", help="compile the Numba kernels now (e.g. after installing)",
                       description="Compiles the kernels of the named code paths into the Numba "
                       "cache, so later runs load them instead of compiling on first use.")
    c.add_argument("--paths", help="comma-separated path names (default: all)")
    c.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p = sub.add_parser("plot", help="plot a saved model's training history")
    p.add_argument("what", choices=("history",))
    p.add_argument("model")
    p.add_argument("--out", help="PNG path (default: <model>_history.png)")
    return ap


def _version() -> str:
    from . import __version__

    return __version__


COMMANDS = {"train": cmd_train, "evaluate": cmd_evaluate, "recommend": cmd_recommend,
            "benchmark": cmd_benchmark, "data": cmd_data, "plot": cmd_plot,
            "compile": cmd_compile}


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
