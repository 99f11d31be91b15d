"""The compile paths of ``fedcf.warmup``: each a small fit and evaluation that calls exactly the
kernels (and argument types) of one kind of job."""

from __future__ import annotations

import os

from .federated.algorithms.client_update import ClientUpdate
from .federated.algorithms.hyper import Hypergradients
from .federated.algorithms.reconstruction import SGDReconstruction


def _tiny():
    from fedcf.datasets import make_synthetic_ratings
    from fedcf.eval import per_user_time_split, user_split

    inter = make_synthetic_ratings(60, 40, 1200, random_state=0)
    train_t, _, test_t = per_user_time_split(inter, (0.8, 0.1, 0.1))
    train_u, _, test_u = user_split(inter, (0.7, 0.1, 0.2), random_state=0)
    return train_t, test_t, train_u, test_u


def _evaluate(model, test_t=None, test_u=None):
    from fedcf.eval import random_embedding_eval, recon_eval, standard_eval

    if test_t is not None:
        standard_eval(model, test_t, n_repeats=2)
    if test_u is not None:
        recon_eval(model, test_u, n_repeats=2)
        random_embedding_eval(model, test_u, n_repeats=2)


def _federated(cls, train, test_t, test_u, **params):
    model = cls(n_factors=4, n_rounds=2, clients_per_round=8, random_state=0, **params)
    _evaluate(model.fit(train), test_t, test_u)


# the main job's FedRecon configurations (scripts/movielens_benchmark.py: PAPER, OURS)
_PAPER = dict(biases=False, reconstruction=SGDReconstruction(steps=3),
              client_update=ClientUpdate(steps=3, batch_size=5), split="random")
_OURS = dict(biases=True, reconstruction="als")


def _centralized(data):
    from fedcf import CentralizedMF

    train_t, test_t, train_u, test_u = data
    _evaluate(CentralizedMF(n_factors=4, solver="als", n_epochs=1).fit(train_t), test_t)
    _evaluate(CentralizedMF(n_factors=4, solver="als", n_epochs=1).fit(train_u), None, test_u)


def _centralized_sgd(data):
    from fedcf import CentralizedMF

    _evaluate(CentralizedMF(n_factors=4, solver="sgd", n_epochs=1).fit(data[0]), data[1])


def _fedavg(data):
    """The stateful baselines, FedAvg and FURL (user rows kept between rounds)."""
    from fedcf import FURLMF, FedAvgMF

    train_t, test_t, train_u, test_u = data
    _federated(FedAvgMF, train_t, test_t, None)
    _federated(FedAvgMF, train_u, None, test_u)
    _federated(FURLMF, train_t, test_t, None)


def _fedrecon_sgd(data):
    from fedcf import FedReconMF

    _federated(FedReconMF, data[2], None, data[3], **_PAPER)


def _fedrecon_als(data):
    from fedcf import FedReconMF

    train_t, test_t, train_u, test_u = data
    _federated(FedReconMF, train_u, None, test_u, **_OURS)
    _federated(FedReconMF, train_t, test_t, None, **_OURS)


def _hypergradient(data):
    from fedcf import FedReconMF

    _federated(FedReconMF, data[2], None, data[3], hypergradients=Hypergradients(),
               **_OURS)


def _fedrecon_variants(data):
    from fedcf import FedReconMF

    for extra in (dict(split="none"), dict(joint=True), dict(server_optimizer="adagrad"),
                  dict(server_optimizer="adam"), dict(server_optimizer="yogi")):
        _federated(FedReconMF, data[2], None, data[3], **{**_PAPER, **extra})


def _implicit(data):
    from fedcf import FedReconImplicitMF, ImplicitMF

    train = data[2]
    ImplicitMF(n_factors=4, n_epochs=1).fit(train).recommend(train.user_ids[:3], n=5)
    for full in (False, True):
        FedReconImplicitMF(n_factors=4, n_rounds=2, clients_per_round=8, full_negatives=full,
                           random_state=0).fit(train)


def _binary(data):
    from fedcf.datasets import Interactions

    t = data[2]
    return Interactions(t.indptr, t.items, t.values * 0 + 1, None, t.user_ids, t.item_ids)


def _sampled(data):
    """The sampled-negative baselines (FedMF, PFedRec): training, scores, new users."""
    from fedcf.federated import FedMF, PFedRec

    train = _binary(data)
    for cls in (FedMF, PFedRec):
        model = cls(n_factors=4, n_rounds=2, clients_per_round=8, random_state=0).fit(train)
        model.user_scores([0, 1])
        model.score_new_users(train.subset_users([2, 3]))


def _neumf(data):
    """FedNCF and centralized NCF (the NeuMF network)."""
    from fedcf import NCF
    from fedcf.federated import FedNCF

    train = _binary(data)
    FedNCF(n_factors=4, n_rounds=2, clients_per_round=8, random_state=0).fit(train) \
        .user_scores([0, 1])
    NCF(n_factors=4, n_epochs=1, random_state=0).fit(train).user_scores([0, 1])


