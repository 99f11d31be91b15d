"""Federated Reconstruction core: optimizers, one round vs a slow NumPy Algorithm 1, threads,
resume, production knobs, guards, and behaviour on a synthetic population."""

import json

import numba
import numpy as np
import pytest
from sklearn.base import clone

from fedcf import FURLMF, FedAvgMF, FedReconMF
from fedcf import _reference as ref
from fedcf._kernels import clients as kcl
from fedcf._kernels.layout import SPLIT_TIME, client_cfg, sgd_hp
from fedcf.eval import recon_eval, standard_eval, user_split
from fedcf.federated import (
    ClientOutputs,
    ClientUpdate,
    RoundHyperparams,
    Selector,
    WeightedMean,
)
from fedcf.federated.algorithms.reconstruction import SGDReconstruction
from fedcf.registry import lookup


def make_server_optimizer(name, lr, opts=None):
    return lookup("server_optimizer", name)(lr, **(opts or {}))


def sample_round(seed, t, eligible, m, oversample=0.0, dropout=0.0):
    return Selector(seed, np.asarray(eligible), m, oversample, dropout)(t)


def aggregate(offsets, d_items, d_Q, d_b, weights, weighting="num_examples"):
    out = ClientOutputs(np.asarray(offsets, np.int64), np.asarray(d_items, np.int64), d_Q, d_b,
                        np.asarray(weights, float), np.zeros(len(weights)))
    return WeightedMean()(out, RoundHyperparams(1.0, {}, 1.0 if weighting == "num_examples" else 0.0))

# ---------------------------------------------------------------- server optimizers


@pytest.mark.parametrize("name,lr,opts", [("sgd", 0.7, {}), ("momentum", 0.5, {"momentum": 0.8}),
                                          ("adagrad", 0.3, {}), ("adam", 0.1, {}),
                                          ("yogi", 0.1, {})])
def test_optimizers_match_hand_formulas(name, lr, opts):
    opt = make_server_optimizer(name, lr, opts)
    x = {"w": np.array([1.0, -2.0, 0.5])}
    deltas = [np.array([0.1, -0.3, 0.0]), np.array([0.2, 0.1, -0.4]), np.array([-0.1, 0.0, 0.3])]
    state = opt.init(x)
    x0 = x["w"].copy()
    # hand-written
    w = x0.copy()
    v = np.zeros(3)
    a = np.full(3, 0.1)
    m = np.zeros(3)
    vy = np.full(3, 1e-6)
    for t, d in enumerate(deltas, 1):
        state, x = opt.step(state, x, {"w": d})
        g = -d
        if name == "sgd":
            w = w - lr * g
        elif name == "momentum":
            v = 0.8 * v + g
            w = w - lr * v
        elif name == "adagrad":
            a = a + g * g
            w = w - lr * g / (np.sqrt(a) + 1e-7)
        elif name == "adam":
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            w = w - lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-7)
        else:
            m = 0.9 * m + 0.1 * g
            vy = vy - 0.001 * g * g * np.sign(vy - g * g)
            w = w - lr * m / (np.sqrt(vy) + 1e-3)
        np.testing.assert_allclose(x["w"], w, rtol=1e-12)
    assert state["t"] == 3


