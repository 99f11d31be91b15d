"""fedcf train: fit a model on a ratings file and save it."""

from __future__ import annotations

import json
import sys
import time

from .. import registry
from .common import (
    SHORTCUTS,
    SUMMARY,
    UsageError,
    _data_options,
    _pyplot,
    _read,
    _say,
    is_implicit,
    output_path,
)


def _parse_value(key: str, text: str):
    """A --set value: JSON (numbers, true/false, null, objects), Python's True/False/None, or
    else the text itself. A value that starts as a JSON object or list must be valid JSON."""
    for parse in (json.loads, {"True": True, "False": False, "None": None}.__getitem__):
        try:
            return parse(text)
        except json.JSONDecodeError as exc:
            if text.lstrip()[:1] in ("{", "["):
                raise UsageError(f"--set {key}={text}: not valid JSON ({exc.msg} at character "
                                 f"{exc.pos}); write a phase as a JSON object, e.g. "
                                 f"{key}='{{\"name\": \"...\"}}'") from None
        except (ValueError, KeyError):
            pass
    return text


def build_estimator(name: str, args):
    """The estimator ``name`` with the shortcut flags and ``--set key=value`` applied, its
    parameters checked before any data is read."""
    cls = registry.lookup("estimator", name)
    est = cls()
    params = {SHORTCUTS[k]: getattr(args, k) for k in SHORTCUTS if getattr(args, k) is not None}
    shortcut_of = {SHORTCUTS[k]: k for k in SHORTCUTS if getattr(args, k) is not None}
    for item in args.set or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--set takes key=value, got {item!r}")
        if key in shortcut_of:
            raise UsageError(f"--{shortcut_of[key]} and --set {key}=... both set {key}; give "
                             "one of them")
        value = _parse_value(key, value)
        params[key] = registry.from_spec(key, value) if key in registry.phase_kinds() else value
    for kind in registry.phase_kinds():  # a phase by name as its object: nested keys are valid
        value = est.get_params(deep=False).get(kind)
        if isinstance(value, str) and value != "auto":  # "auto" is resolved at fit
            est.set_params(**{kind: registry.lookup(kind, value)()})
    valid = est.get_params()
    for key in params:
        if key not in valid:
            raise UsageError(f"unknown hyperparameter {key!r} for {name}; it takes: "
                             f"{', '.join(sorted(valid))}")
    est.set_params(**params)
    if "verbose" in valid and "verbose" not in params:  # bars on a terminal only (not in logs)
        est.set_params(verbose=not args.quiet and sys.stderr.isatty())
    return est.check_params()


def _validation_callback(est, args):
    """Per-round ReconEval on held-out users (``--validation``), stored in ``history_``."""
    if args.validation is None:
        return None
    if "eval_every" not in est.get_params():
        raise UsageError(f"--validation evaluates during federated rounds; {args.model} is "
                         "trained centrally (evaluate it after training with fedcf evaluate)")
    from ..model_selection import recon_scorer

    val = _read(args, args.validation)
    metric = "ndcg@10" if is_implicit(est) else "rmse"
    scorer = recon_scorer(metric, random_state=0)
    if not est.eval_every:
        est.set_params(eval_every=max(est.n_rounds // 20, 1))

    def callback(model, round_):
        value = scorer(model, val)
        return {metric.replace("@", "_at_"): abs(value) if metric == "rmse" else value}

    return callback


def _note_first_compile(est, args) -> str | None:
    """Say so when this model's kernels are not in the cache yet: the first fit then compiles
    them before its first round, which would otherwise look like a hang. Returns the path to
    mark as compiled once the fit succeeds (None: already marked)."""
    from ..warmup import is_compiled, path_of

    path = path_of(est)
    if is_compiled(path):
        return None
    _say(args, f"note: compiling fedcf's kernels for this model first (once per machine and "
               f"fedcf version; `fedcf compile --paths {path}` does it ahead of time)")
    return path


def cmd_train(args):
    from ..datasets import DataValidationError
    from .plot import plot_history

    est = build_estimator(args.model, args)
    out = output_path(args.out, "--out")
    if out.suffix not in ("", ".npz"):
        raise UsageError(f"--out {str(out)!r}: a model is written as one .npz file; name it "
                         f"{str(out.with_suffix('.npz'))!r}")
    for param, flag in (("n_rounds", "--rounds"), ("n_epochs", "--epochs")):
        if est.get_params().get(param) == 0:
            raise UsageError(f"{flag} 0 (n_rounds/n_epochs=0) would write an untrained model; "
                             "give at least 1")
    if args.plot is not None:
        output_path(args.plot, "--plot")
        _pyplot()  # fail before training, not after
    df = _read(args, args.data)
    callback = _validation_callback(est, args)
    compiling = _note_first_compile(est, args)
    kwargs = {"callback": callback} if callback is not None else {}
    t0 = time.perf_counter()
    try:
        est.fit(df, duplicates=args.duplicates, **kwargs)
    except DataValidationError as exc:
        raise UsageError(f"{args.data}: {exc}") from None
    if compiling is not None:  # its kernels are in the cache now: no note next time
        from ..warmup import _mark

        _mark(compiling)
    path = est.save(out)
    _say(args, f"wrote {path}: {type(est).__name__}, {len(est.user_ids_)} users, "
               f"{len(est.item_ids_)} items, {time.perf_counter() - t0:.1f} s")
    if args.plot is not None:
        _say(args, f"wrote {plot_history(est, args.plot)}")


def add_parser(sub):
    p = sub.add_parser("train", help=SUMMARY["train"],
                       description="Train a model and save it as one .npz (atomically).")
    p.add_argument("--data", required=True, help="ratings file: CSV/TSV, u.data, ratings.dat, "
                   ".inter, a GroupLens zip or recbole wheel")
    p.add_argument("--model", required=True, choices=registry.names("estimator"))
    p.add_argument("--out", required=True, help="model file to write (.npz)")
    for flag, param in SHORTCUTS.items():
        p.add_argument(f"--{flag}", type=int, help=f"= --set {param}=N")
    p.add_argument("--set", nargs="+", action="extend", metavar="KEY=VALUE",
                   help="any hyperparameter, e.g. --set n_factors=20 biases=false "
                        "aggregator='{\"name\": \"median\"}' (a phase object as a JSON spec)")
    p.add_argument("--validation", help="held-out users' file: ReconEval every eval_every "
                   "rounds, stored in the history (federated models)")
    p.add_argument("--duplicates", choices=("error", "last", "mean"), default="error",
                   help="what to do with a repeated (user, item) pair")
    p.add_argument("--plot", metavar="PNG", help="also write the training-history plot")
    _data_options(p)
    return p
