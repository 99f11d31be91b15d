"""The round as phases: what crosses from clients to the server, and phases replaced one at a
time without touching the others."""

import dataclasses

import numpy as np
import pytest

from fedcf import FedReconImplicitMF, FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import SGD, ClientOutputs, LocalExecutor, RoundHyperparams, WeightedMean
from fedcf.federated.round.contracts import RoundExecutor

FAST = dict(n_factors=3, n_rounds=4, clients_per_round=40, random_state=3)


@pytest.fixture(scope="module")
def pop():
    return make_synthetic_ratings(200, 50, 4000, n_factors=3, random_state=5)


def test_client_outputs_have_no_field_for_local_parameters():
    names = {f.name for f in dataclasses.fields(ClientOutputs)}
    assert names == {"offsets", "items", "d_Q", "d_b", "weights", "losses", "rank_terms",
                     "clients"}  # clients: who sent it (dense ids), known to any server
    assert not names & {"P", "p", "c", "user_factors", "user_biases", "local"}


class ShardedExecutor(LocalExecutor):
    """Runs a cohort as several groups and joins their outputs, like a cluster of shards: a new
    executor is a class with ``bind`` and a round executor with ``run``."""

    def __init__(self, shards=3):
        self.shards = shards

    def bind(self, program, data, local_state=None):
        return ShardedRound(super().bind(program, data, local_state), self.shards)


class ShardedRound(RoundExecutor):
    def __init__(self, inner, shards):
        self.inner, self.counts, self.shards, self.calls = inner, inner.counts, shards, 0

    def run(self, cohort, params, ids):
        self.calls += 1
        parts = [self.inner.run(dataclasses.replace(cohort, clients=c), params, ids)
                 for c in np.array_split(cohort.clients, self.shards)]
        return ClientOutputs.concat(parts)


@pytest.mark.parametrize("base,kw", [(FedReconMF, {}), (FedReconMF, {"reconstruction": "sgd"}),
                                     (FedReconImplicitMF, {"full_negatives": True})])
def test_replacing_the_executor_changes_nothing_else(pop, base, kw):
    ref = base(**FAST, **kw).fit(pop)
    m = base(**FAST, **kw, executor=ShardedExecutor()).fit(pop)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    assert [h["loss"] for h in m.history_] == [h["loss"] for h in ref.history_]


class Recording(WeightedMean):
    linear = False  # it overrides __call__: it sees every upload

    def __init__(self):
        self.seen = []

    def __call__(self, out, hp, round_idx=0):
        self.seen.append((out.n_clients, hp, round_idx))
        return super().__call__(out, hp, round_idx)


def test_replacing_the_aggregator_and_reading_hyperparameters_from_one_place(pop):
    rec = Recording()
    m = FedReconMF(**FAST, server_optimizer=SGD(0.7), client_weighting="uniform",
                   aggregator=rec).fit(pop)
    ref = FedReconMF(**FAST, server_optimizer=SGD(0.7), client_weighting="uniform").fit(pop)
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    assert [r for _, _, r in rec.seen] == list(range(FAST["n_rounds"]))
    hp = rec.seen[0][1]
    assert isinstance(hp, RoundHyperparams)
    assert (hp.server_learning_rate, hp.weight_exponent) == (0.7, 0.0)


def test_weight_exponent_interpolates_between_uniform_and_by_examples():
    offsets = np.array([0, 1, 2])
    out = ClientOutputs(offsets, np.array([0, 0]), np.array([[1.0], [3.0]]), np.zeros(2),
                        np.array([1.0, 4.0]), np.zeros(2))
    agg = WeightedMean()
    mean = {a: agg(out, RoundHyperparams(1.0, {}, a)).d_Q[0, 0] for a in (0.0, 0.5, 1.0)}
    assert mean[0.0] == pytest.approx(2.0)  # (1 + 3) / 2
    assert mean[1.0] == pytest.approx((1 + 12) / 5)
    assert mean[0.5] == pytest.approx((1 + 3 * 2) / 3)


def _one_round_outputs(pop, n_clients=120):
    from fedcf.federated.round.phases import Cohort

    m = FedReconMF(**FAST)
    m._check_params()
    run = m._start(m._coerce(pop, None), None)
    clients = np.random.default_rng(0).choice(pop.n_users, n_clients, replace=False)
    cohort = Cohort(np.sort(clients), n_clients, 0, 0)
    return run, cohort, np.array([run.seed, 0], np.uint64)


