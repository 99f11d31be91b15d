"""
Quick start: federated reconstruction, unseen users, recommendations
====================================================================

Train Federated Reconstruction on ratings, score users it never saw, recommend.

Runs on a synthetic population in seconds. For the real MovieLens-100K use
``ratings = fedcf.datasets.load_movielens("100k")`` (downloaded and cached on first use).
"""

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.eval import recon_eval, user_split

ratings = make_synthetic_ratings(1000, 400, 40_000, random_state=0)   # Interactions
train, _, test = user_split(ratings, (0.8, 0.1, 0.1), random_state=0)  # whole users

# Each user is a device: their embedding is reconstructed locally every round and never uploaded.
model = FedReconMF(n_factors=20, n_rounds=200, clients_per_round=50, random_state=0).fit(train)

# ReconEval: test users never took part in training; each is reconstructed from half of their
# ratings and scored on the other half.
result = recon_eval(model, test, n_repeats=20)
print(f"ReconEval on {result['n_users']} unseen users: RMSE {result['rmse']:.3f}, "
      f"accuracy {result['accuracy']:.1%}")

# A brand-new user: three ratings are enough to reconstruct them on the fly (nothing is stored).
history = train.item_ids[:3]
print(model.recommend(items=history, ratings=[5, 4, 1], n=5))

# %%
# Centralized, for comparison, and predictions for pairs
# ------------------------------------------------------
# ``CentralizedMF`` sees every rating on one machine (the upper bound of the comparisons).
# Both take the same inputs: an ``Interactions``, a DataFrame with user, item and rating
# columns, a sparse user × item matrix, or scikit-learn's ``fit(X, y)``.
from fedcf import CentralizedMF  # noqa: E402

central = CentralizedMF(n_factors=20, random_state=0).fit(train)
central_result = recon_eval(central, test, n_repeats=20)
print(f"centralized + ReconEval: RMSE {central_result['rmse']:.3f}")

pairs = test.to_dataframe().head(3)
print(central.predict(pairs))   # a user unknown to the model is scored by the item alone

# %%
# Folding in a user on the device
# -------------------------------
# ``reconstruct`` solves for one user's embedding and bias from their ratings (an exact ridge
# solve against the frozen items); ``predict_local`` scores items with it. Nothing is stored on
# the model: on a phone, this is the whole personal model.
local = model.reconstruct(items=history, ratings=[5, 4, 1])
print(model.predict_local(local, train.item_ids[3:8]))
