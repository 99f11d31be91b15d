"""Contract tests every aggregator and executor must pass (after implicit's
RecommenderBaseTestMixin and scikit-learn's ``check_estimator``); they need pytest.

A new aggregator or executor is one class plus a test class that subclasses
``AggregatorContract`` or ``ExecutorContract`` and says how to make one (``make``); pytest
collects its ``test_*`` methods. Without a test suite, ``check_aggregator(make)`` and
``check_executor(make)`` run the same checks and raise on the first that fails.

Examples
--------
>>> from fedcf.federated import WeightedMean
>>> from fedcf.testing import check_aggregator
>>> "test_linear_means_reducible_from_partial_sums_in_any_split" in check_aggregator(WeightedMean)
True
"""

from __future__ import annotations

__all__ = ["AggregatorContract", "ExecutorContract", "check_aggregator", "check_executor"]

import dataclasses

import numpy as np
import pytest
from sklearn.base import clone

from . import FedReconMF
from .datasets import make_synthetic_ratings
from .federated import (
    Aggregator,
    ClientOutputs,
    Executor,
    GlobalDelta,
    LocalExecutor,
    RoundExecutor,
    RoundHyperparams,
    RunContext,
    WeightedMean,
)
from .federated.round.partials import PartialSums, reduce_group
from .federated.round.phases import Cohort

HP = RoundHyperparams(1.0, {}, 1.0)
N_ITEMS, K = 40, 3
CONTEXT = RunContext(n_eligible=500, clients_per_round=16, n_rounds=3, n_items=N_ITEMS,
                     n_factors=K, seed=7, eligible_weights=np.full(500, 4.0))


def uploads(m=16, per=5, seed=0, nonfinite=(), empty=()):
    """A cohort's outputs: client k touches ``per`` distinct items (one padding slot)."""
    rng = np.random.default_rng(seed)
    items = np.concatenate([rng.choice(N_ITEMS, per, replace=False) for _ in range(m)])
    items[per - 1::per] = -1  # a padding slot per client
    d_Q, d_b = rng.normal(0, 0.05, (m * per, K)), rng.normal(0, 0.05, m * per)
    for k in nonfinite:
        d_Q[k * per] = np.nan
    weights = rng.integers(1, 9, m).astype(float)
    weights[list(empty)] = 0.0
    clients = np.sort(rng.choice(10_000, m, replace=False))  # dense ids spread over groups
    return ClientOutputs(np.arange(0, m * per + 1, per), items, d_Q, d_b, weights,
                         rng.random(m), None, clients)


def _json_round_trip(obj):
    """A phase object as a saved model's metadata stores it (JSON) and back: the same class and
    parameters when registered; an unregistered class is refused on load, naming it."""
    import json

    from fedcf import registry

    data = json.loads(json.dumps(registry.encode(obj)))
    if registry.kind_of(type(obj)) is None:
        with pytest.raises(ValueError, match=f"{type(obj).__qualname__}, which is not registered"):
            registry.decode(data)
        return
    back = registry.decode(data)
    assert type(back) is type(obj) and repr(back) == repr(obj)


class AggregatorContract:
    """Subclasses set ``make`` (a function returning a fresh, unbound aggregator)."""

    make = staticmethod(WeightedMean)

    def test_is_an_aggregator_with_parameters(self):
        agg = self.make()
        assert isinstance(agg, Aggregator)
        params = agg.get_params(deep=False)
        again = type(agg)(**params)
        assert again.get_params(deep=False).keys() == params.keys()
        assert repr(agg).startswith(type(agg).__name__ + "(")
        with pytest.raises(ValueError, match="has no parameter 'no_such'"):
            agg.set_params(no_such=1)

    def test_clones_inside_an_estimator_and_exposes_nested_names(self):
        agg = self.make()
        est = FedReconMF(aggregator=agg)
        nested = {k for k in est.get_params() if k.startswith("aggregator__")}
        assert nested == {f"aggregator__{k}" for k in agg.get_params()}
        copy = clone(est)
        assert copy.aggregator is not agg and repr(copy.aggregator) == repr(agg)

    def test_bound_call_gives_a_finite_delta_on_sorted_rows(self):
        delta = self.make().bind(CONTEXT)(uploads(), HP, 1)
        assert isinstance(delta, GlobalDelta)
        assert np.all(np.diff(delta.items) > 0) and delta.items.min(initial=0) >= 0
        assert delta.items.max(initial=0) < N_ITEMS
        assert delta.d_Q.shape == (len(delta.items), K) and delta.d_b.shape == delta.items.shape
        assert np.isfinite(delta.d_Q).all() and np.isfinite(delta.d_b).all()
        assert delta.summary.n_clients == 16 and delta.summary.n_used > 0

    def test_non_finite_and_empty_uploads_are_left_out_and_counted(self):
        out = uploads(nonfinite=(2, 5), empty=(3,))
        delta = self.make().bind(CONTEXT)(out, HP, 1)
        assert np.isfinite(delta.d_Q).all() and np.isfinite(delta.d_b).all()
        assert delta.summary.n_nonfinite == 2 and delta.summary.n_empty == 1
        assert delta.summary.n_used <= 13

    def test_linear_means_reducible_from_partial_sums_in_any_split(self):
        agg = self.make().bind(CONTEXT)
        if not agg.linear:
            pytest.skip("not linear: it needs every upload")
        out = uploads()
        whole = agg(out, HP, 2)
        groups = reduce_group(out.clients)
        for cuts in ([0, 64], [0, 20, 64], [0, 5, 33, 40, 64]):
            parts = []
            for a, b in list(zip(cuts, cuts[1:]))[::-1]:
                sel = np.flatnonzero((groups >= a) & (groups < b))
                parts.append(agg.partials(out.take(sel), HP).compact(a, b))
            split = agg.reduce(PartialSums.concat(parts), 2)
            for f in ("items", "d_Q", "d_b"):
                np.testing.assert_array_equal(getattr(split, f), getattr(whole, f), err_msg=f)
            assert split.summary == whole.summary

    def test_declares_its_sampling_and_its_accountant(self):
        agg = self.make()
        assert agg.sampling in ("any", "poisson")
        bound = agg.bind(CONTEXT)
        acc = bound.accountant
        if acc is None:
            assert bound.sigma is None
            return
        # an accountant's amplification by subsampling needs Poisson sampling
        assert agg.sampling == "poisson" and bound.sigma > 0 and acc.epsilon() == 0.0
        q, sigma = bound.round_mechanism()
        assert q == CONTEXT.clients_per_round / CONTEXT.n_eligible and sigma == bound.sigma
        acc.compose(q, sigma, CONTEXT.n_rounds)
        assert acc.epsilon() > 0
        assert type(acc).from_state(acc.state()).epsilon() == acc.epsilon()
        assert agg.bind(CONTEXT).accountant.epsilon() == 0.0  # a fresh one per run

    def test_survives_a_saved_model_as_an_object(self):
        _json_round_trip(self.make())

    def test_set_params_is_checked_when_bound(self):
        agg = self.make()
        names = list(agg.get_params(deep=False))
        if not names:
            pytest.skip("no parameters")
        with pytest.raises((TypeError, ValueError)):
            agg.set_params(**{names[0]: "not a value"})
            agg.bind(CONTEXT)


