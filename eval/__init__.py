"""fedcf.eval: splits, metrics, evaluation protocols and simulations."""

from .metrics import (
    mae,
    per_user_rating_metrics,
    ranking_metrics,
    rating_metrics,
    rmse,
    round_to_scale,
    rounded_accuracy,
)
from .splits import (
    device_support_query_split,
    per_user_time_split,
    random_split,
    support_query_split,
    user_split,
)

__all__ = [
    "device_support_query_split",
    "mae",
    "per_user_rating_metrics",
    "per_user_time_split",
    "random_split",
    "ranking_metrics",
    "rating_metrics",
    "rmse",
    "round_to_scale",
    "rounded_accuracy",
    "support_query_split",
    "user_split",
]

from .protocols import (  # noqa: E402
    bootstrap,
    federated_recon_eval,
    known_user_eval,
    random_embedding_eval,
    recon_eval,
    standard_eval,
)

__all__ += ["bootstrap", "federated_recon_eval", "known_user_eval", "random_embedding_eval",
            "recon_eval", "standard_eval"]

from .._topk import top_k  # noqa: E402
from .offline import (  # noqa: E402
    ESTIMATORS,
    PositionActionRewardModel,
    estimate_ctr,
    off_policy_check,
    relative_errors,
    validate_log,
)

__all__ += ["top_k"]

__all__ += ["ESTIMATORS", "PositionActionRewardModel", "estimate_ctr", "off_policy_check",
            "relative_errors", "validate_log"]
