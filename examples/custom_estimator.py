"""
How to add a federated estimator
================================

A new federated estimator is one class: nothing in fedcf's base classes, executors or
Flower app changes (the architecture page lists the contracts it relies on).

``NormalInitMF`` is FedReconMF whose item factors start normal N(0, init_scale²) instead of
uniform in ±init_scale. Registered by name, it trains in this process, on Ray shards
(``executor=RayExecutor(...)``) and over Flower (run config ``fedcf-model="normal-init-mf"``;
register it on the server and the nodes) the same way, and ``load_model`` reads it back;
``tests/test_ray.py`` and ``tests/test_flower.py`` check that it gives the in-process model.
"""

import tempfile
from pathlib import Path

import numpy as np

from fedcf import FedReconMF, load_model, registry
from fedcf.datasets import make_synthetic_ratings


class NormalInitMF(FedReconMF):
    """FedReconMF with normal initial item factors (std ``init_scale``)."""

    def _init_globals(self, inter, rng, dtype) -> dict:
        params = super()._init_globals(inter, rng, dtype)  # FedReconMF's, item space included
        params["Q"] = rng.normal(0.0, self.init_scale, params["Q"].shape).astype(dtype)
        return params


registry.register("estimator", "normal-init-mf", NormalInitMF)


if __name__ == "__main__":
    data = make_synthetic_ratings(200, 40, 3000, random_state=0)
    model = NormalInitMF(n_factors=4, n_rounds=20, clients_per_round=40, random_state=0).fit(data)
    path = model.save(Path(tempfile.mkdtemp()) / "normal.npz")
    back = load_model(path)
    same = np.array_equal(back.item_factors_, model.item_factors_)
    print(f"{type(back).__name__}: loss {model.history_[0]['loss']:.3f} -> "
          f"{model.history_[-1]['loss']:.3f}; loaded back equal: {same}")
    print("custom estimator: ok" if same else "custom estimator: FAILED")