@pytest.fixture(scope="module")
def contract_population():
    return make_synthetic_ratings(300, 50, 4000, n_factors=3, random_state=2)


class ExecutorContract:
    """Subclasses set ``make`` (a function returning a fresh executor spec)."""

    make = staticmethod(LocalExecutor)

    def _round(self, pop, executor):
        est = FedReconMF(n_factors=K, n_rounds=1, clients_per_round=60, random_state=0,
                         executor=executor)
        est._check_params()
        run = est._start(est._coerce(pop, None), None)
        clients = np.sort(np.random.default_rng(1).choice(pop.n_users, 60, replace=False))
        return run, Cohort(clients, 60, 0, 0), np.array([run.seed, 0], np.uint64)

    def test_is_an_executor_with_parameters(self):
        ex = self.make()
        assert isinstance(ex, Executor)
        assert repr(ex).startswith(type(ex).__name__ + "(")
        clone(FedReconMF(executor=ex))
        _json_round_trip(ex)

    def test_runs_a_cohort_as_the_local_executor_does(self, contract_population):
        run, cohort, ids = self._round(contract_population, self.make())
        ref, _, _ = self._round(contract_population, None)
        try:
            assert isinstance(run.executor, RoundExecutor)
            got = run.executor.run(cohort, run.params, ids)
            want = ref.executor.run(cohort, ref.params, ids)
            for f in dataclasses.fields(ClientOutputs):
                a, b = getattr(got, f.name), getattr(want, f.name)
                if b is None:
                    assert a is None, f.name
                else:
                    np.testing.assert_array_equal(a, b, err_msg=f.name)
            if run.executor.supports_partials:
                agg = WeightedMean()
                reduced = agg.reduce(run.executor.partials(cohort, run.params, ids, agg,
                                                           run.hyperparams))
                direct = agg(want, run.hyperparams)
                np.testing.assert_array_equal(reduced.d_Q, direct.d_Q)
        finally:
            run.executor.close()
            ref.executor.close()


def _run_checks(contract, make, **fixtures) -> list[str]:
    """Run each ``test_*`` method of ``contract`` with ``make``; the names of those that ran
    (a check that does not apply skips itself); the first failure raises."""
    if not callable(make) or isinstance(make, (Aggregator, Executor)):
        raise TypeError(f"make must be a function that returns a fresh, unbound object (a class "
                        f"or a lambda: check_aggregator(lambda: MyMean(5.0))), got "
                        f"{type(make).__name__} {make!r}")
    case = type(f"Check{contract.__name__}", (contract,), {"make": staticmethod(make)})()
    ran = []
    for name in sorted(n for n in dir(case) if n.startswith("test_")):
        method = getattr(case, name)
        wanted = {k: v for k, v in fixtures.items()
                  if k in method.__code__.co_varnames[:method.__code__.co_argcount]}
        try:
            method(**wanted)
        except pytest.skip.Exception:
            continue
        except (AssertionError, pytest.fail.Exception) as exc:  # pytest's Failed is no Exception
            raise AssertionError(f"{contract.__name__}.{name} failed for {make!r}: "
                                 f"{str(exc).strip() or type(exc).__name__}") from None
        ran.append(name)
    return ran


def check_aggregator(make) -> list[str]:
    """Run the aggregator contract on ``make()`` (a function returning a fresh, unbound
    aggregator); returns the checks that applied, raises ``AssertionError`` on a failure."""
    return _run_checks(AggregatorContract, make)


def check_executor(make) -> list[str]:
    """Run the executor contract on ``make()`` (a function returning a fresh executor spec)."""
    population = make_synthetic_ratings(300, 50, 4000, n_factors=3, random_state=2)
    return _run_checks(ExecutorContract, make, contract_population=population)