def _catalog(data):
    """Items outside the catalog: UNK, hashed local rows, a learned default."""
    from fedcf import FedReconMF
    from fedcf.federated import OpenCatalog

    space = OpenCatalog(0.5, unknown_item_row=True, local_item_buckets=4, learned_default=True)
    model = FedReconMF(n_factors=4, n_rounds=2, clients_per_round=8, item_space=space,
                       random_state=0).fit(data[2])
    model.recon_predict(data[3], data[3])


def _float64(data):
    """``dtype="float64"``: the same kernels compiled for double precision (FedRecon with both
    reconstructions and hypergradients, FedAvg with hypergradients, FURL, implicit, centralized)."""
    from fedcf import FURLMF, CentralizedMF, FedAvgMF, FedReconImplicitMF, FedReconMF, ImplicitMF

    train_t, test_t, train_u, test_u = data
    f64 = dict(dtype="float64")
    for solver in ("als", "sgd"):
        _evaluate(CentralizedMF(n_factors=4, solver=solver, n_epochs=1, **f64).fit(train_t),
                  test_t)
    _federated(FedReconMF, train_u, None, test_u, **_PAPER, **f64)
    _federated(FedReconMF, train_t, test_t, None, **_OURS, **f64)
    _federated(FedReconMF, train_u, None, test_u, hypergradients=Hypergradients(), **_OURS, **f64)
    _federated(FedAvgMF, train_t, test_t, None, hypergradients=Hypergradients(), **f64)
    _federated(FURLMF, train_t, test_t, None, **f64)
    ImplicitMF(n_factors=4, n_epochs=1, **f64).fit(train_u).recommend(train_u.user_ids[:3], n=5)
    for full in (False, True):
        FedReconImplicitMF(n_factors=4, n_rounds=2, clients_per_round=8, full_negatives=full,
                           random_state=0, **f64).fit(train_u)


def _ray(data):
    """What a Ray shard actor compiles: its arrays arrive read only from Ray's object store
    (other kernel signatures than a local run's) and it sums its clients' uploads itself
    (``PartialSums``). Each estimator and aggregation path on one shard of a local instance,
    whose actor writes the kernels to this cache folder; without Ray, nothing to compile. The
    instance is a new one on 127.0.0.1 (never a cluster the machine runs), stopped at the end."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray's import
    os.environ.setdefault("RAY_worker_niceness", "0")
    try:
        import ray
    except ImportError:
        return
    from .federated.executors.ray_executor import LOOPBACK, _single_machine

    _single_machine()
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             **LOOPBACK)
    from fedcf import FURLMF, FedAvgMF, FedReconImplicitMF, FedReconMF
    from fedcf.datasets import SyntheticPopulation
    from fedcf.federated import (
        DifferentialPrivacy,
        DPGaussianMean,
        FedMF,
        FedNCF,
        RayExecutor,
        SecureAggregation,
        TrimmedMean,
    )

    train_t, train_u, binary = data[0], data[2], _binary(data)
    dp = {"rating_scale": (1, 5)}
    runs = [(FedReconMF, train_u, {}), (FedReconMF, train_t, {"hypergradients": Hypergradients()}),
            (FedReconMF, train_u, {"aggregator": DPGaussianMean(0.5, 1.0, delta=1e-4), **dp}),
            (FedReconMF, train_u, {"aggregator": TrimmedMean(0.1)}),
            (FedReconMF, train_u, {"aggregator": DifferentialPrivacy(
                SecureAggregation(min_cohort=5), 0.5, 1.0, delta=1e-4, noise="distributed"),
                "clients_per_round": 30, **dp}),
            (FedReconMF, SyntheticPopulation(60, 40, ratings_per_user=8, random_state=0), {}),
            (FedAvgMF, train_t, {}), (FURLMF, train_t, {}), (FedMF, binary, {}),
            (FURLMF, train_t, {"hypergradients": Hypergradients(["server_learning_rate"])}),
            (FedNCF, binary, {}), (FedReconImplicitMF, train_u, {}),
            (FedReconImplicitMF, train_u, {"full_negatives": True})]
    try:
        for cls, train, params in runs:
            cls(**{"n_factors": 4, "n_rounds": 2, "clients_per_round": 8, "random_state": 0,
                   **params}, executor=RayExecutor(1, num_cpus=1)).fit(train)
    finally:
        ray.shutdown()


# in the order the main job (scripts/movielens_benchmark.py) first needs them; then what only
# the other estimators use
PATHS = {"centralized": _centralized, "fedavg": _fedavg, "fedrecon-sgd": _fedrecon_sgd,
         "fedrecon-als": _fedrecon_als, "hypergradient": _hypergradient,
         "fedrecon-variants": _fedrecon_variants, "centralized-sgd": _centralized_sgd,
         "implicit": _implicit, "sampled": _sampled, "neumf": _neumf, "catalog": _catalog,
         "float64": _float64, "ray": _ray}
