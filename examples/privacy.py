"""
Differential privacy and secure aggregation: who is protected from whom
=======================================================================

A federated round keeps each user's ratings and embedding on the device; what leaves it is an
update of the item rows the user rated. Three protections go further, each against another
party:

- **Differential privacy** (``DPGaussianMean``) clips each update and adds Gaussian noise before
  the model is released. It protects users from anyone who reads the model (ε, ``epsilon_``),
  not from the server, which still sees each clipped update.
- **Secure aggregation** (``SecureAggregation``) masks each update so that the server learns only
  the sum over a cohort. It protects users from the server, not from readers of the model.
- **Both**, with the noise drawn by the devices themselves
  (``DifferentialPrivacy(SecureAggregation(...), noise="distributed")``): the server sees only
  a noised sum (``epsilon_server_``: ε against a server that picks the cohort), readers only
  the released model (``epsilon_``).

And the devices keep rules of their own (``DevicePolicy``) that no server message can change.
The attacks each mode stops, and those it does not, are on the privacy results page.
"""

import tempfile
from pathlib import Path

import numpy as np

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.eval import recon_eval, user_split
from fedcf.federated import (
    DifferentialPrivacy,
    DPGaussianMean,
    LocalExecutor,
    SecureAggregation,
    device_budget,
)

ratings = make_synthetic_ratings(3000, 200, 60_000, random_state=0)
train, _, test = user_split(ratings, (0.8, 0.1, 0.1), random_state=0)

# %%
# Differential privacy, noise added by the server
# -----------------------------------------------
# The rating scale is public: a DP model may not take its mean and range from the data. The
# noise and the Poisson cohorts come from the operating system, never from ``random_state``.
dp = FedReconMF(n_factors=10, n_rounds=100, clients_per_round=100, rating_scale=(1, 5),
                random_state=0,
                aggregator=DPGaussianMean(clip_norm=0.5, target_epsilon=4.0, delta=1e-5))
dp.fit(train)
print(f"ε = {dp.epsilon_:.2f} at δ = 1e-5, noise multiplier {dp.noise_multiplier_:.2f}; "
      f"ReconEval RMSE {recon_eval(dp, test, n_repeats=5)['rmse']:.3f}")

# %%
# What the saved file holds
# -------------------------
# ``save`` writes a DP release: the item factors and biases trained under the accounted
# mechanism, the public scale, no training user id, no user row, no seed.
path = dp.save(Path(tempfile.mkdtemp()) / "dp.npz")
with np.load(path) as f:
    print("arrays in the release:", sorted(f.files), "; training user ids:", len(f["user_ids"]))

# %%
# Secure aggregation with the noise drawn by the devices
# ------------------------------------------------------
# Each round runs the whole protocol (keys, masks, a signed consistency round, unmasking); its
# cost grows faster than the cohort, so this run is small.
private = DifferentialPrivacy(SecureAggregation(threshold=2 / 3, min_cohort=10), clip_norm=0.5,
                              noise_multiplier=1.2, noise="distributed", delta=1e-5)
secure = FedReconMF(n_factors=10, n_rounds=10, clients_per_round=20, rating_scale=(1, 5),
                    random_state=0, aggregator=private).fit(train)
print(f"against readers of the model ε = {secure.epsilon_:.2f}; against the server, which "
      f"knows each cohort, ε = {secure.epsilon_server_:.2f}")

# %%
# The device's own rules
# ----------------------
# ``device_budget`` turns a privacy budget into a policy: the least noise the device accepts and
# how many rounds it may join. Whoever runs the devices gives it (here the executor; on Ray each
# shard, on Flower each node's own config). A server that asks for less noise gets silence.
devices = LocalExecutor(device_policy=device_budget(8.0, 1e-5, noise_multiplier=1.0))
ok = FedReconMF(n_factors=10, n_rounds=10, clients_per_round=20, rating_scale=(1, 5),
                random_state=0, aggregator=private, executor=devices).fit(train)
print("cohort unmasked per round when the server asks for σ 1.2:",
      [r["secagg_survivors"] for r in ok.history_])

stingy = DifferentialPrivacy(SecureAggregation(threshold=2 / 3, min_cohort=10), clip_norm=0.5,
                             noise_multiplier=0.5, noise="distributed", delta=1e-5)
refused = FedReconMF(n_factors=10, n_rounds=3, clients_per_round=20, rating_scale=(1, 5),
                     random_state=0, aggregator=stingy, executor=devices).fit(train)
print("clients used per round when the server asks for σ 0.5:",
      [r["clients_used"] for r in refused.history_])
