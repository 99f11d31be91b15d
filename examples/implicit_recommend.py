"""
Implicit feedback: shares and clicks, then recommend
====================================================

Each user's shares stay on their device; the server only learns the item embeddings. A new user is
reconstructed from whatever they shared, with no ratings needed.
"""

from fedcf import FedReconImplicitMF
from fedcf.eval import user_split
from fedcf.eval.simulation import make_expression_population
from fedcf.model_selection import recon_scorer

population = make_expression_population(3000, {"gif": 300, "sticker": 200}, random_state=0)
shares = population.shares(random_state=0)            # Interactions: strength = share count
train, _, test = user_split(shares, (0.8, 0.1, 0.1), random_state=0)

model = FedReconImplicitMF(n_factors=16, n_rounds=150, clients_per_round=100,
                           random_state=0).fit(train)

test_pairs = test.to_dataframe()
for metric in ("precision@10", "ndcg@10"):
    print(f"{metric} on unseen users:", round(recon_scorer(metric)(model, test_pairs), 3))

someone = test_pairs[test_pairs.user == test_pairs.user.iloc[0]]
print(model.recommend(items=someone["item"], ratings=someone["rating"], n=5))

# %%
# The field's ranking benchmark: leave one out
# --------------------------------------------
# Each user's latest share is held out; the model ranks it against 99 items the user never
# shared (drawn once, excluding every item of the user) and HR@10 / NDCG@10 count how often it
# lands in the top 10. Each device reconstructs its user from the training shares alone.
import numpy as np  # noqa: E402

from fedcf.eval import leave_one_out, loo_metrics, sample_negatives  # noqa: E402

split = leave_one_out(shares.subset_users(np.flatnonzero(shares.counts() >= 3)),
                      validation=False, order="random", random_state=0)
ranker = FedReconImplicitMF(n_factors=16, n_rounds=150, clients_per_round=100,
                            random_state=0).fit(split.train)
negatives = sample_negatives(split, 99, random_state=0)


def scores(users):
    """Every item's score for these users, each reconstructed from their own training shares."""
    return ranker.score_all_items(*ranker.reconstruct_users(split.train.subset_users(users)))


popularity = np.bincount(split.train.items, minlength=split.train.n_items).astype(float)
print("FedRecon:  ", loo_metrics(scores, split, negatives=negatives, k=10))
print("popularity:", loo_metrics(lambda u: np.tile(popularity, (len(u), 1)), split,
                                 negatives=negatives, k=10))