def test_optimizer_step_is_pure():
    opt = make_server_optimizer("adam", 0.1)
    x = {"w": np.ones(2)}
    s = opt.init(x)
    s2, x2 = opt.step(s, x, {"w": np.ones(2)})
    assert np.all(x["w"] == 1) and s["t"] == 0 and np.all(s["m"]["w"] == 0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta3'"):
        make_server_optimizer("adam", 0.1, {"beta3": 1})
    with pytest.raises(ValueError, match="'lion' is not a registered server_optimizer"):
        make_server_optimizer("lion", 0.1)
    with pytest.raises(ValueError, match=r"Adam: beta1 must be a number in \[0.0, 1.0\)"):
        make_server_optimizer("adam", 0.1, {"beta1": 1.0})
    with pytest.raises(ValueError, match="Momentum: learning_rate must be a positive number"):
        make_server_optimizer("momentum", float("nan"))
    with pytest.raises(ValueError, match="has no parameter 'momentum'"):
        make_server_optimizer("adam", 0.1).set_params(momentum=0.9)


# ---------------------------------------------------------------- one round vs Algorithm 1


@pytest.mark.parametrize("biases,recon,split", [(True, "sgd", "random"), (False, "sgd", "random"),
                                                (True, "als", "time"), (False, "sgd", "none")])
def test_one_round_equals_slow_algorithm_1(small_population, biases, recon, split):
    inter, _ = small_population
    params = dict(n_factors=5, n_rounds=1, clients_per_round=12,
                  client_update=ClientUpdate(0.5, steps=3, batch_size=3),
                  reconstruction=SGDReconstruction(steps=4, learning_rate=0.1)
                  if recon == "sgd" else "als", split=split, biases=biases,
                  random_state=11, dtype="float64")
    model = FedReconMF(**params).fit(inter)
    seed = 11
    rng = np.random.default_rng([seed, 0xC0FFEE])
    Q0 = rng.uniform(-0.05, 0.05, (inter.n_items, 5))
    b0 = np.zeros(inter.n_items)
    mu = inter.values.mean() if biases else 0.0
    clients = sample_round(seed, 0, np.arange(inter.n_users), 12).clients
    p_ = model.get_params()
    rows, dq, db, _ = ref.fedrecon_round(
        (inter.indptr, inter.items, inter.values), clients, Q0, b0, seed=seed, round_idx=0,
        split=split, support_fraction=0.5, recon=recon, init_scale=0.05,
        ridge=(0.1, model._recon_lam0()), recon_hp=sgd_hp(0.1, 0.0, 3, 4, 1, mu, biases),
        update_hp=sgd_hp(0.5, 0.0, 3, 3, 1, mu, biases))
    assert p_["client_update__steps"] == 3 and p_["client_update__batch_size"] == 3
    assert recon == "als" or p_["reconstruction__steps"] == 4
    Q1, b1 = Q0.copy(), b0.copy()
    Q1[rows] += dq  # server SGD, lr 1.0
    if biases:
        b1[rows] += db
    np.testing.assert_allclose(model.item_factors_, Q1, rtol=1e-8, atol=1e-11)
    np.testing.assert_allclose(model.item_biases_, b1, rtol=1e-8, atol=1e-11)
    assert not np.array_equal(Q1, Q0)


def test_client_output_carries_no_local_params(small_population):
    inter, _ = small_population
    K, n_items = 4, inter.n_items
    Q = np.random.default_rng(0).normal(0, 0.1, (n_items, K))
    b = np.zeros(n_items)
    clients = np.arange(10, dtype=np.int64)
    cfg = client_cfg("time", 0.5, "als", "uniform", 0.05, 0.1, 1e-4)
    qs = kcl.query_sizes(inter.counts()[clients], SPLIT_TIME, 0.5)
    offsets = np.r_[0, np.cumsum(qs)].astype(np.int64)
    outs = []
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):  # the same outputs
            numba.set_num_threads(threads)
            out = (offsets, np.empty(offsets[-1], np.int64), np.empty((offsets[-1], K)),
                   np.empty(offsets[-1]), np.full(10, np.nan))
            kcl.fedrecon_clients((inter.indptr, inter.items, inter.values), clients, (Q, b), cfg,
                                  sgd_hp(0.1, 0, 5, 50, 1, 3.5, True),
                                  sgd_hp(0.5, 0, 5, 50, 1, 3.5, True),
                                  np.array([1, 0], np.uint64), out)
            for x, y in zip(out, outs[0] if outs else out):
                np.testing.assert_array_equal(x, y)
            outs.append(out)
    finally:
        numba.set_num_threads(before)
    # the only outputs: item ids, item-row deltas, item-bias deltas, losses
    _, d_items, d_Q, d_b, losses = out
    assert d_Q.shape == (offsets[-1], K) and d_b.shape == (offsets[-1],)
    for k, u in enumerate(clients):
        s0, e0 = inter.indptr[u], inter.indptr[u + 1]
        n_s = e0 - s0 - qs[k]
        query_items = set(inter.items[s0 + n_s:e0].tolist())  # time split: newest are query
        sent = set(d_items[offsets[k]:offsets[k + 1]].tolist()) - {-1}
        assert sent == query_items, "a client sends deltas for exactly its query items"
    assert np.all(np.isfinite(losses))


# ---------------------------------------------------------------- determinism and resume


def test_identical_with_one_and_two_threads(small_population):
    inter, _ = small_population
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            for cls, kw in ((FedReconMF, dict(reconstruction="sgd")), (FedReconMF, {}),
                            (FedAvgMF, {})):
                m = cls(n_factors=4, n_rounds=3, clients_per_round=50, random_state=2, **kw)
                m.fit(inter)
                results.append((threads, cls.__name__, m.item_factors_.copy()))
    finally:
        numba.set_num_threads(before)
    half = len(results) // 2
    for a, b in zip(results[:half], results[half:]):
        assert np.array_equal(a[2], b[2]), a[1]


