"""Early stopping on held-out users: the kept model is the best checked round's, the held-out
users never train, patience stops the run, a checkpoint resumes it exactly, bad settings are
refused by name."""

import numpy as np
import pytest

from fedcf import FedReconMF
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import (
    Adam,
    DPGaussianMean,
    EarlyStopping,
    OpenCatalog,
    SecureAggregation,
)


@pytest.fixture(scope="module")
def pop():
    return make_synthetic_ratings(300, 80, 6000, random_state=0)


def model(n_rounds=60, **es):
    """A run whose held-out loss turns up before its last round (a large server step)."""
    return FedReconMF(n_factors=8, n_rounds=n_rounds, clients_per_round=30, random_state=0,
                      server_optimizer=Adam(0.2, epsilon=1e-3),
                      early_stopping=EarlyStopping(every=5, **es))


def checks(m):
    return [(h["round"] + 1, h["validation_rmse"]) for h in m.history_ if "validation_rmse" in h]


def test_the_kept_model_is_the_best_checked_rounds(pop):
    m = model().fit(pop)
    done = checks(m)
    assert [d for d, _ in done] == list(range(5, 61, 5))  # every 5 rounds, the last one too
    best = min(done, key=lambda c: c[1])[0]
    assert m.best_round_ == best < 60  # this run gets worse after it: the last is not kept
    shorter = model(n_rounds=best).fit(pop)  # the same run stopped there
    np.testing.assert_array_equal(m.item_factors_, shorter.item_factors_)
    np.testing.assert_array_equal(m.item_biases_, shorter.item_biases_)
    assert len(m.history_) == 60


def test_patience_stops_after_that_many_checks_without_progress(pop):
    full = checks(model().fit(pop))
    m = model(patience=2).fit(pop)
    rmse = [r for _, r in full]
    first = next(i for i in range(len(rmse) - 2)  # first best check followed by two worse
                 if min(rmse[:i + 1]) == rmse[i] and min(rmse[i + 1:i + 3]) >= rmse[i])
    assert len(m.history_) == full[first + 2][0]
    assert m.best_round_ == full[first][0] and checks(m) == full[:first + 3]


def test_held_out_users_never_train_and_only_their_loss_moves(pop):
    m = model(n_rounds=20).fit(pop)
    held = m.validation_users_
    assert 0 < len(held) == round(0.1 * pop.n_users)
    changed = pop.to_dataframe()
    for u in held[:5]:  # their ratings shuffled among their items: μ and the scale stay put
        mine = (changed["user"] == u).to_numpy()
        changed.loc[mine, "rating"] = changed.loc[mine, "rating"].to_numpy()[::-1]
    other = model(n_rounds=20).fit(changed)
    np.testing.assert_array_equal(other.validation_users_, held)
    assert [h["loss"] for h in other.history_] == [h["loss"] for h in m.history_]
    assert [r for _, r in checks(other)] != [r for _, r in checks(m)]


def test_a_resumed_run_keeps_the_best_round_of_before_the_interruption(pop, tmp_path):
    whole = model().fit(pop)
    assert whole.best_round_ <= 40
    ck = str(tmp_path / "run.npz")
    model(n_rounds=40).set_params(checkpoint_path=ck, checkpoint_every=10).fit(pop)
    resumed = model().set_params(checkpoint_path=ck, checkpoint_every=10).fit(pop)
    assert resumed.best_round_ == whole.best_round_
    np.testing.assert_array_equal(resumed.item_factors_, whole.item_factors_)
    assert checks(resumed) == checks(whole)


@pytest.mark.parametrize("aggregator", [DPGaussianMean(1.0, 1.0), SecureAggregation()])
def test_refused_where_the_losses_would_leak(pop, aggregator):
    with pytest.raises(ValueError, match="early_stopping.*in the clear"):
        model().set_params(aggregator=aggregator).fit(pop)


def test_decay_is_refused_with_learned_hyperparameters(pop):
    from fedcf.federated import SGD, Hypergradients

    with pytest.raises(ValueError, match="early_stopping__decay"):
        model(decay=0.5).set_params(server_optimizer=SGD(1.0),
                                    hypergradients=Hypergradients()).fit(pop)


def test_refused_without_a_support_query_split(pop):
    with pytest.raises(ValueError, match="split='none'"):
        model().set_params(split="none").fit(pop)


def test_refused_with_an_open_item_space(pop):
    with pytest.raises(ValueError, match="early_stopping=.*open item"):
        model().set_params(item_space=OpenCatalog(np.arange(40))).fit(pop)


@pytest.mark.parametrize("bad,name", [
    (dict(holdout=0), "holdout"), (dict(holdout=0.6), "holdout"), (dict(holdout=True), "holdout"),
    (dict(holdout="0.1"), "holdout"), (dict(every=0), "every"), (dict(every=2.5), "every"),
    (dict(patience=0), "patience"), (dict(max_holdout=0), "max_holdout"),
    (dict(holdout=float("nan")), "holdout")])
