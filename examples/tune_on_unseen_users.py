"""
Model selection on unseen users with GridSearchCV
=================================================

Held-out *users* (not rows) are what federated reconstruction is for: ``UserKFold`` keeps each
user's rows together, and ``recon_scorer`` reconstructs each held-out user from part of their
ratings and scores the rest (the paper's App. C.1 procedure, as one call).
"""

from sklearn.model_selection import GridSearchCV, cross_val_score

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import SGDReconstruction
from fedcf.model_selection import UserKFold, recon_scorer

df = make_synthetic_ratings(600, 200, 20_000, random_state=2).to_dataframe()
X, y = df[["user", "item"]], df["rating"]          # scikit-learn form: pairs and ratings

base = FedReconMF(n_factors=10, n_rounds=40, clients_per_round=40,
                  reconstruction=SGDReconstruction(steps=10), random_state=0)
grid = {"reconstruction__learning_rate": [0.05, 0.2], "client_update__learning_rate": [0.1, 0.5]}
search = GridSearchCV(base, grid, cv=UserKFold(3, random_state=0),
                      scoring=recon_scorer("rmse"), n_jobs=1)
search.fit(X, y)
print("best:", search.best_params_, f"ReconEval RMSE {-search.best_score_:.3f}")

scores = cross_val_score(search.best_estimator_, X, y, cv=UserKFold(3, random_state=1),
                         scoring=recon_scorer("accuracy"))
print("accuracy on held-out users per fold:", scores.round(3))
