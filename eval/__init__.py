"""fedcf.eval: splits, metrics, evaluation protocols and simulations."""

from .._topk import top_k
from .loo import (
    LeaveOneOut,
    leave_one_out,
    loo_metrics,
    loo_ranks,
    sample_negatives,
    training_exclusions,
)
from .metrics import (
    mae,
    per_user_rating_metrics,
    ranking_metrics,
    rating_metrics,
    rmse,
    round_to_scale,
    rounded_accuracy,
)
from .offline import (
    ESTIMATORS,
    PositionActionRewardModel,
    ReplayBiasWarning,
    estimate_ctr,
    relative_errors,
    validate_log,
)
from .policy_check import off_policy_check
from .prior import PRIOR_WEIGHTS, choose_prior_weight, popularity_prior
from .protocols import (
    bootstrap,
    federated_recon_eval,
    known_user_eval,
    random_embedding_eval,
    recon_eval,
    standard_eval,
)
from .slate import (
    SLATE_ESTIMATORS,
    OverlapWarning,
    check_propensity_sums,
    estimate_slate_ctr,
    target_support,
    validate_slate_log,
    weight_diagnostics,
)
from .splits import (
    device_support_query_split,
    per_user_time_split,
    random_split,
    support_query_split,
    user_split,
)

__all__ = [
    "LeaveOneOut",
    "leave_one_out",
    "loo_metrics",
    "loo_ranks",
    "sample_negatives",
    "training_exclusions",
    "SLATE_ESTIMATORS",
    "OverlapWarning",
    "ReplayBiasWarning",
    "check_propensity_sums",
    "estimate_slate_ctr",
    "target_support",
    "validate_slate_log",
    "weight_diagnostics",
    "bootstrap",
    "choose_prior_weight",
    "popularity_prior",
    "PRIOR_WEIGHTS",
    "device_support_query_split",
    "estimate_ctr",
    "ESTIMATORS",
    "federated_recon_eval",
    "known_user_eval",
    "mae",
    "off_policy_check",
    "per_user_rating_metrics",
    "per_user_time_split",
    "PositionActionRewardModel",
    "random_embedding_eval",
    "random_split",
    "ranking_metrics",
    "rating_metrics",
    "recon_eval",
    "relative_errors",
    "rmse",
    "round_to_scale",
    "rounded_accuracy",
    "standard_eval",
    "support_query_split",
    "top_k",
    "user_split",
    "validate_log",
]