@pytest.mark.parametrize("cls", [FedReconMF, FURLMF])
def test_resume_equals_uninterrupted(tmp_path, small_population, cls):
    inter, _ = small_population
    kw = dict(n_factors=4, clients_per_round=40, random_state=3,
              server_optimizer=make_server_optimizer("adam", 0.05))
    full = cls(n_rounds=6, **kw).fit(inter)
    ck = tmp_path / "ck.npz"
    cls(n_rounds=3, checkpoint_path=str(ck), **kw).fit(inter)
    resumed = cls(n_rounds=6, checkpoint_path=str(ck), **kw).fit(inter)
    assert np.array_equal(full.item_factors_, resumed.item_factors_)
    assert [h["loss"] for h in full.history_] == [h["loss"] for h in resumed.history_]
    if cls is FURLMF:
        assert np.array_equal(full.user_factors_, resumed.user_factors_)
    # a run with other parameters refuses the checkpoint and leaves it as it was
    before = ck.read_bytes()
    with pytest.raises(ValueError, match=r"written with server_optimizer=Adam\(learning_rate=0.05"):
        cls(n_rounds=6, checkpoint_path=str(ck),
            **{**kw, "server_optimizer": make_server_optimizer("adam", 0.1)}).fit(inter)
    assert ck.read_bytes() == before


# ---------------------------------------------------------------- production knobs and guards


def test_sampling_knobs():
    eligible = np.arange(0, 1000, 2)
    s = sample_round(0, 5, eligible, 100)
    assert len(s.clients) == 100 and len(set(s.clients.tolist())) == 100
    assert set(s.clients.tolist()) <= set(eligible.tolist())
    s2 = sample_round(0, 5, eligible, 100, oversample=0.5, dropout=0.3)
    assert s2.n_sampled == 150 and s2.n_dropped > 0
    assert len(s2.clients) == min(100, 150 - s2.n_dropped)
    assert s2.n_surplus == 150 - s2.n_dropped - len(s2.clients)
    assert np.array_equal(sample_round(0, 5, eligible, 100).clients, s.clients)


def test_min_examples_and_dropout_in_history(small_population):
    inter, _ = small_population
    counts = inter.counts()
    m = FedReconMF(n_factors=3, n_rounds=4, clients_per_round=30, min_examples=20, dropout=0.4,
                   oversample=0.5, random_state=0).fit(inter)
    for h in m.history_:
        assert h["clients_used"] <= 30 and h["clients_sampled"] == 45
        assert h["clients_dropped"] + h["clients_surplus"] + h["clients_used"] + \
            h["clients_empty"] + h["clients_nonfinite"] == 45
    assert sum(h["clients_dropped"] for h in m.history_) > 0
    eligible = np.flatnonzero(counts >= 20)
    for t in range(4):
        assert set(sample_round(m._seed(), t, eligible, 30, oversample=0.5,
                                dropout=0.4).clients.tolist()) <= set(eligible.tolist())
    with pytest.raises(ValueError, match="no client has at least min_examples=100000"):
        FedReconMF(min_examples=100_000).fit(inter)


def test_nonfinite_client_updates_are_dropped():
    K = 2
    offsets = np.array([0, 2, 3, 5])
    d_items = np.array([0, 1, 1, 0, 2])
    d_Q = np.ones((5, K))
    d_Q[2, 0] = np.nan  # client 1 is broken
    d_b = np.ones(5)
    weights = np.array([2.0, 1.0, 2.0])
    agg = aggregate(offsets, d_items, d_Q, d_b, weights)
    assert agg.summary.n_nonfinite == 1 and agg.n_used == 2
    # mean over clients 0 and 2 only (weights 2, 2): item 0 touched by both, 1 by 0, 2 by 2
    np.testing.assert_allclose(agg.d_Q[:, 0], [1.0, 0.5, 0.5])
    assert agg.items.tolist() == [0, 1, 2]
    uni = aggregate(offsets, d_items, np.ones((5, K)), d_b, np.array([5.0, 1.0, 0.0]), "uniform")
    np.testing.assert_allclose(uni.d_Q[:, 0], [0.5, 1.0])  # clients 0, 1 equally; 2 empty
    assert uni.n_empty == 1