def test_the_in_process_shards_reduce_to_the_local_model(pop):
    """The warm-up's stand-in for Ray's reduction (three shards' subtree sums, two of them
    combined) fits the local model bit for bit, so it compiles the kernels a sharded run uses."""
    from fedcf.federated.executors.ray_shard import InProcessShards

    ref = FedReconMF(**FAST).fit(pop)
    m = FedReconMF(**FAST, executor=InProcessShards()).fit(pop)
    assert m.executor.bind(None, (np.zeros(1, np.int64),) * 3).supports_partials
    np.testing.assert_array_equal(m.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(m.item_biases_, ref.item_biases_)


def test_partial_sums_of_whole_groups_merge_to_the_same_bits_in_any_split(pop):
    from fedcf.federated.round.partials import PartialSums, reduce_group

    run, cohort, ids = _one_round_outputs(pop)
    hp, agg = run.hyperparams, WeightedMean()
    ex = run.executor
    whole = agg(ex.run(cohort, run.params, ids), hp)  # one pass, no per-group rows
    g = reduce_group(cohort.clients)
    for cuts in ([0, 64], [0, 32, 64], [0, 13, 26, 39, 52, 64], [0, 1, 40, 64]):
        ranges = list(zip(cuts, cuts[1:]))[::-1]  # shards = group ranges, in any order
        parts = [agg.partials(ex.run(dataclasses.replace(
            cohort, clients=cohort.clients[(g >= a) & (g < b)]), run.params, ids), hp
            ).compact(a, b) for a, b in ranges]
        split = agg.reduce(PartialSums.concat(parts))
        np.testing.assert_array_equal(split.items, whole.items)
        np.testing.assert_array_equal(split.d_Q, whole.d_Q)
        np.testing.assert_array_equal(split.d_b, whole.d_b)
        assert split.summary == whole.summary


def test_nodes_whose_clients_share_groups_add_up_to_the_cohorts_sums(pop):
    """Flower nodes hold any users, so a reduce group's clients are split over nodes:
    ``add_nodes`` adds their level-0 sums row by row — one node gives the same bits, several
    give the in-process aggregate up to rounding, with the same counters and worst client."""
    from fedcf.federated.round.partials import add_nodes

    run, cohort, ids = _one_round_outputs(pop)
    hp, agg, ex = run.hyperparams, WeightedMean(), run.executor
    whole = agg(ex.run(cohort, run.params, ids), hp)
    one = agg.reduce(add_nodes([agg.partials(ex.run(cohort, run.params, ids), hp)]))
    np.testing.assert_array_equal(one.d_Q, whole.d_Q)
    node = np.arange(len(cohort.clients)) % 3  # every group's clients on several nodes
    parts = [agg.partials(ex.run(dataclasses.replace(cohort, clients=cohort.clients[node == k]),
                                 run.params, ids), hp) for k in range(3)]
    split = agg.reduce(add_nodes(parts))
    np.testing.assert_array_equal(split.items, whole.items)
    np.testing.assert_allclose(split.d_Q, whole.d_Q, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(split.d_b, whole.d_b, rtol=1e-12, atol=1e-15)
    assert split.summary == dataclasses.replace(whole.summary, loss=split.summary.loss)
    assert split.summary.loss == pytest.approx(whole.summary.loss, rel=1e-12)
    with pytest.raises(ValueError, match="level-0 sums"):
        add_nodes([parts[0].compact(0, 64)])


def test_the_reduced_mean_is_the_plain_weighted_mean(pop):
    run, cohort, ids = _one_round_outputs(pop)
    out = run.executor.run(cohort, run.params, ids)
    delta = WeightedMean()(out, run.hyperparams)
    K = out.d_Q.shape[1]
    num, den = np.zeros((pop.n_items, K)), 0.0  # the obvious twin: a dense loop over clients
    for k in range(out.n_clients):
        rows = slice(out.offsets[k], out.offsets[k + 1])
        keep = out.items[rows] >= 0
        num[out.items[rows][keep]] += out.weights[k] * out.d_Q[rows][keep]
        den += out.weights[k]
    np.testing.assert_allclose(delta.d_Q, (num / den)[delta.items], rtol=1e-10, atol=1e-12)
    assert delta.summary.n_used == int((out.weights > 0).sum()) > 0


def test_a_ray_executor_without_ray_installed_says_how_to_install_it(pop, monkeypatch):
    import sys

    from fedcf.federated import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails
    with pytest.raises(ImportError, match=r"pip install 'fedcf\[ray\]'"):
        FedReconMF(**FAST, executor=RayExecutor(2)).fit(pop)


def test_client_uploads_are_what_a_round_sends(pop):
    """The public transcript of one round at the fitted model equals the round's own outputs
    (n_rounds=0: the fitted model is the initial one, what round 0 broadcasts)."""
    m = FedReconMF(**{**FAST, "n_rounds": 0}).fit(pop)
    run = m._start(pop, None)
    cohort = run.select(0)
    want = run.executor.run(cohort, run.params, np.array([run.seed, 0], np.uint64))
    got = m.client_uploads(pop, cohort.clients, round_idx=0)
    for f in ("offsets", "items", "d_Q", "d_b", "weights", "losses", "clients"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f), err_msg=f)
    with pytest.raises(ValueError, match="clients must be a 1-D array of user positions"):
        m.client_uploads(pop, [pop.n_users])
    from fedcf import FedAvgMF

    with pytest.raises(ValueError, match="keeps user rows between rounds"):
        FedAvgMF(**FAST).fit(pop).client_uploads(pop, [0])


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0])
def test_item_normalized_mean_divides_each_row_by_its_own_clients_weight(power):
    """Each row's delta is Σ w Δ over the clients that touched it, divided by W^(1−p)·W_i^p;
    a client's two slots of one item count its weight once. Dividing by the cohort's weight
    (the plain mean) or counting a repeated slot twice fails here for p > 0."""
    from fedcf.federated import ItemNormalizedMean

    # client 0: items 1, 1 (a repeated slot), 2; client 1: item 2; client 2: item 3
    out = ClientOutputs(np.array([0, 3, 4, 5]), np.array([1, 1, 2, 2, 3]),
                        np.array([[1.0], [2.0], [4.0], [8.0], [16.0]]),
                        np.array([0.5, 0.5, 1.0, 1.0, 2.0]), np.array([2.0, 6.0, 4.0]),
                        np.zeros(3))
    hp = RoundHyperparams(1.0)
    d = ItemNormalizedMean(power)(out, hp)
    w, W = np.array([2.0, 6.0, 4.0]), 12.0
    sums = {1: (w[0] * 3.0, w[0] * 1.0), 2: (w[0] * 4 + w[1] * 8, w[0] + w[1]), 3: (w[2] * 16,
                                                                                   w[2] * 2)}
    touched = {1: w[0], 2: w[0] + w[1], 3: w[2]}
    np.testing.assert_array_equal(d.items, [1, 2, 3])
    for row, item in enumerate(d.items):
        denom = W ** (1 - power) * touched[item] ** power
        assert d.d_Q[row, 0] == pytest.approx(sums[item][0] / denom)
        assert d.d_b[row] == pytest.approx(sums[item][1] / denom)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "1", True, None])
