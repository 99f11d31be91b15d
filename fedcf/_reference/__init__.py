"""Plain NumPy/Python twins of every kernel: slow, obvious, and the oracle the tests compare against.

One module per module of ``fedcf._kernels`` (``_reference.als`` twins ``_kernels.als``, ...). Each
function takes the same arguments as its kernel and returns what the kernel writes, without
mutating its inputs.
"""

from .als import implicit_solve_rows, ridge_cg_rows, ridge_objective, ridge_solve_row, ridge_solve_rows  # noqa: F401
from .catalog import catalog_base, catalog_client, catalog_predict, catalog_reconstruct  # noqa: F401
from .clients import fedrecon_round  # noqa: F401
from .dense import gram_panel, gram_rows  # noqa: F401
from .hypergrad import fedrecon_tangent_client  # noqa: F401
from .implicit_clients import fedrecon_implicit_client, fedrecon_implicit_full_client  # noqa: F401
from .predict import predict_pairs  # noqa: F401
from .rng import Stream, as_stream, mix64, stream_key  # noqa: F401
from .server import group_counters, grouped_tree_sum, robust_rows, tree_sum  # noqa: F401
from .sgd import (  # noqa: F401
    init_local,
    item_steps_rows,
    item_steps_user,
    sgd_epoch,
    sgd_reconstruct_rows,
    sgd_reconstruct_user,
)
