"""
Off-policy evaluation of a stochastic slate policy
==================================================

A logging policy showed 3-item slates (each position drawn independently from a popularity
softmax over the candidates) and recorded a click per position. Estimate the CTR that a softmax
over the recommender's scores would get, check the overlap first, and compare with the exact
value the simulator knows.
"""

import warnings

import numpy as np

from fedcf import FedReconImplicitMF
from fedcf.eval import OverlapWarning, estimate_slate_ctr, user_split
from fedcf.eval import ope_study as st
from fedcf.eval.simulation import make_expression_population

population = make_expression_population(3000, {"gif": 200, "sticker": 100},
                                        position_bias=(1.0, 0.7, 0.4), random_state=1)
shares = population.shares(random_state=1)
train, _, test = user_split(shares, (0.8, 0.1, 0.1), random_state=1)
model = FedReconImplicitMF(n_factors=16, n_rounds=60, clients_per_round=100,
                           random_state=0).fit(train)
scores = model.score_all_items(*model.reconstruct_users(test))  # (test users, items)

# candidates: the 50 most-shared items; the logging policy favours popular ones
counts = np.bincount(train.items, minlength=train.n_items).astype(float)
candidates = np.argsort(-counts)[:50]
logging_probs = np.zeros(train.n_items)
logging_probs[candidates] = counts[candidates] / counts[candidates].sum()
logging = st.context_free(np.tile(logging_probs, (3, 1)))
masked = np.where(np.isin(np.arange(train.n_items), candidates), scores, -np.inf)
target = st.softmax_target(masked, temperature=0.05)

world = st.SlateWorld.from_population(population, test.user_ids)
no_model = st.RewardModel(np.zeros(scores.shape, np.float32), np.zeros(3))
log, _ = st.draw_log(world, logging, target, no_model, no_model.expected(target), 20_000)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", OverlapWarning)
    est = estimate_slate_ctr(log, log["target_probs"], factored=True, factored_target=True)
print(est[["estimate", "low", "high", "ess", "max_weight", "matched_share"]].round(4))
print("overlap warnings:", [str(w.message)[:60] for w in caught])
print("exact CTR of the target:", round(st.target_value(world, target), 4))
print("CTR of the logging policy itself:", round(float(log["reward"].mean()), 4))