def test_divergence_raises_and_names_the_knob(small_population):
    inter, _ = small_population
    with pytest.raises(FloatingPointError, match=r"lower the server optimizer's learning rate "
                                                 r"\(server_optimizer=SGD\(learning_rate=1000000.0\)"):
        FedReconMF(n_factors=3, n_rounds=30, server_optimizer=make_server_optimizer("sgd", 1e6),
                   random_state=0).fit(inter)
    with pytest.raises(FloatingPointError, match=r"client_update__learning_rate, now 5.0"):
        FedReconMF(n_factors=3, n_rounds=30, client_update=ClientUpdate(5.0, batch_size=1),
                   random_state=0).fit(inter)


# ---------------------------------------------------------------- API and behaviour


def test_estimator_api_and_bad_params(small_population):
    inter, _ = small_population
    m = FedReconMF(n_rounds=2, n_factors=3)
    assert clone(m).get_params() == m.get_params()
    assert not hasattr(m, "item_factors_")
    assert m.fit(inter) is m
    for bad, match in [(dict(split="halves"), "'halves' is not a registered split"),
                       (dict(reconstruction="exact"), "'exact' is not a registered reconstruction"),
                       (dict(server_optimizer="lion"), "'lion' is not a registered server_optimizer"),
                       (dict(dropout=1.0), "dropout must be < 1"),
                       (dict(clients_per_round=0), "clients_per_round must be >= 1")]:
        with pytest.raises(ValueError, match=match):
            FedReconMF(**bad).fit(inter)


@pytest.mark.parametrize("cls,kw", [(FedReconMF, {}),
                                    (FedReconMF, dict(reconstruction=SGDReconstruction(
                                        learning_rate=0.5), init_scale=0.2)),
                                    (FedAvgMF, dict(init_scale=0.2, n_rounds=300))])
def test_recovers_low_rank_population_for_unseen_users(cls, kw):
    from fedcf.datasets import make_synthetic_ratings

    inter = make_synthetic_ratings(1500, 150, 60_000, n_factors=4, noise=0.2, bias_scale=0.1,
                                   random_state=4)
    tr, _, te = user_split(inter, (0.8, 0.1, 0.1), random_state=0)
    m = cls(**{"n_factors": 8, "n_rounds": 150, "clients_per_round": 50, "random_state": 0, **kw})
    m.fit(tr)
    res = recon_eval(m, te, n_repeats=20)
    _, q = __import__("fedcf.eval", fromlist=["x"]).support_query_split(te, "random", 0.5, 0)
    baseline = np.sqrt(np.mean((q.values - tr.values.mean()) ** 2))
    assert res["rmse"] < 0.8 * baseline, (res["rmse"], baseline)


def test_standard_eval_and_predict_for_seen_users(small_population):
    from fedcf.eval import per_user_time_split

    inter, _ = small_population
    tr, _, te = per_user_time_split(inter)
    m = FedReconMF(n_factors=4, n_rounds=20, clients_per_round=50, random_state=0).fit(tr)
    res = standard_eval(m, te, n_repeats=10)
    assert np.isfinite(res["rmse"]) and res["n_users"] > 0
    assert {"rmse_mean", "rmse_std"} <= set(res["bootstrap"])
    df = te.to_dataframe()
    np.testing.assert_allclose(m.predict(df)[:5], m.predict(df.iloc[:5]))


