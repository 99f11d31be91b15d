"""fedcf recommend: top-n items for a new user's history or a known user."""

from __future__ import annotations

from .common import SUMMARY, UsageError, _as_model_ids, is_implicit


def cmd_recommend(args):
    import numpy as np
    import pandas as pd

    from .. import load_model

    if args.n < 1:
        raise UsageError(f"n must be >= 1 (got -n {args.n}): ask for at least 1 recommendation")
    model = load_model(args.model)
    if (args.user is None) == (args.items is None):
        raise UsageError("pass either --items (a new user's history) or --user ID")
    if args.user is not None:
        user = _as_model_ids([args.user], model.user_ids_, "user")[0]
        recs = model.recommend(user=user, n=args.n, filter_seen=not args.keep_seen)
    else:
        items = _as_model_ids(args.items, model.item_ids_, "item")
        known = pd.Index(model.item_ids_).get_indexer(pd.Index(items)) >= 0
        unknown = [i for i, k in zip(items, known) if not k]
        if unknown:
            raise UsageError(f"item {unknown[0]!r} is not in this model's catalog "
                             f"({len(model.item_ids_)} items)")
        if args.ratings is None and not is_implicit(model):
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


def add_parser(sub):
    p = sub.add_parser("recommend", help=SUMMARY["recommend"],
                       description="A new user (--items, --ratings) is reconstructed on the fly "
                       "and never stored.")
    p.add_argument("--model", required=True)
    p.add_argument("--items", nargs="+", help="item ids the user rated / interacted with")
    p.add_argument("--ratings", nargs="+", type=float, help="one rating per item")
    p.add_argument("--user", help="a user id seen in training (models that keep user rows)")
    p.add_argument("-n", type=int, default=10)
    p.add_argument("--keep-seen", action="store_true", help="do not filter the user's items")
    p.add_argument("--json", action="store_true")