def test_bad_settings_are_named(bad, name):
    with pytest.raises(ValueError, match=name):
        EarlyStopping(**bad)


def test_a_holdout_that_leaves_nobody_on_a_side_is_refused():
    tiny = make_synthetic_ratings(4, 10, 30, random_state=0)
    with pytest.raises(ValueError, match="holds out 0 of the 4"):
        FedReconMF(n_factors=2, n_rounds=2, early_stopping=EarlyStopping()).fit(tiny)
    with pytest.raises(ValueError, match="early_stopping"):
        FedReconMF(n_factors=2, n_rounds=2, early_stopping="none").fit(tiny)


def test_nested_parameters_and_the_registered_name():
    m = FedReconMF(early_stopping="default").set_params(early_stopping__patience=3)
    assert m.get_params()["early_stopping__patience"] == 3
    assert isinstance(m.early_stopping, EarlyStopping)


def test_decay_goes_back_to_the_best_round_on_a_smaller_step(pop):
    """Two checks in a row without progress: the run continues from the best round's model with
    the server step times decay (the next round's step is the decayed one)."""
    m = model(decay=0.5).fit(pop)
    plain = checks(model().fit(pop))
    rmse = [r for _, r in plain]
    second_miss = next(i for i in range(2, len(rmse))  # the first two misses in a row
                       if rmse[i] >= min(rmse[:i - 1]) and rmse[i - 1] >= min(rmse[:i - 1]))
    decays = [h["validation_decays"] for h in m.history_ if "validation_decays" in h]
    assert decays[:second_miss] == [0] * second_miss and decays[second_miss] == 1
    rates = [h["server_learning_rate"] for h in m.history_ if "validation_decays" in h]
    assert rates == [0.2 * 0.5 ** d for d in decays]  # the step the next rounds take
    assert checks(m)[:second_miss + 1] == plain[:second_miss + 1]  # identical until then
    assert checks(m)[second_miss + 1:] != plain[second_miss + 1:]


def test_a_resumed_run_with_decay_equals_one_run(pop, tmp_path):
    whole = model(decay=0.5).fit(pop)
    assert max(h.get("validation_decays", 0) for h in whole.history_[:30]) >= 1
    ck = str(tmp_path / "run.npz")
    model(n_rounds=30, decay=0.5).set_params(checkpoint_path=ck, checkpoint_every=10).fit(pop)
    resumed = model(decay=0.5).set_params(checkpoint_path=ck, checkpoint_every=10).fit(pop)
    assert checks(resumed) == checks(whole) and resumed.best_round_ == whole.best_round_
    np.testing.assert_array_equal(resumed.item_factors_, whole.item_factors_)


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.5, "half"])
def test_a_decay_outside_zero_one_is_named(bad):
    with pytest.raises(ValueError, match="decay"):
        EarlyStopping(decay=bad)


@pytest.fixture(scope="module")
def many():
    return make_synthetic_ratings(600, 60, 9000, random_state=3)


def test_auto_holds_out_users_and_runs_adam_on_a_large_enough_population(many, pop):
    """The defaults ("auto"): 500 eligible users or more, a plain aggregator → Adam(0.0175,
    ε = 1e-3) and EarlyStopping(max_holdout=100, decay=0.5, average=0.97); fewer users, DP, secure
    aggregation or learned hyperparameters → the paper's SGD(1.0) and the last round."""
    from fedcf.federated import SGD, Hypergradients

    m = FedReconMF(n_factors=4, n_rounds=10, clients_per_round=50, random_state=0).fit(many)
    assert repr(m.server_optimizer_) == repr(Adam(0.0175, epsilon=1e-3))
    assert repr(m.early_stopping_) == repr(EarlyStopping(max_holdout=100, decay=0.5,
                                                         average=0.97))
    assert len(m.validation_users_) == 60 and m.best_round_ is not None
    explicit = FedReconMF(n_factors=4, n_rounds=10, clients_per_round=50, random_state=0,
                          server_optimizer=Adam(0.0175, epsilon=1e-3),
                          early_stopping=EarlyStopping(max_holdout=100, decay=0.5,
                                                       average=0.97)).fit(many)
    np.testing.assert_array_equal(m.item_factors_, explicit.item_factors_)
    off = [({}, pop),  # 300 users: below 500
           ({"aggregator": DPGaussianMean(1.0, 1.0), "rating_scale": (1, 5)}, many),
           ({"aggregator": SecureAggregation()}, many),
           ({"hypergradients": Hypergradients()}, many), ({"split": "none"}, many)]
    for kw, data in off:
        f = FedReconMF(n_factors=4, n_rounds=2, clients_per_round=50, random_state=0,
                       **kw).check_params()
        f._resolve_auto(data)
        assert f._early_stopping() is None and repr(f._server_optimizer()) == repr(SGD(1.0)), kw


