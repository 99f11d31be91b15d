"""SyntheticPopulation: a population described by a few numbers, built block by block in any
process with the same ratings."""

import pickle

import numpy as np
import pytest

from fedcf import FedReconMF
from fedcf.datasets import Interactions, SyntheticPopulation
from fedcf.datasets.population import BLOCKS
from fedcf.federated.round.partials import REDUCE_GROUPS


def test_blocks_are_the_reduce_groups():
    # a Ray shard holds whole reduce groups and builds exactly their blocks
    assert BLOCKS == REDUCE_GROUPS


def test_any_set_of_blocks_builds_the_same_ratings_as_the_whole():
    pop = SyntheticPopulation(1000, 80, ratings_per_user=12, random_state=4)
    indptr, items, values = pop.build()
    assert indptr.shape == (1001,) and indptr[-1] == len(items) == len(values)
    part = pop.build([5, 63, 0])
    for u in (0, 5, 63, 64, 69, 999 - (999 % 64) + 5):
        if u >= 1000:
            continue
        full = slice(indptr[u], indptr[u + 1])
        mine = slice(part[0][u], part[0][u + 1])
        np.testing.assert_array_equal(part[1][mine], items[full])
        np.testing.assert_array_equal(part[2][mine], values[full])
    assert part[0][2] == part[0][3]  # user 2 (block 2) is not built
    again = SyntheticPopulation(1000, 80, ratings_per_user=12, random_state=4).build()
    np.testing.assert_array_equal(again[2], values)


