"""What every federated estimator shares: parameters, and ``fit`` as a short loop over the
phases of a round (phases.py, loop.py)."""

from __future__ import annotations

import copy
import numbers
from functools import partial

import numpy as np
from sklearn.utils import check_random_state
from tqdm.auto import tqdm

from ..._validation import Bool, Dtype, Int, NoneOr, Options, Path, RandomState, Real
from ...datasets import DataValidationError, Interactions, RatingsFile, SyntheticPopulation
from ...models.base import MFEstimatorBase, atomic_fit, check_callback, check_memory
from ..aggregators.accounting import epsilons
from ..aggregators.secagg import warn_if_masked_on_driver
from ..round.blame import cause_of
from ..round.checkpoint import RESUME_FREE, data_fingerprint
from ..round.contracts import Aggregator, Executor, Population, RunContext, phase_rule
from ..round.guard import STAGES, Diverged, DivergenceGuard, warn_if_nothing_trained
from ..round.loop import Checkpointer, Run
from ..round.optimizers import ServerOptimizer
from ..round.phases import Cohort, RoundHyperparams, Selector, reachable_users
from ..round.state import Algorithm, ModelState, Part
from .client_update import ClientUpdate
from .early_stopping import EarlyStopping
from .hyper import (
    HYPER_CONSTRAINTS,
    Hypergradients,
    HyperLearner,
    check_learnable,
    hyper_holdout,
    warn_pinned,
)
from .reconstruction import Reconstruction, RidgeReconstruction

_WEIGHT_EXPONENT = {"num_examples": 1.0, "uniform": 0.0}

FEDERATED_CONSTRAINTS = {
    "n_factors": Int(1), "n_rounds": Int(0), "clients_per_round": Int(1),
    "server_optimizer": phase_rule("server_optimizer", ServerOptimizer),
    "client_update": phase_rule("client_update", ClientUpdate),
    "client_weighting": Options(*_WEIGHT_EXPONENT),
    "min_examples": Int(0), "oversample": Real(0.0, 100.0),
    "dropout": Real(0.0, 1.0, high_open=True), "init_scale": Real(0.0, low_open=True),
    "eval_every": Int(0), "checkpoint_path": NoneOr(Path()), "checkpoint_every": Int(1),
    "dtype": Dtype(), "random_state": RandomState(), "verbose": Bool(),
    "aggregator": NoneOr(phase_rule("aggregator", Aggregator)),
}
# stateless clients (Federated Reconstruction) can run anywhere: here or on a Ray cluster
EXECUTOR_CONSTRAINTS = {"executor": NoneOr(phase_rule("executor", Executor))}


