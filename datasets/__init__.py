"""fedcf.datasets: interaction data, MovieLens loaders (online and offline), synthetic populations.

Depends only on numpy, scipy and pandas.
"""

from ._files import atomic_write
from ._validation import DataValidationError
from .features import (
    ItemFeatures,
    hash_buckets,
    hashed_item_features,
    movielens_item_features,
    parse_movielens_items,
)
from .interactions import Interactions
from .movielens import (
    VARIANTS,
    DataUnavailableError,
    clear_cache,
    data_home,
    fetch_movielens,
    import_movielens,
    load_movielens,
    load_ratings_file,
    verify_movielens,
)
from .open_bandit import (
    CAMPAIGNS,
    POLICIES,
    context_free_action_probs,
    fetch_open_bandit,
    load_open_bandit,
)
from .population import SyntheticPopulation
from .ratings_file import RatingsFile
from .synthetic import SyntheticTruth, make_synthetic_ratings

__all__ = [
    "atomic_write",
    "CAMPAIGNS",
    "POLICIES",
    "context_free_action_probs",
    "fetch_open_bandit",
    "load_open_bandit",
    "VARIANTS",
    "DataUnavailableError",
    "DataValidationError",
    "Interactions",
    "ItemFeatures",
    "hash_buckets",
    "hashed_item_features",
    "movielens_item_features",
    "parse_movielens_items",
    "SyntheticPopulation",
    "RatingsFile",
    "SyntheticTruth",
    "clear_cache",
    "data_home",
    "fetch_movielens",
    "import_movielens",
    "verify_movielens",
    "load_movielens",
    "load_ratings_file",
    "make_synthetic_ratings",
]
