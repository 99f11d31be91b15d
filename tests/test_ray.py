"""The Ray executor: shards held by actors, partial sums back, the same model bit for bit as the
local executor; faults (a killed actor) and bad settings. One local Ray instance on 127.0.0.1
for the module, shut down at its end (also when a test fails)."""

import warnings

import numpy as np
import pytest

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import (
    DevicePolicy,
    DifferentialPrivacy,
    DPGaussianMean,
    FedReconImplicitMF,
    Hypergradients,
    LocalExecutor,
    Momentum,
    RayExecutor,
    SecureAggregation,
    TrimmedMean,
)
from fedcf.federated.executors.ray_executor import BoundRayExecutor, ShardedHalves

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

KW = dict(n_factors=4, n_rounds=4, clients_per_round=40, random_state=0)


def kill_now(actor, timeout=60.0):
    """Kill an actor and wait until Ray reports it dead: ray.kill is asynchronous, and on a busy
    machine a call sent right after it may still be served, moving the restart to a later round."""
    import time

    ray.kill(actor, no_restart=True)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            ray.get(actor.peak_memory.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def pop():
    return make_synthetic_ratings(400, 50, 6000, n_factors=3, random_state=1)


def test_the_model_is_bit_identical_to_the_local_run_and_the_driver_fetches_two_sums(pop):
    """1, 2 and 5 shards (ranges that are not subtrees; 5: an odd count, three levels of the
    reducer tree): the local model bit for bit; the shards send more bytes as they are added,
    the driver fetches at most two objects' worth (the reducers added the shards' sums)."""
    ref = FedReconMF(**KW).fit(pop)
    fetched, sent = {}, {}
    for n_shards in (1, 2, 5):
        m = FedReconMF(**KW, executor=RayExecutor(n_shards)).fit(pop)
        np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
        np.testing.assert_array_equal(m.item_biases_, ref.item_biases_)
        assert [h["loss"] for h in m.history_] == [h["loss"] for h in ref.history_]
        assert all(h["shard_restarts"] == 0 for h in m.history_)
        fetched[n_shards] = [h["driver_bytes_up"] for h in m.history_]
        sent[n_shards] = [h["shard_bytes_up"] for h in m.history_]
    assert fetched[1] == sent[1] and fetched[2] == sent[2]  # nothing to add before the driver
    assert all(f2 <= 2 * f1 and f5 <= 2 * f1 and f5 < s5 for f1, f2, f5, s5 in zip(
        fetched[1], fetched[2], fetched[5], sent[5]))
    assert all(a < b < c for a, b, c in zip(sent[1], sent[2], sent[5]))


@pytest.mark.parametrize("agg", [DPGaussianMean(0.5, 1.0, delta=1e-4, insecure_seeded_noise=True),
                                 TrimmedMean(0.1)],
                         ids=["dp", "trimmed"])  # secure aggregation: the test below
def test_every_aggregator_composes_with_it(pop, agg):
    ref = FedReconMF(**KW, rating_scale=(1, 5), aggregator=agg).fit(pop)
    m = FedReconMF(**KW, rating_scale=(1, 5), aggregator=agg, executor=RayExecutor(3)).fit(pop)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)


SECURE = [SecureAggregation(min_cohort=5, drop_after_setup=0.1),
          DifferentialPrivacy(SecureAggregation(min_cohort=5), 0.5, 1.0, delta=1e-4,
                              noise="distributed", target_quantile=0.5,
                              insecure_seeded_noise=True)]


