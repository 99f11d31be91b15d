"""fedcf evaluate: score a saved model on held-out users or rows."""

from __future__ import annotations

import json

from .common import SUMMARY, UsageError, _data_options, _read, is_implicit, positive_int


def cmd_evaluate(args):
    from .. import load_model

    model = load_model(args.model)
    test = _read(args, args.data)
    implicit = is_implicit(model)
    if "rating" not in test.columns and not implicit:
        raise UsageError(f"{args.data}: a rating model is evaluated on ratings; the file has no "
                         "rating column (name it with --rating-col)")
    _check_known_items(model, test, args.data)
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


def _check_known_items(model, test, path) -> None:
    """Scores over items the model never saw are its new-item fallback, not a measure of it: all
    unknown is an error, a share unknown a note on stderr."""
    import sys

    known = model._item_index(test["item"].to_numpy()) >= 0
    if not known.any():
        raise UsageError(f"{path}: none of its {len(known)} rows names an item the model knows "
                         "(the scores would be the new-item fallback alone); check that the "
                         "data and the model belong together, and --item-col")
    if not known.all():
        print(f"note: {int((~known).sum())} of {len(known)} rows of {path} name items the model "
              "does not know; they are scored with the new-item fallback", file=sys.stderr)


def _recon_metrics(model, test, args, implicit):
    from ..model_selection import recon_scorer

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
    from ..eval import known_user_eval

    history = _read(args, args.history) if args.history is not None else None
    if history is None and model._fitted("user_factors_") is None:
        raise UsageError(f"{type(model).__name__} keeps no user data; --protocol standard needs "
                         "the users' training rows as --history FILE (or use --protocol recon)")
    return known_user_eval(model, test, history=history, k=args.k)


def add_parser(sub):
    p = sub.add_parser("evaluate", help=SUMMARY["evaluate"],
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
    p.add_argument("-k", "--k", type=positive_int, default=10,
                   help="cut-off of ranking metrics (an integer >= 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the support/query split")
    p.add_argument("--json", action="store_true")
    _data_options(p)
