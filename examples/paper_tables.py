"""
The paper's comparisons: StandardEval, ReconEval and the baselines
==================================================================

Federated Reconstruction (Singhal et al., 2021) compares models on two protocols:

- **StandardEval** scores held-out ratings of users the model was trained on (each user's
  newest ratings);
- **ReconEval** scores users the model never saw: each is reconstructed from part of their
  ratings (the support set) and scored on the rest (the query set), as a new device would be.

This tutorial runs the rows of the paper's Tables 1 and 3 on a synthetic population in seconds.
``python scripts/movielens_benchmark.py`` runs them on MovieLens-100K (the results pages have
the table).
"""

from fedcf import CentralizedMF, FedAvgMF, FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.eval import (
    per_user_time_split,
    random_embedding_eval,
    recon_eval,
    standard_eval,
    user_split,
)
from fedcf.federated import NoSplit, SGDReconstruction

ratings = make_synthetic_ratings(1500, 300, 60_000, random_state=0)
seen_train, _, seen_test = per_user_time_split(ratings, (0.8, 0.1, 0.1))   # StandardEval
train, _, unseen = user_split(ratings, (0.8, 0.1, 0.1), random_state=0)    # ReconEval
fed = dict(n_factors=20, n_rounds=200, clients_per_round=50, random_state=0)


def show(name, result):
    print(f"{name:<44} RMSE {result['rmse']:.3f}  accuracy {result['accuracy']:.1%}")


# %%
# Centralized matrix factorization
# --------------------------------
# The upper bound a server holding every rating reaches. On unseen users it needs their
# embedding: a random one (what StandardEval would give a new user) or a reconstruction.
central = CentralizedMF(n_factors=20, random_state=0)
show("centralized + StandardEval", standard_eval(central.fit(seen_train), seen_test))
central.fit(train)
show("centralized, unseen users, random embedding", random_embedding_eval(central, unseen))
show("centralized + ReconEval", recon_eval(central, unseen))

# %%
# FedAvg and Federated Reconstruction
# -----------------------------------
# FedAvg keeps every user's embedding on the server between rounds (it must see a user to
# have one); FedRecon reconstructs it on the device each round and never stores it.
show("FedAvg + ReconEval", recon_eval(FedAvgMF(**fed).fit(train), unseen))
show("FedRecon (exact ridge reconstruction)", recon_eval(FedReconMF(**fed).fit(train), unseen))

# %%
# The paper's configuration and its ablations
# -------------------------------------------
# The paper reconstructs by k_r gradient steps on the support set with no biases; its
# ablation "no split" reconstructs and updates on the same ratings.
paper = dict(biases=False, reconstruction=SGDReconstruction())
show("FedRecon (paper config, SGD reconstruction)",
     recon_eval(FedReconMF(**fed, **paper).fit(train), unseen))
show("FedRecon (no split)",
     recon_eval(FedReconMF(**fed, **paper, split=NoSplit()).fit(train), unseen))

# %%
# Five server optimizers
# ----------------------
# The server applies the mean update with an optimizer of its own; each is a parameter object
# (``server_optimizer=Adam(0.01)``) or a name with its defaults.
for name in ("sgd", "momentum", "adagrad", "adam", "yogi"):
    model = FedReconMF(**fed, server_optimizer=name).fit(train)
    show(f"FedRecon, server optimizer {name}", recon_eval(model, unseen))

# %%
# Each optimizer runs with its default step here, a starting point rather than a tuned value:
# choose it on validation users, as the model-selection tutorial does.