@pytest.mark.parametrize("agg", SECURE, ids=["secagg", "secagg-dp-distributed-adaptive"])
def test_under_secure_aggregation_the_shards_mask_and_the_driver_gets_messages_only(
        pop, agg, monkeypatch):
    """Each shard runs, encodes and masks its own clients — their updates and their
    hypergradient reports; the driver receives public keys, encrypted shares, masked vectors,
    signatures and unmasking shares — no upload, no report — and the model and the learned
    rate are the local executor's bit for bit, with 1, 2 or 4 shards (the DP variant: 2)."""
    received = []
    real = ShardedHalves._ask

    def spy(self, step, args_of):
        out = real(self, step, args_of)
        received.extend(type(m).__name__ for m in out)
        return out

    monkeypatch.setattr(ShardedHalves, "_ask", spy)
    monkeypatch.setattr(BoundRayExecutor, "tangents", None)  # reports never come in the clear
    kw = dict(KW, rating_scale=(1, 5), clients_per_round=20,
              hypergradients=Hypergradients(holdout=0.0, learning_rate=0.1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the seeded-noise test mode says so
        ref = FedReconMF(**kw, aggregator=agg).fit(pop)
        for n in (1, 2, 4) if isinstance(agg, SecureAggregation) else (2,):  # (suite time)
            m = FedReconMF(**kw, aggregator=agg, executor=RayExecutor(n)).fit(pop)
            np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
            np.testing.assert_array_equal([h["loss"] for h in m.history_],  # (NaN under DP:
                                          [h["loss"] for h in ref.history_])  # not sent)
            assert [h["secagg_survivors"] for h in m.history_] == \
                [h["secagg_survivors"] for h in ref.history_]
            assert m.learned_hyperparams_ == ref.learned_hyperparams_
    assert set(received) == {"Advert", "EncryptedShares", "MaskedInput",
                             "ConsistencySignature", "UnmaskShares"}
    assert all(h["secagg_survivors"] > 0 for h in ref.history_)
    assert all(not h["hyper_secagg_lost_round"] for h in ref.history_[1:])
    assert len({h["server_learning_rate"] for h in ref.history_}) == len(ref.history_)


def test_a_shard_lost_after_masking_counts_as_its_clients_dropping(pop, monkeypatch):
    """An actor killed between the masked inputs and the unmasking round: its clients answer
    nothing, the others hold enough shares to remove their masks, and the round is the one
    that would have been (the sum is exact); the restart is recorded."""
    kw = dict(KW, clients_per_round=20, n_rounds=2, rating_scale=(1, 5))
    agg = SecureAggregation(threshold=0.5, min_cohort=5)
    half = DevicePolicy(threshold=0.5, min_cohort=5)  # devices that accept t = m/2 + 1
    ref = FedReconMF(**kw, aggregator=agg, executor=LocalExecutor(half)).fit(pop)
    real, killed = ShardedHalves.unmask, []

    def unmask(self, u3, sigs):
        if not killed:
            killed.append(kill_now(self.executor.actors[0]))
        return real(self, u3, sigs)

    monkeypatch.setattr(ShardedHalves, "unmask", unmask)
    m = FedReconMF(**kw, aggregator=agg, executor=RayExecutor(3, device_policy=half)).fit(pop)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    assert m.history_[0]["shard_restarts"] == 1 and m.history_[1]["shard_restarts"] == 0
    assert not m.history_[0]["secagg_lost_round"]


def test_learned_hyperparameters_take_their_derivatives_from_the_shards(pop):
    kw = dict(KW, server_optimizer=Momentum(0.5),
              hypergradients=Hypergradients(["server_learning_rate", "momentum",
                                             "weight_exponent"]))
    ref = FedReconMF(**kw).fit(pop)
    m = FedReconMF(**kw, executor=RayExecutor(2)).fit(pop)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    assert m.learned_hyperparams_ == ref.learned_hyperparams_


def test_implicit_with_the_rank_map_and_sampled_negatives(pop):
    for full in (False, True):
        kw = dict(n_factors=3, n_rounds=3, clients_per_round=30, random_state=0,
                  full_negatives=full)
        ref = FedReconImplicitMF(**kw).fit(pop)
        m = FedReconImplicitMF(**kw, executor=RayExecutor(2)).fit(pop)
        np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)


def test_a_linear_aggregate_never_brings_one_clients_upload_to_the_driver(pop, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("per-client outputs requested")

    monkeypatch.setattr(BoundRayExecutor, "run", refuse)
    FedReconMF(**KW, executor=RayExecutor(2)).fit(pop)  # weighted mean: partial sums only
    with pytest.raises(AssertionError, match="per-client"):
        FedReconMF(**KW, aggregator=TrimmedMean(0.1), executor=RayExecutor(2)).fit(pop)


def test_a_killed_actor_is_restarted_and_the_round_retried(pop):
    bound = {}

    class Captured(RayExecutor):  # a new executor is a subclass with its own bind
        def bind(self, program, data, local_state=None):
            bound["ex"] = super().bind(program, data, local_state)
            return bound["ex"]

    def kill(model, done):
        if done == 1:  # a shard runs clients without the estimators' imports (a faster start)
            heavy = ray.get(bound["ex"].actors[1].__ray_call__.remote(
                lambda self: [m for m in ("sklearn", "scipy.stats") if m in __import__("sys").modules]))
            assert heavy == [], f"a shard imported {heavy}"
            # its kernels get writable arrays: the object store's read-only ones would be
            # compiled as a second signature in every actor
            flags = ray.get(bound["ex"].actors[1].__ray_call__.remote(lambda self: [
                a.flags.writeable for a in (*self.data, *vars(self.executor.program).values())
                if isinstance(a, np.ndarray)]))
            assert len(flags) >= 4 and all(flags), flags
        if done == 2:
            kill_now(bound["ex"].actors[1])

    ref = FedReconMF(**KW).fit(pop)
    m = FedReconMF(**KW, eval_every=1, executor=Captured(2)).fit(pop, callback=kill)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    assert [h["shard_restarts"] for h in m.history_] == [0, 0, 1, 0]


@pytest.mark.parametrize("kw,err,match", [
    (dict(n_shards=0), ValueError, "n_shards must be an int in"),
    (dict(n_shards=65), ValueError, "n_shards must be an int in"),
    (dict(n_shards="2"), ValueError, "n_shards must be an int in"),
    (dict(num_cpus=-1), ValueError, "num_cpus must be"),
    (dict(address=6379), TypeError, "address must be a string"),
    (dict(max_restarts=-1), ValueError, "max_restarts"),
    (dict(resources=[1]), TypeError, "resources must be a dict"),
    (dict(resources={"gpu_node": "one"}), ValueError, "resources must map resource names"),
    (dict(resources={"gpu_node": -1}), ValueError, "resources must map resource names"),
])
def test_bad_settings_are_named(kw, err, match):
    with pytest.raises(err, match=match):
        RayExecutor(**kw)


def test_settings_the_cluster_cannot_meet_are_refused_before_training(pop):
    tiny = make_synthetic_ratings(3, 10, 20, random_state=0)
    with pytest.raises(ValueError, match="n_shards=4 is more than the 3 users"):
        FedReconMF(**KW, executor=RayExecutor(4)).fit(tiny)
    with pytest.raises(ValueError, match="need more than the cluster's 2 CPUs"):
        FedReconMF(**KW, executor=RayExecutor(3, num_cpus=1)).fit(pop)
    with pytest.raises(ValueError, match="executor='Ray': 'Ray' is not a registered executor; "
                                         r"use one of \[.*'local', 'ray'\]"):
        FedReconMF(**KW, executor="Ray").fit(pop)
    with pytest.raises(TypeError, match="executor must be one of .* fedcf.federated.Executor"):
        FedReconMF(**KW, executor=RayExecutor).fit(pop)  # the class, not an object


class OpenedRay(RayExecutor):
    """A RayExecutor that keeps the round executor of the population it opens (where the
    population is built, on the shards); module level, so a fitted model pickles."""

    opened: dict = {}

    def open(self, source):
        pop = super().open(source)
        self.opened["ex"] = pop.executor
        return pop


def test_a_population_spec_is_built_on_the_workers_never_on_the_driver(monkeypatch):
    from fedcf.datasets import SyntheticPopulation

    spec = SyntheticPopulation(2000, 120, ratings_per_user=10, random_state=5)
    ref = FedReconMF(**KW).fit(spec)  # local: built here

    def refuse(*a, **k):
        raise AssertionError("the driver built the population")

    monkeypatch.setattr(SyntheticPopulation, "build", refuse)  # this process only
    monkeypatch.setattr(SyntheticPopulation, "to_interactions", refuse)
    bound = OpenedRay.opened

    def kill(model, done):  # a restarted actor rebuilds its shard from the spec
        if done == 1:
            kill_now(bound["ex"].actors[0])

    for n_shards in (1, 3):
        m = FedReconMF(**KW, eval_every=1, executor=OpenedRay(n_shards)).fit(spec,
                                                                            callback=kill)
        np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
        assert m.global_mean_ == ref.global_mean_
        assert [h["shard_restarts"] for h in m.history_] == [0, 1, 0, 0]
    assert "RemotePopulation" in repr(m.interactions_)
    monkeypatch.undo()
    np.testing.assert_allclose(m.predict(np.array([[3, 7]])), ref.predict(np.array([[3, 7]])))
    import pickle

    back = pickle.loads(pickle.dumps(m.interactions_))  # kept by a fitted model: no actors
    assert back.n_users == 2000 and back.counts().sum() == back.nnz


def test_a_ratings_file_is_read_by_the_workers_never_by_the_driver(pop, tmp_path, monkeypatch):
    """A RatingsFile travels to the shards as a path and a sha256: each worker reads it and
    keeps its users; the driver learns the raw ids from a worker and never reads a rating. The
    model is the local one (the file read here) bit for bit, with 1 and 3 shards; a file
    changed under the run is refused by the workers."""
    from fedcf.datasets import RatingsFile

    df = pop.to_dataframe()
    df = df.assign(userId=df.user + 1000, movieId=df.item * 7 + 3)[
        ["userId", "movieId", "rating", "timestamp"]]
    path = tmp_path / "ratings.csv"
    df.to_csv(path, index=False)
    source = RatingsFile(path)
    ref = FedReconMF(**KW).fit(source)  # local: read in this process
    assert ref.user_ids_[0] == 1000 and ref.item_ids_[1] == 10

    def refuse(*a, **k):
        raise AssertionError("the driver read the ratings file")

    monkeypatch.setattr(RatingsFile, "to_interactions", refuse)  # this process only
    for n_shards in (1, 3):
        m = FedReconMF(**KW, executor=RayExecutor(n_shards)).fit(source)
        np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
        np.testing.assert_array_equal(m.user_ids_, ref.user_ids_)
        np.testing.assert_array_equal(m.item_ids_, ref.item_ids_)
        assert m.global_mean_ == ref.global_mean_
    monkeypatch.undo()
    pairs = np.array([[1003, 10], [1200, 31]])
    np.testing.assert_array_equal(m.predict(pairs), ref.predict(pairs))
    df.head(100).to_csv(path, index=False)  # the file changes under the spec
    with pytest.raises(Exception, match="changed since the run named it"):
        FedReconMF(**KW, executor=RayExecutor(2)).fit(source)


def test_a_run_checkpointed_here_resumes_on_ray_and_a_spec_run_resumes_too(pop, tmp_path):
    from fedcf.datasets import SyntheticPopulation

    kw = dict(KW, n_rounds=4)
    full = FedReconMF(**kw).fit(pop)
    ck = tmp_path / "ck.npz"
    FedReconMF(**{**kw, "n_rounds": 2}, checkpoint_path=str(ck)).fit(pop)
    resumed = FedReconMF(**kw, checkpoint_path=str(ck), executor=RayExecutor(2)).fit(pop)
    np.testing.assert_array_equal(resumed.item_factors_, full.item_factors_)

    spec = SyntheticPopulation(800, 60, ratings_per_user=8, random_state=1)
    full = FedReconMF(**kw, executor=RayExecutor(2)).fit(spec)
    ck2 = tmp_path / "ck2.npz"
    FedReconMF(**{**kw, "n_rounds": 2}, checkpoint_path=str(ck2), executor=RayExecutor(2)).fit(spec)
    resumed = FedReconMF(**kw, checkpoint_path=str(ck2), executor=RayExecutor(1)).fit(spec)
    np.testing.assert_array_equal(resumed.item_factors_, full.item_factors_)
    with pytest.raises(ValueError, match="fingerprint|different data|data"):
        FedReconMF(**kw, checkpoint_path=str(ck2), executor=RayExecutor(2)).fit(
            SyntheticPopulation(800, 60, ratings_per_user=8, random_state=2))


from fedcf.testing import ExecutorContract, contract_population  # noqa: E402,F401


class TestRayExecutorContract(ExecutorContract):
    make = staticmethod(lambda: RayExecutor(2))


def test_save_load_clone_fit_with_the_ray_executor(tmp_path):
    """test_contract's save → load → clone → fit, with a RayExecutor: the loaded model's
    executor is a RayExecutor again, and refits to the same model. (Every estimator with an
    executor runs this with the local and attacked executors in test_contract; one here keeps
    the actors' start-up cost down.)"""
    name = "FedReconImplicitMF"
    from sklearn.base import clone
    from test_contract import EXEC_IDS, EXECUTED, save_load_clone_fit

    df = make_synthetic_ratings(150, 60, 3000, n_factors=3, random_state=4).to_dataframe()
    est = clone(EXECUTED[EXEC_IDS.index(name)]).set_params(executor=RayExecutor(2), n_rounds=2)
    m = save_load_clone_fit(est, df, tmp_path)
    assert isinstance(type(m).load(m.save(tmp_path / "r.npz")).executor, RayExecutor)


def test_a_stuck_actor_is_restarted_after_the_shard_timeout(pop):
    """A shard whose worker stops answering (SIGSTOP: alive, never replies) is killed and
    restarted once shard_timeout passes, and its part of the round run again: the model is the
    local one and the round records the restart (it used to wait forever). The new actor takes
    longer to come up than shard_timeout (a start on a busy machine): its start is not held
    to the deadline, so it is restarted once (it used to be killed again and again)."""
    import os
    import signal
    import time

    bound = {}

    class Captured(RayExecutor):
        def bind(self, program, data, local_state=None):
            bound["ex"] = super().bind(program, data, local_state)
            return bound["ex"]

    def stop(model, done):
        if done == 2:
            actor = bound["ex"].actors[0]
            pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
            os.kill(pid, signal.SIGSTOP)
            start = bound["ex"]._start

            def slow_start(s):  # the new actor is busy for longer than shard_timeout first
                actor = start(s)
                actor.__ray_call__.remote(lambda self: time.sleep(timeout + 1))
                return actor
            bound["ex"]._start = slow_start

    timeout = 8.0
    ref = FedReconMF(**KW).fit(pop)
    m = FedReconMF(**KW, eval_every=1, executor=Captured(2, shard_timeout=timeout)).fit(
        pop, callback=stop)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    assert [h["shard_restarts"] for h in m.history_] == [0, 0, 1, 0]
    with pytest.raises(ValueError, match="shard_timeout must be"):
        RayExecutor(shard_timeout=0)


def _stateful_cases():
    from fedcf.federated import FURLMF, FedAvgMF, FedMF, FedNCF, PFedRec

    small = dict(n_factors=3, n_rounds=3, clients_per_round=40, random_state=0)
    return {"fedavg": lambda **kw: FedAvgMF(**small, **kw),
            "furl": lambda **kw: FURLMF(**small, **kw),
            "furl-learned-rate": lambda **kw: FURLMF(  # the tangents run from the rows sent
                **small, hypergradients=Hypergradients(["server_learning_rate"]), **kw),
            "fedmf": lambda **kw: FedMF(**small, **kw),
            "pfedrec": lambda **kw: PFedRec(**small, **kw),
            "fedncf": lambda **kw: FedNCF(layers=(4,), **small, **kw)}


@pytest.mark.parametrize("name", sorted(_stateful_cases()))
def test_a_stateful_estimator_on_ray_is_the_local_model(name, pop):
    """The stateful baselines' user rows stay in the driver between rounds (as in process);
    each round ships the cohort's rows to their shards and takes the updated rows back: the
    item rows, the user rows and the losses are the in-process run's, bit for bit, for 1 and 3
    shards."""
    make = _stateful_cases()[name]
    ref = make().fit(pop)
    for n_shards in (1, 3):
        m = make(executor=RayExecutor(n_shards)).fit(pop)
        np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
        np.testing.assert_array_equal(m.user_factors_, ref.user_factors_)
        np.testing.assert_array_equal(m.user_biases_, ref.user_biases_)
        assert [h["loss"] for h in m.history_] == [h["loss"] for h in ref.history_]


def test_a_stateful_run_survives_a_killed_actor(pop):
    """A shard restarted mid-run is sent its clients' rows as the driver kept them, so the
    retried round starts from the rows the round began with: the in-process model still."""
    from fedcf.federated import FURLMF

    bound = {}

    class Captured(RayExecutor):
        def bind(self, program, data, local_state=None):
            bound["ex"] = super().bind(program, data, local_state)
            return bound["ex"]

    def kill(model, done):
        if done == 1:
            kill_now(bound["ex"].actors[0])

    kw = dict(n_factors=3, n_rounds=3, clients_per_round=40, random_state=0)
    ref = FURLMF(**kw).fit(pop)
    m = FURLMF(**kw, eval_every=1, executor=Captured(2)).fit(pop, callback=kill)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(m.user_factors_, ref.user_factors_)
    assert [h["shard_restarts"] for h in m.history_] == [0, 1, 0]


def test_a_stateful_estimator_under_secure_aggregation_on_ray(pop):
    """The shards' clients run from the rows sent, encode and mask where they run; the model is
    the in-process one (secure aggregation sums the same quantized uploads)."""
    from fedcf.federated import FedMF

    kw = dict(n_factors=3, n_rounds=2, clients_per_round=40, random_state=0,
              aggregator=SecureAggregation(max_weight=100.0))
    ref = FedMF(**kw).fit(pop)
    m = FedMF(**kw, executor=RayExecutor(2)).fit(pop)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(m.user_factors_, ref.user_factors_)


def test_a_new_estimator_runs_on_ray_unchanged(custom_estimator, pop):
    """examples/custom_estimator.py's NormalInitMF (one class: a new initialisation) trains on
    Ray shards as in process, with nothing in the executor written for it."""
    kw = dict(n_factors=3, n_rounds=3, clients_per_round=40, random_state=0)
    ref = custom_estimator(**kw).fit(pop)
    m = custom_estimator(**kw, executor=RayExecutor(2)).fit(pop)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    assert not np.array_equal(ref.item_factors_, FedReconMF(**kw).fit(pop).item_factors_)


def test_shards_refuse_a_threshold_below_their_policy(pop, monkeypatch):
    """A server half that asks for t = 2 of 40 share holders: each shard's device refuses to
    share, so no round is unmasked and the model is the initial one (the refusals are logged
    in the actors, never sent)."""
    monkeypatch.setattr(SecureAggregation, "threshold_for", lambda self, m: 2)
    kw = dict(KW, n_rounds=2, rating_scale=(1, 5), aggregator=SecureAggregation(min_cohort=5))
    with pytest.warns(RuntimeWarning, match="0 clients shared their keys"):
        m = FedReconMF(**kw, executor=RayExecutor(2)).fit(pop)
    assert all(h["secagg_lost_round"] and h["clients_used"] == 0 for h in m.history_)


def test_early_stopping_on_ray_equals_the_local_run(pop):
    """The held-out users report their losses from the shards: the same checks, kept round and
    model as in this process, with 1 and 3 shards."""
    from fedcf.federated import Adam, EarlyStopping

    kw = dict(KW, n_rounds=12, server_optimizer=Adam(0.3, epsilon=1e-3),
              early_stopping=EarlyStopping(every=3))
    ref = FedReconMF(**kw).fit(pop)
    for n in (1, 3):
        m = FedReconMF(**kw, executor=RayExecutor(n)).fit(pop)
        assert m.best_round_ == ref.best_round_
        assert [h.get("validation_rmse") for h in m.history_] == \
            [h.get("validation_rmse") for h in ref.history_]
        np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
