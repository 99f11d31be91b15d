"""
Checkpoints: a federated fit that survives a crash
==================================================

A fit with ``checkpoint_path`` saves its state atomically every ``checkpoint_every`` rounds. When
the process dies, the same ``fit`` call resumes from the last checkpoint and ends exactly where an
uninterrupted run ends.
"""

import tempfile
from pathlib import Path

import numpy as np

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings

ratings = make_synthetic_ratings(800, 300, 30_000, random_state=1)
folder = Path(tempfile.mkdtemp())
params = dict(n_factors=10, n_rounds=60, clients_per_round=40, random_state=0,
              checkpoint_path=folder / "run.ckpt", checkpoint_every=10)


class Crash(Exception):
    pass


def crash_at_round_35(model, done):
    """A callback runs every eval_every rounds; here it simulates the machine going down."""
    if done == 35:
        raise Crash
    return {"mean_item_norm": float(np.linalg.norm(model.item_factors_, axis=1).mean())}


try:
    FedReconMF(**params, eval_every=5).fit(ratings, callback=crash_at_round_35)
except Crash:
    print("crashed after round 35; the last checkpoint holds round 30")

resumed = FedReconMF(**params, eval_every=5).fit(ratings)  # picks up at round 30
straight = FedReconMF(**{**params, "checkpoint_path": None}).fit(ratings)
print("resumed run equals an uninterrupted one:",
      np.array_equal(resumed.item_factors_, straight.item_factors_))

last = resumed.history_[-1]
print(f"round {last['round']}: loss {last['loss']:.3f}, {last['clients_used']} clients, "
      f"{last['values_up']} values uploaded")
resumed.save(folder / "model.npz")  # one .npz, no pickle; fedcf.load_model reads it back
