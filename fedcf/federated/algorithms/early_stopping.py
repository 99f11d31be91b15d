"""Early stopping on held-out users: a share of the population never trains; every few rounds
their devices reconstruct their own rows from their support sets and report the query loss of
the current global model (the quantity ReconEval measures), and the fit keeps the round whose
model predicts them best. ``FedReconMF(early_stopping=EarlyStopping())``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..round.params import Params, check_number

# the validation split of every check: one round id no training round uses, so each held-out
# user's support/query split is the same at every check and the checks compare models only
VALIDATION_ROUND = np.uint64(2**63 + 0x5E1)


# what "auto" runs (FedReconMF's defaults): with users to hold out, Adam on the server with the
# adaptivity ε = 1e-3 of Reddi et al. (2021) at one step for every population, the round the
# held-out users' loss prefers (of the parameters averaged over about the last 33 rounds), and a
# smaller step from there when it stops improving; else the paper's server SGD at 1 and the last
# round
AUTO_ADAM = {"learning_rate": 0.0175, "epsilon": 1e-3}
AUTO_STOPPING = {"max_holdout": 100, "decay": 0.5, "average": 0.97}
AUTO_MIN_USERS = 500  # eligible users below which "auto" holds none out (a tenth: 50 users)
# Adam's two moment slots are dense float64 copies of the item matrix and each of its steps moves
# every row: above this many item values "auto" keeps SGD's sparse step
AUTO_MAX_DENSE = 10**7


def AutoOr(rule):
    """A parameter rule that also takes the string "auto" (resolved at fit)."""
    return lambda name, v: "auto" if isinstance(v, str) and v == "auto" else rule(name, v)


def auto_holds_out(est, inter) -> bool:
    """Whether ``early_stopping="auto"`` holds users out in this fit: at least AUTO_MIN_USERS
    eligible users (here or on Ray shards alike), an aggregator neither secure nor
    differentially private, no learned hyperparameters, a full item space and a support/query
    split. (A Flower run settles "auto" to None before it starts: ``flower.settings``.)"""
    if not (isinstance(est.early_stopping, str) and est.early_stopping == "auto"):
        return False
    agg = est._aggregator()
    eligible = int((inter.counts() >= max(int(est.min_examples), 1)).sum())
    return (eligible >= AUTO_MIN_USERS and not agg.secure
            and not est._dp_release() and est.hypergradients is None
            and not est._item_space().open and not no_split(est))


def no_split(est) -> bool:
    """The estimator's users keep no query set apart (``split="none"``): a held-out user's loss
    would be measured on the ratings it reconstructs from, which early stopping cannot use."""
    from .split import NoSplit, resolve_split

    return isinstance(resolve_split(est.split), NoSplit)


class EarlyStopping(Params):
    """Keep the round whose global model has the lowest loss on held-out users.

    Parameters
    ----------
    holdout : float in (0, 0.5], default 0.1
        Share of the eligible users held out: they never train and only report their loss.
    max_holdout : int >= 1, default 200
        At most this many users are held out (a large population needs no more to rank rounds,
        and keeps the rest for training).
    every : int >= 1, default 10
        Check every this many rounds (and after the last round).
    patience : int >= 1 or None, default None
        Stop after this many checks in a row without a lower loss; None runs every round.
    decay : float in (0, 1) or None, default None
        Each time two checks in a row find no lower loss, go back to the best round's global
        parameters and multiply the server step by ``decay`` (as scikit-learn's MLP
        ``learning_rate="adaptive"`` divides its step); None keeps the step.
    average : float in (0, 1) or None, default None
        Check and keep an exponential moving average of the global parameters rather than the
        round's own: after every round avg ← average·avg + (1 − average)·params (Polyak-Ruppert
        averaging over about 1 / (1 − average) rounds; the server keeps one dense float64 copy
        of the model). Training goes on from the round's own parameters; a decay restarts both
        from the best average. None checks the round's parameters.

    The fitted model is the best checked round's (``best_round_``); ``history_`` records
    ``validation_rmse`` at each check. The held-out users report a loss in the clear, so early
    stopping is refused with a differentially private or a secure aggregator.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import EarlyStopping
    >>> FedReconMF(early_stopping=EarlyStopping(patience=5)).get_params()[
    ...     "early_stopping__patience"]
    5
    """

    def __init__(self, holdout=0.1, *, max_holdout=200, every=10, patience=None, decay=None,
                 average=None):
        self.holdout = holdout
        self.max_holdout = max_holdout
        self.every = every
        self.patience = patience
        self.decay = decay
        self.average = average
        self.validate()

    def validate(self):
        check_number("holdout", self.holdout, 0.0, low_open=True, high=0.5)
        check_number("max_holdout", self.max_holdout, 1, integer=True, high=10**9)
        check_number("every", self.every, 1, integer=True, high=10**9)
        if self.patience is not None:
            check_number("patience", self.patience, 1, integer=True, high=10**9)
        if self.decay is not None:
            check_number("decay", self.decay, 0.0, low_open=True, high=1.0)
            if self.decay == 1.0:
                raise ValueError("decay must be below 1 (None keeps the step), got 1.0")
        if self.average is not None:
            check_number("average", self.average, 0.0, low_open=True, high=1.0)
            if self.average == 1.0:
                raise ValueError("average must be below 1 (an average that never moves; None "
                                 "checks the round's own parameters), got 1.0")

    def split(self, eligible: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(users that train, held-out users), both sorted; refuses a split that leaves either
        side empty."""
        n = min(int(round(float(self.holdout) * len(eligible))), int(self.max_holdout))
        if n < 1 or n >= len(eligible):
            raise ValueError(f"early_stopping__holdout={self.holdout} holds out {n} of the "
                             f"{len(eligible)} eligible users: it needs at least one on each "
                             "side; raise holdout, or leave early_stopping=None for so few users")
        held = np.zeros(len(eligible), bool)
        held[np.random.default_rng([seed, 0xE5]).permutation(len(eligible))[:n]] = True
        return eligible[~held], eligible[held]

    def bind(self, eligible: np.ndarray, seed: int, n_rounds: int, shape: tuple):
        """(the users that train, the run's ``Validation`` of the others)."""
        train, held = self.split(eligible, seed)
        return train, Validation(self, held, seed, n_rounds, shape)