def test_ratings_are_whole_stars_on_distinct_items_and_activity_is_heavy_tailed():
    pop = SyntheticPopulation(5000, 300, ratings_per_user=20, random_state=1)
    inter = pop.to_interactions()
    assert isinstance(inter, Interactions) and inter.n_users == 5000
    assert set(np.unique(inter.values)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    counts = inter.counts()
    assert counts.min() >= 1 and 12 < counts.mean() < 22 and counts.max() > 4 * counts.mean()
    for u in range(0, 5000, 97):
        it = inter.items[inter.indptr[u]:inter.indptr[u + 1]]
        assert np.all(np.diff(it) > 0)  # ascending, distinct
    pop_items = np.bincount(inter.items, minlength=300)
    assert pop_items.max() > 10 * np.median(pop_items)  # popularity is skewed


def test_fit_accepts_it_and_learns():
    from fedcf.eval import recon_eval, user_split

    pop = SyntheticPopulation(600, 60, ratings_per_user=25, n_factors=3, random_state=2)
    FedReconMF(n_factors=3, n_rounds=2, clients_per_round=60, random_state=0).fit(pop)
    train, test = user_split(pop.to_interactions(), (0.8, 0.2), random_state=0)
    m = FedReconMF(n_factors=3, n_rounds=100, clients_per_round=60, random_state=0).fit(train)
    assert recon_eval(m, test)["rmse"] < 0.95 * test.values.std()  # beats the global mean
    with pytest.raises(TypeError, match="'rating_col' does not apply to a SyntheticPopulation"):
        FedReconMF(n_rounds=1).fit(pop, rating_col="x")


def test_a_population_too_large_for_this_machine_is_refused_before_building():
    huge = SyntheticPopulation(10**11, 1000, ratings_per_user=50)
    with pytest.raises(MemoryError, match=r"needs about .* GiB, more than this machine"):
        huge.to_interactions()
    with pytest.raises(MemoryError, match="lower n_users or ratings_per_user"):
        huge.build([0, 1])


@pytest.mark.parametrize("kw,match", [
    (dict(n_users=0), "n_users must be an int >= 1"),
    (dict(n_items=1), "n_items must be an int >= 2"),
    (dict(n_users=2.5), "n_users must be an int"),
    (dict(ratings_per_user=0.5), "ratings_per_user must be a finite number >= 1"),
    (dict(noise=float("nan")), "noise must be a finite number"),
    (dict(activity_sigma=-1), "activity_sigma must be"),
    (dict(random_state=-3), "random_state must be an int >= 0"),
    (dict(n_factors=True), "n_factors must be an int"),
])
def test_bad_settings_are_named(kw, match):
    args = {"n_users": 10, "n_items": 5, **kw}
    with pytest.raises(ValueError, match=match):
        SyntheticPopulation(**args)


def test_build_rows_holds_only_the_blocks_users_in_the_whole_populations_order():
    pop = SyntheticPopulation(1000, 80, ratings_per_user=12, random_state=4)
    full = Interactions(*pop.build(), None, np.arange(1000), np.arange(80))
    users, indptr, items, values = pop.build_rows([63, 5, 0])
    assert np.array_equal(users, np.sort(np.concatenate([pop.block_users(b) for b in (0, 5, 63)])))
    assert len(indptr) == len(users) + 1
    part = full.subset_users(users)
    for got, want in ((indptr, part.indptr), (items, part.items), (values, part.values)):
        np.testing.assert_array_equal(got, want)
    empty = pop.build_rows([])
    assert len(empty[0]) == 0 and empty[1].tolist() == [0]


def test_a_ray_shard_holds_only_its_users_and_answers_as_the_whole_population():
    """A shard's arrays are sized by its users (at 10⁷ user ids they shrink as shards are
    added), and its clients' outputs are bit for bit the local executor's on the whole
    population: each row's stream is keyed by the dense user id."""
    import numba

    from fedcf.federated.executors.ray_shard import Shard, shard_of
    from fedcf.federated.round.phases import BoundLocalExecutor, Cohort

    threads = numba.get_num_threads()  # a Shard sets its process's threads; keep the suite's
    try:
        _shard_checks(Shard, shard_of, BoundLocalExecutor, Cohort)
    finally:
        numba.set_num_threads(threads)


def _shard_checks(Shard, shard_of, BoundLocalExecutor, Cohort):
    big = SyntheticPopulation(10_000_000, 40, ratings_per_user=1, activity_sigma=0.0)
    held = {n: Shard(0, n, 1, big) for n in (16, 64)}
    size = {n: s.held_bytes() for n, s in held.items()}
    assert len(held[64].keys) - 2 == len(big.block_users(0)) == len(held[64].data[0]) - 1
    assert size[64] < size[16] / 3.5 and size[64] < 30 * len(big.block_users(0))
    users, _, _ = held[16].describe()
    np.testing.assert_array_equal(users, np.sort(np.concatenate(
        [big.block_users(b) for b in range(4)])))

    spec = SyntheticPopulation(3000, 60, ratings_per_user=9, random_state=2)
    est = FedReconMF(n_factors=3, random_state=0)
    program = est.client_program(None, 3.5)
    rng = np.random.default_rng(0)
    params = {"Q": rng.normal(0, 0.1, (60, 3)), "b": np.zeros(60)}
    ids = np.array([7, 2], np.uint64)
    clients = np.array([5, 2999, 64, 130, 7, 1000])
    want = BoundLocalExecutor(program, spec.build()).run(Cohort(clients, 6, 0, 0), params, ids)
    for s in range(3):
        mine = clients[shard_of(clients, 3) == s]
        shard = Shard(s, 3, 1, spec)
        shard.set_program(pickle.dumps(program))
        got = shard.run(mine, params, ids)
        pick = np.flatnonzero(np.isin(clients, mine))
        ref = want.take(pick)
        np.testing.assert_array_equal(got.clients, mine)
        for f in ("offsets", "items", "d_Q", "d_b", "weights", "losses"):
            np.testing.assert_array_equal(getattr(got, f), getattr(ref, f))
    with pytest.raises(ValueError, match="shard 0 was sent clients it does not hold"):
        Shard(0, 3, 1, spec).run(np.array([63]), params, ids)


def test_a_ratings_file_spec_names_a_file_it_cannot_read(tmp_path):
    from fedcf.datasets import RatingsFile

    with pytest.raises(ValueError, match=r"RatingsFile path '.*nowhere.csv' cannot be read"):
        RatingsFile(tmp_path / "nowhere.csv")
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n5,1,4,0\n7,1,2,0\n7,2,5,0\n")
    spec = RatingsFile(path)
    users, indptr, items, values = spec.build_rows([1])  # dense user 1 = raw user 7
    assert users.tolist() == [1] and indptr.tolist() == [0, 2] and values.tolist() == [2.0, 5.0]
    assert spec.vocabulary()[0].tolist() == [5, 7]
    path.write_text("userId,movieId,rating,timestamp\n5,1,4,0\n")
    from fedcf.datasets import ratings_file

    ratings_file._LOADED.clear()  # as in a fresh worker: nothing read yet
    with pytest.raises(ValueError, match="changed since the run named it"):
        spec.to_interactions()


def test_a_ratings_file_replaced_while_it_is_parsed_is_refused(tmp_path, monkeypatch):
    """The worker hashes the file before and after parsing it, streamed: a file swapped
    between the check and the parse does not slip through."""
    from fedcf.datasets import RatingsFile, movielens, ratings_file

    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n5,1,4,0\n7,1,2,0\n")
    spec = RatingsFile(path)
    parse = movielens.load_ratings_file

    def swapped(p, *a, **kw):
        out = parse(p, *a, **kw)
        path.write_text("userId,movieId,rating,timestamp\n5,1,1,0\n7,1,1,0\n")
        return out
    monkeypatch.setattr(movielens, "load_ratings_file", swapped)
    ratings_file._LOADED.clear()
    with pytest.raises(ValueError, match="changed since the run named it"):
        spec.to_interactions()
    assert not ratings_file._LOADED  # nothing kept from the refused read


def _arrays(x):
    """Every array in x (dicts, lists, tuples, dataclass fields)."""
    import dataclasses

    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    elif dataclasses.is_dataclass(x):
        x = [getattr(x, f.name) for f in dataclasses.fields(x)]
    return [a for v in x for a in _arrays(v)] if isinstance(x, (list, tuple)) else []


def test_a_ray_shard_hands_its_kernels_writable_arrays():
    """Ray's object store hands an actor read-only arrays (its data, the program's arrays, each
    round's parameters), and Numba compiles a read-only argument as a separate signature: every
    actor would compile each client kernel again instead of loading the warm-up's. The shard
    runs its kernels on writable arrays only."""
    import dataclasses

    import numba

    from fedcf.federated.executors.ray_shard import Shard, _own_rows

    def frozen(x):
        for a in _arrays(x):
            a.flags.writeable = False
        return x

    indptr, items, values = SyntheticPopulation(500, 30, ratings_per_user=6,
                                                random_state=1).build()
    program = FedReconMF(n_factors=3, random_state=0).client_program(None, 3.5)
    program = dataclasses.replace(program, **{f.name: frozen(np.copy(getattr(program, f.name)))
                                              for f in dataclasses.fields(program)
                                              if isinstance(getattr(program, f.name), np.ndarray)})
    assert _arrays(program) and not any(a.flags.writeable for a in _arrays(program))
    threads = numba.get_num_threads()
    try:
        shard = Shard(0, 1, 1, frozen(_own_rows(0, 1, indptr, items, values)))
        shard.set_program(pickle.dumps(frozen(program)))
        seen = []
        run = shard.executor.run
        shard.executor.run = lambda *a: seen.append(a) or run(*a)
        params = {"Q": np.zeros((30, 3), np.float32), "b": np.zeros(30, np.float32)}
        shard.call("run", np.arange(20), frozen((frozen(params), np.array([1, 2], np.uint64))))
    finally:
        numba.set_num_threads(threads)
    given = _arrays(shard.executor.data) + _arrays(shard.executor.program) + _arrays(seen)
    assert len(given) > 6 and all(a.flags.writeable for a in given)