class FederatedMFBase(MFEstimatorBase):
    """Round loop and parameters shared by the federated estimators (not used directly).

    Subclasses provide ``client_program(inter, mu)`` (lays out and runs the client kernel) and
    may keep client state between rounds (``_local_state``).
    """

    _parameter_constraints = FEDERATED_CONSTRAINTS
    biases = True
    rating_scale = None
    # parameters that only some federated estimators take, at their "off" value for the rest
    executor = None  # where the clients run (None: this process)
    hypergradients = None
    early_stopping = None
    negatives = 0
    best_round_ = None  # with early stopping: the checked round whose model was kept
    validation_users_ = None  # ... and the raw ids of the held-out users
    server_optimizer_ = early_stopping_ = None  # what a fit ran ("auto" resolved)

    # ------------------------------------------------------------------ hooks
    _client_update_name = "ClientUpdate"  # what ``client_update=`` takes (errors name it)
    # the parameters that decide what a client computes (a Flower node builds the estimator
    # from them); None: the clients cannot run over Flower
    _client_params: tuple[str, ...] | None = None
    _server_rows = False  # kept user rows are the server's (FedAvg), not the devices
    reconstruction = "als"  # how a user part is rebuilt from a support set (new users too)
    _reconstruction_kind = Reconstruction  # what ``reconstruction=`` takes
    _default_recon_lam = 0.1  # the ridge λ when the reconstruction names none

    def _reconstruction(self) -> Reconstruction:
        return phase_rule("reconstruction", self._reconstruction_kind)("reconstruction",
                                                                      self.reconstruction)

    def _recon_lam(self) -> float:
        return self._reconstruction().lam(self._default_recon_lam)

    @classmethod
    def _saved_params(cls, params: dict) -> dict:
        """A model saved with the flat ``recon_regularization`` loads with it moved."""
        if "recon_regularization" in params:
            params["reconstruction"] = RidgeReconstruction(params.pop("recon_regularization"))
        return params

    def _init_globals(self, inter, rng, dtype) -> dict:
        """g(0): item factors uniform in ±init_scale, zero item biases."""
        Q = rng.uniform(-self.init_scale, self.init_scale, (inter.n_items, self.n_factors))
        return {"Q": Q.astype(dtype), "b": np.zeros(inter.n_items, dtype)}

    def _local_state(self):
        """The clients' state kept between rounds (``UserRows``), or None (FedRecon)."""
        return None

    def _coerce(self, X, y, **data_kwargs) -> Interactions:
        """The training data. A population described by a spec (``SyntheticPopulation``, or a
        ``RatingsFile`` the workers read) is built on the workers of a Ray executor (a
        ``RemotePopulation``: the driver never holds it), else here."""
        remote = isinstance(X, Population) and X.executor is not None
        opened = self._executor().open(X) if isinstance(X, (SyntheticPopulation, RatingsFile)) \
            and not remote else None
        if (remote or opened is not None) and (y is not None or data_kwargs):
            raise TypeError(f"a {type(X).__name__} takes no y or data keyword arguments")
        if remote:  # e.g. a Flower federation's users, run where they are
            if self.executor not in (None, "local"):
                raise ValueError(f"executor={self.executor!r} cannot run the clients of a "
                                 f"{type(X).__name__}, which has its own; leave executor=None")
            return X
        return opened if opened is not None else self._coerce_data(X, y, **data_kwargs)

    def _coerce_data(self, X, y, **data_kwargs) -> Interactions:
        """Data held here as Interactions (ratings; the implicit estimators read strengths)."""
        return Interactions.coerce(X, y, **data_kwargs)

    def _usable_loss(self, inter) -> float:
        """A mean query loss above this means the model is no longer usable: 10⁴ × the loss of
        predicting zero for every example."""
        return 1e4 * max(inter.value_stats()["mean_sq"], 1e-6)

    def _blame(self, stage: str) -> str:
        """Which parameter to change when ``stage`` made a run diverge (guard.STAGES)."""
        if stage == "client update":
            return (f"lower the client step size (client_update__learning_rate, now "
                    f"{self._client_rate()})")
        if stage == "data":
            return ("the ratings are too large for training: rescale them (to a rating scale "
                    "such as 1–5), or train with dtype='float64'")
        if stage == "node":
            return ("one node's uploads dwarf the others' (a faulty or hostile node): keep "
                    "the robust default aggregator (clip to the round's median norm, "
                    "NormClippedMean('median')) or another robust one, or exclude the node")
        if stage == "noise":
            return ("the differential-privacy noise outweighs the model: more clients per "
                    "round (clients_per_round: the noise per value falls with the cohort), a "
                    "larger target_epsilon or smaller noise_multiplier, or a smaller server "
                    "learning rate (server_optimizer__learning_rate)")
        return (f"lower the server optimizer's learning rate (server_optimizer="
                f"{self._server_optimizer()!r}; e.g. server_optimizer__learning_rate)")

    def _damped(self, stage: str, factor: float):
        """A shallow copy of this estimator whose ``stage`` step size is divided by
        ``factor`` (None: the stage has no step size), for blame.py's reruns."""
        if stage != "client update":
            return None
        cu = self._client_update()
        damped = copy.copy(self)
        damped.client_update = type(cu)(**{**cu.get_params(deep=False),
                                           "learning_rate": self._client_rate() / factor})
        return damped

    def _guard(self, inter, mu: float, opt) -> DivergenceGuard:
        """The run's divergence guard: this estimator's advice per stage, and the server
        optimizer's stability (``server_is_wild``) for when no cause can be measured."""
        private = self._dp_release()  # under DP: stop only on what the run releases
        usable = np.inf if private else self._usable_loss(inter)  # (unused under DP: no data)
        return DivergenceGuard(usable, {s: self._blame(s) for s in STAGES},
                               partial(opt.is_wild, self.init_scale), released_only=private)

    def _checkpointer(self, inter, seed) -> Checkpointer | None:
        if self.checkpoint_path is None:
            return None
        return Checkpointer(self.checkpoint_path, self.checkpoint_every, cls=type(self).__name__,
                            fingerprint=data_fingerprint(inter, seed), n_rounds=self.n_rounds,
                            run_params={**{k: v for k, v in self.get_params(deep=False).items()
                                           if k not in RESUME_FREE}, **self._fit_inputs()})

    def _fit_inputs(self) -> dict:
        """Inputs of this fit besides the data and the parameters that a resumed run must
        share (FedReconMF: its item features)."""
        return {}

    def _observer(self, callback):
        """``observe(done, params, history)`` of the run: every ``eval_every`` rounds, this
        estimator with the current global parameters is handed to ``callback``."""
        if callback is None or not self.eval_every:
            return None

        def observe(done, params, history):
            if done % self.eval_every:
                return None
            # copies: a callback may keep what it is shown, and later rounds update in place
            self._set_globals({"Q": params["Q"].copy(), "b": params["b"].copy()})
            self.history_ = list(history)
            return callback(self, done)
        return observe

    def _recon_can_diverge(self) -> bool:
        """True when reconstruction takes gradient steps (an exact solve cannot diverge)."""
        return False

    _default_learning_rate = 0.5  # the client step size when client_update leaves it None

    def _client_update(self) -> ClientUpdate:
        """The ``client_update`` parameter as an object."""
        return phase_rule("client_update", ClientUpdate)("client_update", self.client_update)

    def _client_rate(self) -> float:
        return self._client_update().rate(self._default_learning_rate)

    def _update_hp(self, mu, joint):
        return self._client_update().hp(self._default_learning_rate, mu, self._item_biases(),
                                         joint)

    def _check_combinations(self):
        """Rules that involve several parameters (subclasses extend)."""
        hg = self._hypergradients()
        if hg is not None:
            check_learnable(self, hg, self._local_state() is not None)
        if self._dp_release() and "rating_scale" in self._parameter_constraints:
            self._aggregator().public_release(self._check_params().get("rating_scale"),
                                              self._item_biases())  # names what is missing
        if self._aggregator().sampling == "poisson" and self.oversample > 0:
            raise ValueError("oversample must be 0 with DPGaussianMean: differential privacy "
                             "samples clients by Poisson sampling, which has no surplus to cut")

    def _seed(self) -> int:
        return run_seed(self.random_state)

    def _dp_release(self) -> bool:
        return self._aggregator().sampling == "poisson"

    @property
    def dp_release(self) -> bool:
        """Whether ``fit`` trains under differential privacy (a DP aggregator): then μ and the
        rating scale are the public ones and a saved model is a DP release."""
        return self._dp_release()

    def release_mean(self, stats: dict | None = None) -> float:
        """μ a fit uses and releases: under DP the public one (``stats`` unused), else the
        training data's mean ``stats["mean"]`` (0 without biases)."""
        if stats is None and not self._dp_release() and self._item_biases():
            raise ValueError("release_mean needs the data's value statistics (stats=) when the "
                             "model is not trained under differential privacy")
        return self._release_mean_and_scale(stats)[0]

    # ------------------------------------------------------------------ fit
    @atomic_fit
    def fit(self, X, y=None, *, callback=None, availability=None, **data_kwargs):
        """Train with federated rounds on a DataFrame / Interactions / sparse matrix.

        Each user is one client. ``availability(round)`` optionally says which clients are
        reachable in a round (e.g. charging and on Wi-Fi): it returns a 1-D array-like of *raw*
        user ids of the training data; sampling then draws only from those. ``callback(model,
        round)`` is called every ``eval_every`` rounds with the model's fitted attributes set to
        the current global parameters; a dict it returns is stored in that round's ``history_``
        entry. With ``checkpoint_path`` the state is saved atomically every ``checkpoint_every``
        rounds and at the end, and a later ``fit`` with the same parameters and data resumes
        from it (same result as one run). A fit that raises leaves the estimator as it was.
        """
        check_callback(callback)
        self._check_params()
        self._check_combinations()
        inter = self._public_vocabulary(self._coerce(X, y, **data_kwargs))
        run = None
        try:
            run = self._start(inter, availability, callback)
            bar = tqdm(range(run.start, self.n_rounds), desc=type(self).__name__,
                       disable=not self.verbose, initial=run.start, total=self.n_rounds,
                       leave=False)
            for t in bar:
                if run.validation is not None and run.validation.stopped:
                    break  # early stopping: no lower held-out loss for `patience` checks
                rec = run.round(t)
                bar.set_postfix(loss=f"{rec['loss']:.4f}", refresh=False)
        except Diverged as stopped:  # measure the cause before saying which setting to change
            found = cause_of(self, inter, availability, stopped.round, run)
            stage, measured = (found.stage, found.measured) if found else (stopped.stage, None)
            raise FloatingPointError(run.guard.message(stopped.round, stopped.what, stage,
                                                       measured)) from None
        finally:  # stop the shard actors of a Ray run, also when it failed
            for ex in {id(e): e for e in (None if run is None else run.executor,
                                          inter.executor) if e}.values():
                ex.close()
        run.guard.warn_dropped(lambda t: cause_of(self, inter, availability, t, run))
        warn_if_nothing_trained(run.history, run.start)
        if run.aggregator.sigma is not None:
            self.noise_multiplier_ = run.aggregator.sigma
            self.epsilon_ = run.epsilon()
            self.epsilon_server_ = run.server_epsilon()
            self.epsilons_ = None if self.epsilon_ is None else epsilons(run.accountant)
        best = None if run.validation is None else run.validation.best
        self._set_globals(run.params if best is None else best)
        self.best_round_ = None if run.validation is None else run.validation.best_round
        if run.local is not None:  # kept_rows None: the rows stayed on the devices (Flower)
            rows = run.executor.kept_rows(run.local)
            for name, value in self._local_state().fitted(run.local).items():
                setattr(self, name, None if rows is None else value)
        self.history_ = run.history
        if run.hyper is not None:
            self.learned_hyperparams_ = run.hyper.values()
            warn_pinned(run.history, run.start, self.learned_hyperparams_)
        return self

    def client_uploads(self, X, clients, round_idx: int = 0):
        """What the server receives in round ``round_idx`` from ``clients`` (positions of users
        in ``X``) at the fitted global model: their ``ClientOutputs``, the transcript that a
        leakage audit attacks (``scripts/privacy_benchmark.py``). For estimators whose clients
        keep no state between rounds."""
        self._check_fitted()
        if self._local_state() is not None:
            raise ValueError(f"{type(self).__name__} keeps user rows between rounds; its uploads "
                             "depend on the whole training run, not on the fitted model alone")
        inter = Interactions.coerce(X)
        clients = np.asarray(clients, np.int64)
        if clients.ndim != 1 or (clients.size and not 0 <= clients.min() <= clients.max()
                                 < inter.n_users):
            raise ValueError(f"clients must be a 1-D array of user positions in [0, "
                             f"{inter.n_users}), got {clients!r}")
        program = self.client_program(inter, float(self.global_mean_))
        ex = self._executor().bind(program, (inter.indptr, inter.items, inter.values))
        try:
            return ex.run(Cohort(clients, len(clients), 0, 0), self._global_params(),
                          np.array([self._seed(), round_idx], np.uint64))
        finally:
            ex.close()

    def _algorithm(self, inter, mu: float) -> Algorithm:
        """This estimator's algorithm on ``inter`` (``round.state.Algorithm``)."""
        return Algorithm(self._model_state(inter.n_items), self.client_program(inter, mu),
                         self._local_state(), float(mu))

    def _model_state(self, n_items: int) -> ModelState:
        """The global arrays over ``n_items`` items (``round.state``): item factors with their
        biases, one row per item."""
        return ModelState((Part("item_factors_", n_items, bias="item_biases_"),),
                          self._row_width())

    def _item_biases(self) -> bool:
        """Whether the model has item biases: every upload carries their deltas."""
        return bool(self.biases)

    def _global_params(self) -> dict:
        """The fitted global parameters as a round sees them."""
        state = self._model_state(len(self.item_ids_))
        return state.pack({n: self._fitted(n) for n in state.names}, self.item_factors_.dtype)

    def _start(self, inter, availability, callback=None) -> Run:
        """Initial global parameters (or a checkpoint's), and the phases of this run."""
        dtype, K, seed = np.dtype(self.dtype), self._row_width(), self._seed()
        self._resolve_auto(inter)
        self._check_memory(inter, dtype)
        rng = np.random.default_rng([seed, 0xC0FFEE])
        params = self._init_globals(inter, rng, dtype)
        stats = None if self._dp_release() else inter.value_stats()  # DP: public μ, scale
        mu, scale = self._release_mean_and_scale(stats)
        alg = self._algorithm(inter, mu)  # built once: the loop and the executors run it
        local = None if alg.local is None else alg.local.init(inter.n_users, K, rng, dtype)
        counts = inter.counts()
        eligible = np.flatnonzero(counts >= max(self.min_examples, 1))
        if len(eligible) == 0:
            raise ValueError(f"no client has at least min_examples={self.min_examples} examples "
                             f"(the largest has {int(counts.max()) if len(counts) else 0}); "
                             "lower min_examples")
        program = alg.program
        aggregator = self._aggregator()
        stopping, validation = self._early_stopping(), None
        if stopping is not None:
            eligible, validation = stopping.bind(eligible, seed, self.n_rounds, params["Q"].shape)
        self.validation_users_ = None if validation is None else inter.user_ids[validation.held]
        eligible, hyper_select = self._hyper_holdout(eligible, seed, aggregator, inter)
        opt, hg = self._server_optimizer(), self._hypergradients()
        self.server_optimizer_, self.early_stopping_ = opt, stopping
        run = Run(seed=seed, params=params, opt=opt, local=local, program=program,
                  select=Selector(seed, eligible, self.clients_per_round, self.oversample,
                                  self.dropout, reachable_users(availability, inter),
                                  poisson=aggregator.sampling == "poisson",
                                  secret=aggregator.secret_sampling),
                  executor=self._make_executor(program, inter, local),
                  aggregator=aggregator.bind(RunContext(
                      n_eligible=len(eligible), clients_per_round=self.clients_per_round,
                      n_rounds=self.n_rounds, n_items=len(params["b"]), n_factors=K, seed=seed,
                      biases=self._item_biases(),
                      eligible_weights=program.layout(counts[eligible])[0],
                      reports=None if self._hypergradients() is None else
                      "cohort" if hyper_select is None else "holdout",
                      n_holdout=0 if hyper_select is None else len(hyper_select.eligible),
                      learns_exponent=hg is not None and "weight_exponent" in hg.learn)),
                  hyperparams=self._round_hyperparams(), guard=self._guard(inter, mu, opt),
                  checkpointer=self._checkpointer(inter, seed),
                  observe=self._observer(callback),
                  hyper=HyperLearner.of(hg, self._round_hyperparams()),
                  hyper_select=hyper_select, validation=validation)
        warn_if_masked_on_driver(run.executor, run.aggregator)
        self.rating_scale_ = scale
        self.global_mean_ = mu
        self.user_ids_, self.item_ids_ = inter.user_ids, inter.item_ids
        self.interactions_ = inter
        return run

    def _release_mean_and_scale(self, stats):
        """(μ, rating scale) of the model: the training data's, or under differential privacy
        the public ones (the data's would be statistics outside ε)."""
        scale = self._check_params().get("rating_scale")
        if self._dp_release():
            if "rating_scale" not in self._parameter_constraints:  # implicit: no rating scale
                return 0.0, None
            return self._aggregator().public_release(scale, self._item_biases()), scale
        return (stats["mean"] if self._item_biases() else 0.0), scale or (stats["min"], stats["max"])

    def _public_vocabulary(self, inter):
        """Under DP with ``public_items``: the data on exactly that item vocabulary (a training
        item outside it is refused, naming it)."""
        agg = self._aggregator()
        items = agg.public_items if self._dp_release() else None
        if items is None:
            return inter
        if inter.executor is not None:
            raise ValueError("public_items needs the training data in this process (it re-maps "
                             "the items); a Ray or Flower population keeps its own catalog")
        try:
            return Interactions.from_arrays(
                inter.user_ids[inter.user_index()], inter.item_ids[inter.items], inter.values,
                inter.timestamps, user_catalog=inter.user_ids, item_catalog=np.asarray(items))
        except DataValidationError as e:
            raise ValueError(f"public_items misses a training item ({e}); add it to the public "
                             "vocabulary or drop its ratings") from None

    def _make_executor(self, program, inter, local):
        """Phase 2 (client work): where the population's clients already run (a Ray or
        Flower population), else the ``executor`` parameter's, bound to this run."""
        if inter.executor is not None:
            return inter.executor.set_program(program, local)
        return self._executor().bind(program, (inter.indptr, inter.items, inter.values), local)

    def _executor(self) -> Executor:
        """The ``executor`` parameter as an Executor (None: this process)."""
        return phase_rule("executor", Executor)("executor", self.executor or "local")

    def _hyper_holdout(self, eligible, seed, aggregator, inter):
        """(eligible users that train, Selector of the hypergradient holdout or None)."""
        return hyper_holdout(self._hypergradients(), self._local_state() is not None, eligible,
                             seed, aggregator, inter, self.clients_per_round)

    def _resolve_auto(self, inter) -> None:  # settle "auto" parameters from the data (none)
        pass

    def _early_stopping(self) -> EarlyStopping | None:  # FedReconMF's; None: the last round
        return None

    def _hypergradients(self) -> Hypergradients | None:
        """The ``hypergradients`` parameter as an object (None: fixed hyperparameters)."""
        return HYPER_CONSTRAINTS["hypergradients"]("hypergradients", self.hypergradients)

    def _aggregator(self) -> Aggregator:
        """Phase 3 (aggregate): the ``aggregator`` parameter, else the weighted mean."""
        return phase_rule("aggregator", Aggregator)("aggregator", self.aggregator or "mean")

    def _server_optimizer(self) -> ServerOptimizer:
        """The ``server_optimizer`` parameter as an object (a fresh copy: a run never changes
        the parameter)."""
        opt = phase_rule("server_optimizer", ServerOptimizer)("server_optimizer",
                                                              self.server_optimizer)
        return type(opt)(**opt.get_params(deep=False))

    def _round_hyperparams(self) -> RoundHyperparams:
        opt = self._server_optimizer()
        return RoundHyperparams(float(opt.learning_rate), opt.options(),
                                _WEIGHT_EXPONENT[self.client_weighting])

    def _check_memory(self, inter, dtype):
        check_memory(self._memory_need(inter, dtype),
                     f"{type(self).__name__} with n_factors={self.n_factors}")

    def _memory_need(self, inter, dtype) -> float:
        """Bytes a fit's arrays take at most: parameters, optimizer state, a round's uploads."""
        K, m = self._row_width(), min(self.clients_per_round, inter.n_users)
        largest = np.sort(inter.counts())[::-1][:int(np.ceil(m * (1 + self.oversample)))]
        slots = float(largest.sum()) * (1 + self.negatives)
        return (inter.n_items * (K + 1) * (dtype.itemsize + 6 * 8)  # params, state, dense step
                + slots * (K + 2) * (dtype.itemsize + 8)  # uploads and their reduction
                + 2 * ((K + 2) ** 2 * 8 + float(largest[:1].sum()) * (K + 2) * 24)
                + (0 if self._local_state() is None else inter.n_users * K * dtype.itemsize))

    def _set_globals(self, params):
        """The fitted global arrays from a round's parameters (views of them)."""
        for name, value in self._model_state(len(self.item_ids_)).unpack(params).items():
            setattr(self, name, value)


def run_seed(random_state) -> int:
    """The run seed of a federated fit from its ``random_state``: an int as it is (63 bits),
    else one draw from the RandomState (or fresh entropy for None). Client streams, cohorts and
    the initial model derive from it; a deployment's server and nodes agree on it."""
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return int(random_state) & 0x7FFFFFFFFFFFFFFF
    return int(check_random_state(random_state).randint(0, 2**31 - 1))