class Validation:
    """A run's early stopping: the held-out users' RMSE at each check, and the best round's
    global parameters (a copy)."""

    def __init__(self, rule: EarlyStopping, held: np.ndarray, seed: int, n_rounds: int,
                 shape: tuple):
        self.held, self.n_rounds = held, n_rounds
        self.every, self.patience, self.decay = int(rule.every), rule.patience, rule.decay
        self.average = None if rule.average is None else float(rule.average)
        self.avg = None  # the running average of the global parameters (float64), if averaging
        self.decays = 0  # times the step was decayed (and the best round restored)
        self.ids = np.array([seed, VALIDATION_ROUND], np.uint64)
        self.tangents = (np.zeros((0, *shape)), np.zeros((0, shape[0])))
        self.best, self.best_round, self.best_rmse, self.waited = None, 0, np.inf, 0

    def due(self, done: int) -> bool:
        return done % self.every == 0 or done == self.n_rounds

    def rmse(self, run, params=None) -> tuple[float, int]:
        """The held-out users' RMSE at ``params`` (default: the run's global parameters),
        weighted as the aggregate weighs clients, and how many reported a finite loss."""
        from ..round.phases import Cohort

        cohort = Cohort(self.held, len(self.held), 0, 0)
        params = run.params if params is None else params
        losses, _, w = run.executor.tangents(cohort, params, self.tangents, self.ids)
        ok = np.isfinite(losses) & (w > 0)
        if not ok.any():
            return np.inf, 0
        return float(np.sqrt(np.dot(w[ok], losses[ok]) / w[ok].sum())), int(ok.sum())

    def check(self, run, done: int) -> dict:
        """After round ``done``: fold the round into the average; at a check, the record's
        entries, keeping the best (of the average, when averaging)."""
        self._accumulate(run.params)
        if not self.due(done):
            return {}
        checked = self._checked(run.params)
        rmse, n = self.rmse(run, checked)
        if self._count(rmse, done):  # back to the best round, on a smaller step
            run.params = {k: v.copy() for k, v in self.best.items()}
            self.avg = None if self.avg is None else self._float64(self.best)
            self._scale_step(run)
        elif self.best_round == done:
            self.best = {k: v.copy() for k, v in checked.items()}
        return {"validation_rmse": rmse, "validation_users": n, "validation_decays": self.decays,
                "server_learning_rate": run.hyperparams.server_learning_rate}

    @staticmethod
    def _float64(params) -> dict:
        return {k: np.array(v, dtype=np.float64) for k, v in params.items()}

    def _accumulate(self, params) -> None:
        if self.average is None:
            return
        if self.avg is None:
            self.avg = self._float64(params)
            return
        for k, v in params.items():
            self.avg[k] *= self.average
            self.avg[k] += (1.0 - self.average) * np.asarray(v, dtype=np.float64)

    def _checked(self, params) -> dict:
        """What a check scores and keeps: the average in the parameters' dtypes, or the round's
        own parameters."""
        if self.avg is None:
            return params
        return {k: self.avg[k].astype(v.dtype) for k, v in params.items()}

    def _count(self, rmse: float, done: int) -> bool:
        """Count a check; True when it decays the step."""
        if rmse < self.best_rmse:
            self.best_rmse, self.best_round, self.waited = rmse, done, 0
            return False
        self.waited += 1
        if self.decay is None or self.waited % 2:
            return False
        self.decays += 1
        return True

    def _scale_step(self, run) -> None:
        hp = run.hyperparams
        run.hyperparams = replace(hp, server_learning_rate=hp.server_learning_rate * self.decay)

    @property
    def stopped(self) -> bool:
        return self.patience is not None and self.waited >= self.patience

    def arrays(self) -> dict:
        """The best parameters (and the running average) for a checkpoint."""
        out = {} if self.best is None else {f"best_{k}": v for k, v in self.best.items()}
        return {**out, **({} if self.avg is None else {f"avg_{k}": v for k, v in self.avg.items()})}

    def resume(self, run, history: list, arrays: dict, path) -> None:
        """The state a checkpoint implies: the checks recorded in ``history`` (and the step
        they decayed) and the best round's parameters saved beside them (``arrays``, checked
        against the run's)."""
        params = run.params
        for rec in history:
            if "validation_rmse" in rec and self._count(float(rec["validation_rmse"]),
                                                        int(rec["round"]) + 1):
                self._scale_step(run)
        if self.average is not None and history:
            self.avg = self._saved(arrays, "avg", {k: np.dtype(np.float64) for k in params},
                                   params, path, "running average")
        if self.best_round:
            self.best = self._saved(arrays, "best", {k: v.dtype for k, v in params.items()},
                                    params, path, "best round")

    @staticmethod
    def _saved(arrays, prefix, dtypes, params, path, what) -> dict:
        """The checkpoint's ``prefix_*`` arrays, checked against the run's parameters."""
        out = {k: arrays.get(f"{prefix}_{k}") for k in params}
        for k, v in out.items():
            if v is None or v.shape != params[k].shape or v.dtype != dtypes[k] \
                    or not np.isfinite(v).all():
                raise ValueError(f"checkpoint {str(path)!r} records early-stopping checks but "
                                 f"its {what}'s {k!r} is missing or damaged; it is left "
                                 "untouched — use another checkpoint_path")
        return out