def test_auto_keeps_the_sparse_step_on_a_catalog_too_large_for_adams_state(many, monkeypatch):
    from fedcf.federated import SGD
    from fedcf.federated.algorithms import fedrecon

    monkeypatch.setattr(fedrecon, "AUTO_MAX_DENSE", 60 * 5 - 1)  # 60 items × (K + 1) = 300
    m = FedReconMF(n_factors=4, n_rounds=10, clients_per_round=50, random_state=0).fit(many)
    assert repr(m.server_optimizer_) == repr(SGD(1.0)) and m.early_stopping_ is not None
    assert m.early_stopping_.average is None  # the average is as dense as Adam's state
    monkeypatch.setattr(fedrecon, "AUTO_MAX_DENSE", 60 * 5)
    m = FedReconMF(n_factors=4, n_rounds=10, clients_per_round=50, random_state=0).fit(many)
    assert repr(m.server_optimizer_) == repr(Adam(0.0175, epsilon=1e-3))


def test_auto_has_no_nested_parameters_before_fit():
    with pytest.raises(ValueError, match="server_optimizer='auto' is chosen at fit"):
        FedReconMF().set_params(server_optimizer__learning_rate=0.1)
    m = FedReconMF().set_params(server_optimizer="adam", server_optimizer__learning_rate=0.1)
    assert m.server_optimizer.learning_rate == 0.1


def test_a_flower_run_settles_auto_to_every_round():
    from fedcf.flower.settings import Settings

    est = Settings(params={"n_factors": 4}).check().estimator()
    assert est.early_stopping is None and est.server_optimizer == "auto"


def _round_params(pop, monkeypatch, **es):
    """Each round's global parameters (float64 copies) of ``model(**es)``, spied at its checks."""
    from fedcf.federated.algorithms import early_stopping as mod

    seen, check = [], mod.Validation.check

    def spy(self, run, done):
        seen.append({k: v.astype(np.float64) for k, v in run.params.items()})
        return check(self, run, done)
    monkeypatch.setattr(mod.Validation, "check", spy)
    m = model(**es).fit(pop)
    monkeypatch.setattr(mod.Validation, "check", check)
    return m, seen


def test_averaging_checks_and_keeps_the_running_average_of_the_rounds(pop, monkeypatch):
    """avg ← β·avg + (1 − β)·params after every round; the checks score the average, the kept
    model is the best checked average, and the rounds themselves train as without it."""
    beta = 0.8
    plain, rounds = _round_params(pop, monkeypatch)
    avg = model(average=beta).fit(pop)
    assert [h["loss"] for h in avg.history_] == [h["loss"] for h in plain.history_]
    assert [r for _, r in checks(avg)] != [r for _, r in checks(plain)]
    ema = {k: v.copy() for k, v in rounds[0].items()}
    for p in rounds[1:avg.best_round_]:
        for k in ema:
            ema[k] = beta * ema[k] + (1 - beta) * p[k]
    np.testing.assert_array_equal(avg.item_factors_, ema["Q"].astype(avg.item_factors_.dtype))
    assert avg.best_round_ == min(checks(avg), key=lambda c: c[1])[0]


def test_a_resumed_averaging_run_equals_one_run(pop, tmp_path):
    whole = model(decay=0.5, average=0.9).fit(pop)
    ck = str(tmp_path / "run.npz")
    model(n_rounds=30, decay=0.5, average=0.9).set_params(checkpoint_path=ck,
                                                          checkpoint_every=10).fit(pop)
    resumed = model(decay=0.5, average=0.9).set_params(checkpoint_path=ck,
                                                       checkpoint_every=10).fit(pop)
    assert checks(resumed) == checks(whole) and resumed.best_round_ == whole.best_round_
    np.testing.assert_array_equal(resumed.item_factors_, whole.item_factors_)


def test_a_checkpoint_without_its_running_average_is_refused_and_kept(pop, tmp_path):
    ck = tmp_path / "run.npz"
    model(n_rounds=20, average=0.9).set_params(checkpoint_path=str(ck),
                                               checkpoint_every=10).fit(pop)
    with np.load(ck) as z:
        arrays = {k: z[k] for k in z.files if k != "avg_Q"}
    np.savez(ck, **arrays)
    before = ck.read_bytes()
    with pytest.raises(ValueError, match="running average's 'Q' is missing or damaged"):
        model(average=0.9).set_params(checkpoint_path=str(ck), checkpoint_every=10).fit(pop)
    assert ck.read_bytes() == before


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.5, "0.9", float("nan"), True])
def test_an_average_outside_zero_one_is_named(bad):
    with pytest.raises(ValueError, match="average"):
        EarlyStopping(average=bad)