def test_benchmark_quick_runs_and_writes_json(tmp_path):
    from conftest import load_script

    bench = load_script("movielens_benchmark")
    out = tmp_path / "rows.json"
    bench.main(["--dataset", "synthetic", "--quick", "--no-progress", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert len(rows) == 14
    for r in rows:
        assert {"name", "protocol", "rmse", "accuracy", "seconds"} <= set(r)
    meta = rows[0]["meta"]
    assert meta["background_compile"] and meta["compile_seconds"] >= 0
    assert 0 < meta["first_row_done_seconds"] < meta["total_seconds"]
    tuned = bench.main(["--dataset", "synthetic", "--quick", "--no-progress", "--tune",
                        "--no-background-compile"])
    names = [r["name"] for r in tuned]
    assert "FedRecon (paper config, lrs tuned on validation users)" in names
    assert sum(n.startswith("grid eta_s=") for n in names) == 12
    assert sum(bool(r.get("selected")) for r in tuned) == 1
    rows = bench.main(["--dataset", "synthetic", "--quick", "--no-progress", "--sweep",
                       "update-steps", "--plot-dir", str(tmp_path)])
    assert [r["value"] for r in rows] == [1, 2, 5, 10, 50]
    png = tmp_path / "sweep_update-steps.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stateful_kernel_updates_exactly_the_sampled_user_rows(small_population):
    """Pins the writes numba's parfor pass once dropped (see fedcf/_kernels/util.py)."""
    inter, _ = small_population
    K = 3
    rng = np.random.default_rng(0)
    Q = rng.normal(0, 0.1, (inter.n_items, K))
    b = np.zeros(inter.n_items)
    P = rng.normal(0, 0.1, (inter.n_users, K))
    c = np.zeros(inter.n_users)
    P0 = P.copy()
    clients = np.array([3, 10, 77], np.int64)
    counts = inter.counts()[clients]
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    out = (offsets, np.empty(offsets[-1], np.int64), np.empty((offsets[-1], K)),
           np.empty(offsets[-1]), np.full(3, np.nan))
    kcl.stateful_clients((inter.indptr, inter.items, inter.values), clients, (Q, b), (P, c),
                          sgd_hp(0.1, 0, 5, 50, 1, 3.5, True, True), np.array([0, 0], np.uint64),
                          out)
    changed = np.flatnonzero(np.any(P != P0, axis=1))
    assert changed.tolist() == clients.tolist()
    assert np.all(c[clients] != 0) and np.all(np.isfinite(out[4]))
    # each client's user row equals the twin's joint training of that user
    for k, u in enumerate(clients):
        s0, e0 = inter.indptr[u], inter.indptr[u + 1]
        _, dq, _, p, cu = ref.item_steps_user(inter.items[s0:e0], inter.values[s0:e0], Q, b,
                                              sgd_hp(0.1, 0, 5, 50, 1, 3.5, True, True), P0[u],
                                              0.0, ref.stream_key(0, 0, int(u)))
        np.testing.assert_allclose(P[u], p, rtol=1e-10)
        np.testing.assert_allclose(out[2][offsets[k]:offsets[k] + len(dq)], dq, rtol=1e-10)


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_sparse_server_step_equals_dense(name):
    rng = np.random.default_rng(0)
    opt = make_server_optimizer(name, 0.3)
    Q = rng.normal(size=(20, 3)).astype(np.float32)
    rows = np.array([1, 4, 9])
    d = rng.normal(size=(3, 3))
    dense = np.zeros((20, 3))
    dense[rows] = d
    s_dense, p_dense = opt.step(opt.init({"Q": Q}), {"Q": Q}, {"Q": dense})
    s_dense, p_dense = opt.step(s_dense, p_dense, {"Q": dense})
    Q2 = Q.copy()
    st = opt.init({"Q": Q2})
    st, p_sp = opt.step_rows(st, {"Q": Q2}, rows, {"Q": d})
    st, p_sp = opt.step_rows(st, p_sp, rows, {"Q": d})
    np.testing.assert_allclose(p_sp["Q"], p_dense["Q"], rtol=1e-6)
    assert st["t"] == 2
    with pytest.raises(ValueError, match="no sparse path"):
        make_server_optimizer("adam", 0.1).step_rows(st, {"Q": Q2}, rows, {"Q": d})


def test_diverging_sgd_reconstruction_warns_clearly(small_population):
    inter, _ = small_population
    m = FedReconMF(n_factors=3, n_rounds=3, clients_per_round=20, reconstruction="sgd",
                   random_state=0).fit(inter)
    m.reconstruction = SGDReconstruction(learning_rate=1e6)  # a wild value set after fitting
    with pytest.warns(RuntimeWarning, match=r"SGD reconstruction diverged for \d+ of 400 users"):
        P, _ = m.reconstruct_users(inter)
    assert np.isnan(P).any()


@pytest.mark.parametrize("name", ["FedReconMF", "FedAvgMF", "FURLMF", "FedReconImplicitMF",
                                  "FedMF", "PFedRec", "FedNCF"])
def test_init_scale_sets_the_spread_of_the_initial_item_rows(name):
    """Every federated estimator's initial item rows scale with ``init_scale`` (a mutant that
    ignores it, or applies it to the dense rows only, fails)."""
    import fedcf
    from fedcf.datasets import make_synthetic_ratings

    data = make_synthetic_ratings(200, 60, 3000, random_state=0)
    spread = []
    for scale in (0.01, 0.2):
        est = getattr(fedcf, name)(n_factors=4, init_scale=scale, random_state=0)
        est._check_params()
        inter = est._coerce(data, None)
        rows = est._init_globals(inter, np.random.default_rng(0), np.float32)["Q"][:inter.n_items]
        spread.append(float(np.std(rows)))
    assert spread[1] / spread[0] == pytest.approx(20.0, rel=1e-3)
