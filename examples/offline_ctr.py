"""
Offline CTR evaluation from logged impressions
==============================================

A logging policy (here: uniform random slates) showed items and recorded clicks with their
propensities. Before any online test, estimate the click-through rate the trained recommender's
slates would get, from that log alone, and compare with the truth the simulator knows.
"""

import numpy as np

from fedcf import FedReconImplicitMF
from fedcf.eval import estimate_ctr, relative_errors, top_k, user_split
from fedcf.eval.ctr import online_ctr_test, simulate_log, slate_target_probs
from fedcf.eval.simulation import make_expression_population

population = make_expression_population(3000, {"gif": 200, "sticker": 100}, random_state=1)
train, _, test = user_split(population.shares(random_state=1), (0.8, 0.1, 0.1), random_state=1)
model = FedReconImplicitMF(n_factors=16, n_rounds=150, clients_per_round=100,
                           random_state=0).fit(train)

# The target policy: each test user's top-3 slate, from their reconstructed embedding.
P, c = model.reconstruct_users(test)
slates = model.item_ids_[top_k(model.score_all_items(P, c), 3)]
users = test.user_ids
row_of = {u: k for k, u in enumerate(users)}

log = simulate_log(population, users, 200_000, policy="uniform", slate_size=3, random_state=2)
target = slate_target_probs(log, slates, row_of)
estimates = estimate_ctr(log["reward"], log["propensity"], target, estimators=("replay", "ips",
                                                                                 "snips"))
truth = online_ctr_test(population, {"fedrecon": slates}, users, random_state=3)[0]
true_ctr = float(truth.loc["fedrecon", "ctr_expected"])
print(estimates[["estimate", "low", "high"]].round(4))
print(f"true CTR of the slates: {true_ctr:.4f}; relative errors:")
print(relative_errors(estimates, true_ctr).round(3))
print("uniform logging CTR:", round(float(np.mean(log["reward"])), 4))
