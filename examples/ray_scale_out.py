"""
Scale-out on Ray: the same model from shards on a cluster
=========================================================

``RayExecutor`` runs each round's client work in Ray actors, each holding a shard of the
population for the whole run; the driver sends the global model and receives per-group partial
sums, never one client's upload. Clients' random streams depend only on (seed, round, client)
and the sums are reduced in a fixed order, so the model is the in-process one bit for bit, for
any number of shards. Needs ``pip install "fedcf[ray]"``.

Here Ray starts a local instance on this machine; on a cluster, pass its address
(``RayExecutor(n_shards=16, address="HEAD_IP:6379")``).
"""

import numpy as np
import ray

from fedcf import FedReconMF
from fedcf.datasets import SyntheticPopulation
from fedcf.federated import RayExecutor

# A population that each shard builds on its own worker: the driver never holds the ratings.
population = SyntheticPopulation(n_users=20_000, n_items=500, random_state=0)
settings = dict(n_factors=10, n_rounds=30, clients_per_round=200, random_state=0)

on_ray = FedReconMF(**settings, executor=RayExecutor(n_shards=2)).fit(population)
last = on_ray.history_[-1]
print(f"last round: {last['clients_used']} clients in {last['seconds'] * 1000:.1f} ms, "
      f"{last['shard_restarts']} shard restarts, {last['driver_bytes_up']:,} bytes to the driver")

# %%
# The same fit in this process
# ----------------------------
# A ``SyntheticPopulation`` is generated the same way wherever it is built, so the local fit
# sees the same users.
local = FedReconMF(**settings).fit(population)
print("identical item factors:", np.array_equal(on_ray.item_factors_, local.item_factors_))

ray.shutdown()