def test_item_normalized_mean_names_a_bad_power(bad):
    from fedcf.federated import ItemNormalizedMean

    with pytest.raises(ValueError, match="power must be a number in"):
        ItemNormalizedMean(bad)


def test_small_kernels_run_on_the_calling_thread_and_the_count_comes_back():
    """fedcf._threads.small: below SERIAL_BELOW values the kernel sees one thread (no sleeping
    thread to wake), at or above it every thread; the caller's count is restored, also when
    the kernel raises."""
    import numba
    from numba import njit

    from fedcf import _threads

    @njit
    def seen(fail):
        if fail:
            raise ValueError("boom")
        return numba.get_num_threads()

    before = numba.get_num_threads()
    assert _threads.small(seen, 10, False) == 1
    assert numba.get_num_threads() == before
    assert _threads.small(seen, _threads.SERIAL_BELOW, False) == before
    with pytest.raises(ValueError, match="boom"):
        _threads.small(seen, 10, True)
    assert numba.get_num_threads() == before


def test_a_strided_delta_reaches_the_row_kernel_contiguous():
    """A server step on a column slice of a table (a named part's rows) must not make the row
    kernel compile a second, strided signature in every process that meets one."""
    from fedcf._kernels.server import sgd_rows

    rng = np.random.default_rng(0)
    Q = rng.normal(size=(6, 3)).astype(np.float32)
    table = rng.normal(size=(2, 5))
    delta = {"Q": table[:, :3], "b": table[:, 3]}  # strided views
    assert not delta["Q"].flags.c_contiguous
    opt, params = SGD(learning_rate=0.5), {"Q": Q.copy(), "b": np.zeros(6, np.float32)}
    state, params = opt.step_rows(opt.init(params), params, np.array([1, 4]), delta)
    np.testing.assert_allclose(params["Q"][[1, 4]], Q[[1, 4]] + 0.5 * table[:, :3], rtol=1e-6)
    assert all(sig[2].layout == "C" for sig in sgd_rows.signatures)
