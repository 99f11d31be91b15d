"""Plain NumPy/Python twins of every kernel: slow, obvious, and the oracle the tests compare against.

One module per module of ``fedcf._kernels`` (``_reference.als`` twins ``_kernels.als``, ...). Each
function takes the same arguments as its kernel and returns what the kernel writes, without
mutating its inputs.
"""

from .als import implicit_solve_rows, ridge_cg_rows, ridge_objective, ridge_solve_row, ridge_solve_rows
from .catalog import catalog_base, catalog_client, catalog_predict, catalog_reconstruct
from .clients import fedrecon_round
from .dense import gram_panel, gram_rows
from .hypergrad import fedrecon_tangent_client
from .implicit_clients import fedrecon_implicit_client, fedrecon_implicit_full_client
from .predict import predict_pairs
from .rng import Stream, as_stream, mix64, stream_key
from .server import group_counters, grouped_tree_sum, robust_rows, tree_sum
from .sgd import (
    init_local,
    item_steps_rows,
    item_steps_user,
    sgd_epoch,
    sgd_reconstruct_rows,
    sgd_reconstruct_user,
)

__all__ = [
    "mix64",
    "stream_key",
    "Stream",
    "as_stream",
    "predict_pairs",
    "gram_panel",
    "gram_rows",
    "ridge_solve_row",
    "ridge_solve_rows",
    "ridge_cg_rows",
    "ridge_objective",
    "implicit_solve_rows",
    "sgd_reconstruct_user",
    "init_local",
    "sgd_reconstruct_rows",
    "item_steps_user",
    "item_steps_rows",
    "sgd_epoch",
    "fedrecon_round",
    "fedrecon_implicit_client",
    "fedrecon_implicit_full_client",
    "robust_rows",
    "tree_sum",
    "grouped_tree_sum",
    "group_counters",
    "fedrecon_tangent_client",
    "catalog_base",
    "catalog_reconstruct",
    "catalog_predict",
    "catalog_client",
]
