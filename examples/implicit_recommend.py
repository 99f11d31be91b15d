"""Implicit feedback (shares, clicks) with federated reconstruction, then recommend.

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
