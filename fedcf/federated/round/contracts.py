"""The declared contracts of a round's phases (the manual's architecture page lists them).

    Population      the clients: per-user counts, value statistics, subsets; where they run
    ClientProgram   one algorithm's client work: output layout, the kernel call, tangents,
                    and what a client sends and receives (communication accounting)
    Executor        where a cohort's client work runs (a parameter object); ``bind`` gives the
    RoundExecutor   of one run: ``run`` → ClientOutputs, ``partials`` when it can reduce
                    its own clients, ``tangents``, ``close``
    Aggregator      ClientOutputs → GlobalDelta, after ``bind(RunContext)``; declares whether it
                    is linear (reducible from partial sums), the client sampling it needs, and
                    its privacy accountant if any; ``client_round`` takes a round's client work
                    the way it needs it (masked, summed where the clients ran, or uploads)

Phase objects are scikit-learn parameters (``Params``, params.py): ``get_params``/``set_params`` with
nested names, so ``clone`` and ``GridSearchCV(est, {"aggregator__clip_norm": [...]})`` work.
Their constructors store what they are given; ``validate`` checks it (at construction, so a bad
value fails early, and again when bound, after any ``set_params``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from .params import Params, check_number  # noqa: F401 (the phase objects' base)


@dataclass(frozen=True)
class RunContext:
    """What a phase object may know about the run it is bound to (and nothing else).

    Parameters
    ----------
    n_eligible : int
        Clients that may ever be sampled.
    clients_per_round, n_rounds, n_items, n_factors, seed : int
    biases : bool, default True
    eligible_weights : ndarray or None
        Each eligible client's aggregation weight.
    reports : {None, "cohort", "holdout"}, default None
        Who sends hypergradient reports each round (learned hyperparameters): no one, the
        round's own cohort, or a cohort of the ``n_holdout`` held-out users.
    n_holdout : int, default 0
    learns_exponent : bool, default False
        The client-weighting exponent is learned (secure aggregation then also sums what its
        derivative needs).

    Examples
    --------
    >>> from fedcf.federated import DPGaussianMean, RunContext
    >>> ctx = RunContext(n_eligible=1000, clients_per_round=50, n_rounds=100, n_items=200,
    ...                  n_factors=8, seed=0)
    >>> DPGaussianMean(1.0, 1.0).bind(ctx).round_mechanism()
    (0.05, 1.0)
    """

    n_eligible: int  # clients that may ever be sampled
    clients_per_round: int
    n_rounds: int
    n_items: int  # rows of the global matrix
    n_factors: int
    seed: int
    biases: bool = True
    eligible_weights: np.ndarray | None = None  # each eligible client's aggregation weight n_k
    # learned hyperparameters: who reports their derivatives each round — None (no one),
    # "cohort" (the round's own clients) or "holdout" (a Poisson cohort of n_holdout held-out
    # users who never train); a DP aggregator accounts for the reports too
    reports: str | None = None
    n_holdout: int = 0
    learns_exponent: bool = False  # the weight exponent is learned: a secure sum carries ∂Δ̄/∂α


# ---------------------------------------------------------------------- populations and programs
@runtime_checkable
class Population(Protocol):
    """The clients of a fit: ``Interactions`` (here), a ``RemotePopulation`` (on Ray shards) or
    a ``FlowerPopulation`` (on Flower nodes). ``executor`` is None when the clients' data are
    in this process, else the round executor that runs them where they are; ``holds_ratings``
    says whether this process can read a client's ratings (a deployment's server cannot).

    Examples
    --------
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import Population
    >>> pop = make_synthetic_ratings(30, 10, 200, random_state=0)
    >>> isinstance(pop, Population), pop.executor is None, pop.holds_ratings
    (True, True, True)
    """

    n_users: int
    n_items: int
    executor: object
    holds_ratings: bool

    def counts(self) -> np.ndarray: ...

    def value_stats(self) -> dict: ...

    def subset_users(self, users): ...


@runtime_checkable
class ClientProgram(Protocol):
    """One algorithm's client work (FedReconProgram, StatefulProgram, ImplicitProgram, ...).

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.datasets import make_synthetic_ratings
    >>> from fedcf.federated import ClientProgram
    >>> pop = make_synthetic_ratings(30, 10, 200, random_state=0)
    >>> program = FedReconMF(n_factors=4).client_program(pop, mu=3.0)
    >>> isinstance(program, ClientProgram), program.values_down(10, 4, n_clients=2)
    (True, 102)
    """

    def layout(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(aggregation weight, output slots) of each client, from its example count."""

    def run(self, data, clients, params: dict, local, ids, out) -> np.ndarray | None:
        """Fill ``out`` = (offsets, items, d_Q, d_b, losses); return rank terms or None."""

    def tangents(self, data, clients, params: dict, local, tangents, ids):
        """(query losses, derivatives along each tangent) of the clients (hypergradients)."""

    def values_down(self, n_items: int, K: int, n_clients: int) -> int:
        """Numbers the server sends to a round's clients."""

    def values_up_local(self, n_used: int, K: int) -> int:
        """Numbers the used clients send besides their row deltas (e.g. a default's delta)."""

    def for_users(self, users: np.ndarray):
        """This program for the given users of the population only, renumbered 0, 1, ... in
        that order (a Ray shard's users): a program that holds data per user cuts it."""

    # a stateful program's user rows are the server's (FedAvg: each client downloads and
    # uploads its own row); else they stay with the devices between rounds (FURL)
    server_rows: bool

    def slots_of(self, weights: np.ndarray) -> np.ndarray | None:
        """The output slots of clients with these aggregation weights, where the layout
        follows from the weight alone (a server that knows no count checks a reply's layout
        with it); None where it does not."""


class WholeModelBroadcast:
    """Communication of a client program whose clients download the whole global model (and a
    round seed) and upload only their row deltas (counted by the aggregator).

    Examples
    --------
    >>> from fedcf.federated.round.contracts import WholeModelBroadcast
    >>> WholeModelBroadcast().values_down(n_items=100, K=8, n_clients=10)
    9010
    """

    def values_down(self, n_items: int, K: int, n_clients: int) -> int:
        return n_clients * (n_items * (K + 1) + 1)

    def values_up_local(self, n_used: int, K: int) -> int:
        return 0

    server_rows = False  # a stateful program's rows stay with the devices

    def slots_of(self, weights: np.ndarray) -> np.ndarray | None:
        return weights  # one slot per query example (FedRecon, FedAvg/FURL)

    def for_users(self, users: np.ndarray):
        return self  # nothing held per user


# ---------------------------------------------------------------------- executors
class RoundExecutor(ABC):
    """An executor bound to one run's program and data (``Executor.bind``).

    Examples
    --------
    >>> from fedcf.federated import RoundExecutor
    >>> class Logged(RoundExecutor):  # runs another round executor, counting its calls
    ...     def __init__(self, inner):
    ...         self.inner, self.counts, self.calls = inner, inner.counts, 0
    ...     def run(self, cohort, params, ids):
    ...         self.calls += 1
    ...         return self.inner.run(cohort, params, ids)
    """

    counts: np.ndarray  # examples per client (dense id)
    round_stats: dict = {}  # this round's measurements, merged into its history record
    supports_partials: ClassVar[bool] = False  # reduces its own clients (``partials``)
    # runs the secure-aggregation protocol's client halves where its clients are
    # (``secure_clients``, ``secure_reports``); else they run in the driver
    supports_secure: ClassVar[bool] = False

    @abstractmethod
    def run(self, cohort, params: dict, ids: np.ndarray):
        """The cohort's ClientOutputs, in cohort order."""

    def partials(self, cohort, params: dict, ids: np.ndarray, aggregator, hp):
        """A linear aggregator's PartialSums over the cohort (``supports_partials`` only)."""
        raise NotImplementedError(f"{type(self).__name__} does not reduce its own clients")

    def tangents(self, cohort, params: dict, tangents, ids: np.ndarray):
        raise NotImplementedError(f"{type(self).__name__} cannot compute hypergradient "
                                  "tangents; learned hyperparameters need another executor")

    def set_program(self, program, local_state=None) -> RoundExecutor:
        """Run ``program`` on this executor's clients (an executor that a population opened
        before the fit built its program: Ray shards, Flower nodes); ``local_state``: the
        stateful clients' rows, or None."""
        raise NotImplementedError(f"{type(self).__name__} is bound to its program")

    def secure_clients(self, cohort, params: dict, ids: np.ndarray, hp, job):
        """Begin a secure round where the clients run: they train, then begin the
        aggregator's ``job`` (a ``SecureJob``: encode, mask) and wait for the protocol's
        steps; returns their halves as the server half talks to them (``supports_secure``
        only)."""
        raise NotImplementedError(f"{type(self).__name__} does not run secure-aggregation "
                                  "clients where they are")

    def secure_reports(self, cohort, params: dict, tangents, ids: np.ndarray, job):
        """As ``secure_clients``, for masked hypergradient reports."""
        raise NotImplementedError(f"{type(self).__name__} does not run secure-aggregation "
                                  "clients where they are")

    def attribute(self, stats: dict) -> dict:
        """What this executor can attribute to where its clients ran, given the aggregator's
        round ``stats`` (merged into the round's history record): a Flower run names the nodes
        whose uploads the round's clip cut; nothing here."""
        return {}

    def kept_rows(self, local):
        """The stateful clients' rows (``local``) as the fit may read them at the end of a
        run: here they are the rows this process kept (in process, Ray); an executor whose
        devices keep their own rows (a Flower run of FURL) returns None."""
        return local

    def node_finding(self):
        """The measured cause of a divergence that this executor can name from what it saw of
        its nodes (a Flower run: one node's wild uploads), or None."""
        return None

    def close(self) -> None:
        """Release what the run holds (actors, connections); nothing here."""
        return None


class Executor(Params, ABC):
    """Where the client work runs: a parameter object, bound once per run.

    Examples
    --------
    >>> from fedcf.federated import Executor, LocalExecutor
    >>> class Here(Executor):  # a new executor: a parameter object with bind
    ...     def bind(self, program, data, local_state=None):
    ...         return LocalExecutor().bind(program, data, local_state)
    >>> Here()
    Here()
    """

    @abstractmethod
    def bind(self, program, data, local_state=None) -> RoundExecutor:
        """The executor of one run: ``data`` is the population's user-grouped CSR
        (indptr, items, values); ``local_state`` the stateful baselines' user rows or None."""

    def open(self, source):
        """A population built where the clients run, from a spec (``SyntheticPopulation``);
        None when this executor builds populations here."""
        return None


# ---------------------------------------------------------------------- privacy accounting
class Accountant(ABC):
    """The privacy spent by a run: ``compose`` one more round (or several) of a Poisson-
    sampled Gaussian mechanism at rate q and noise multiplier σ; ``epsilon()`` the ε at the
    accountant's δ; ``state()`` what a checkpoint stores (``from_state`` rebuilds it).

    Examples
    --------
    >>> from fedcf.federated.aggregators.accounting import RdpAccountant
    >>> acc = RdpAccountant(delta=1e-6)
    >>> acc.compose(0.01, 1.0, rounds=10)
    >>> acc.state()["events"]
    [[0.01, 1.0, 10]]
    """

    delta: float

    @abstractmethod
    def compose(self, q: float, noise_multiplier: float, rounds: int = 1) -> None: ...

    @abstractmethod
    def epsilon(self) -> float: ...

    @abstractmethod
    def state(self) -> dict: ...

    @classmethod
    @abstractmethod
    def from_state(cls, state: dict) -> Accountant: ...


# ---------------------------------------------------------------------- aggregators
class Aggregator(Params, ABC):
    """Phase 3: the round's ClientOutputs → one GlobalDelta.

    ``linear`` aggregators (``WeightedMean`` and its subclasses that only change per-client
    factors, the denominator or ``finish``) can also be computed from partial sums reduced where
    the clients ran. ``sampling`` is the client sampling the aggregator's guarantee needs
    ("poisson" for differential privacy; the selector obeys it). A bound DP aggregator has an
    ``accountant`` (a fresh ``Accountant`` the run composes ``round_mechanism()`` into after
    every round and checkpoints); None without DP. ``round_stats`` holds the last round's
    measurements, merged into its history record.

    Examples
    --------
    >>> from fedcf.federated import Aggregator, WeightedMean
    >>> isinstance(WeightedMean(), Aggregator), WeightedMean.linear
    (True, True)
    """

    linear: ClassVar[bool] = False
    # masks uploads: on an executor with ``supports_secure`` the clients encode and mask where
    # they run and the aggregator's ``remote_round`` sees protocol messages only
    secure: ClassVar[bool] = False
    round_stats: dict = {}
    report_stats: dict = {}  # the last hypergradient report round's measurements

    @property
    def sampling(self) -> str:
        return "any"

    def node_recipe(self) -> dict | None:
        """A linear aggregator's public rule for each client's factor, which a node running
        several clients applies itself to send their sums (``weighted.recipe_numerators``);
        None: the node sends every upload."""
        return None

    # whether the Poisson cohorts come from the OS's secure generator, and whether the
    # accountant's ε is a guarantee (both False only for seeded, reproducible DP noise)
    secret_sampling: ClassVar[bool] = False
    guarantee: ClassVar[bool] = True

    def bind(self, context: RunContext) -> Aggregator:
        """This aggregator fixed to one run (validated; a bound copy when it keeps state)."""
        self.validate()
        return self

    @abstractmethod
    def __call__(self, out, hp, round_idx: int = 0):
        """The GlobalDelta of the cohort's outputs ``out`` under round hyperparameters ``hp``."""

    accountant: Accountant | None = None

    public_items = None  # a DP aggregator's public item vocabulary

    def state(self) -> dict:
        """What a bound aggregator carries from round to round (JSON; checkpointed)."""
        return {}

    def load_state(self, state: dict) -> None:
        """Continue from ``state()`` of a checkpointed run."""

    def public_release(self, rating_scale, biases: bool) -> float:
        """μ of a release under DP from public figures (DP aggregators)."""
        raise NotImplementedError(f"{type(self).__name__} declares Poisson sampling but gives "
                                  "no public μ (public_release)")

    def check_resume(self, spent: Accountant) -> None:
        """Refuse to continue a run whose privacy already ``spent`` this bound aggregator cannot
        honour (DP aggregators; others accept any)."""

    def round_mechanism(self) -> tuple[float, float]:
        """(q, σ) of one round, for the accountant (DP aggregators only)."""
        raise NotImplementedError(f"{type(self).__name__} adds no noise")

    def round_mechanisms(self) -> list:
        """Every (q, σ) one round composes into the accountant: the update's, and with
        hypergradient reports theirs (DP aggregators only)."""
        return [self.round_mechanism()]

    def report_mean(self, reports, clip: float, round_idx: int = 0):
        """The mean of one reporting cohort's hypergradient ``Reports`` (reports.py) as this
        aggregator protects them, or None when no report counts."""
        raise NotImplementedError(f"{type(self).__name__} does not aggregate hypergradient "
                                  "reports; use the weighted mean, SecureAggregation or "
                                  "DifferentialPrivacy")

    @property
    def sigma(self) -> float | None:
        """The noise multiplier of a bound DP aggregator, else None."""
        return None

    @property
    def noise_std(self) -> float | None:
        """The noise's standard deviation per value of the mean update of a bound DP
        aggregator (public), else None."""
        return None

    @property
    def inner(self) -> Aggregator:
        """The summing aggregator a mechanism wraps (DP around secure aggregation); itself
        when it wraps none."""
        return self

    def client_round(self, executor, cohort, params: dict, ids, hp, round_idx: int = 0, *,
                     uploads: bool = False):
        """Phases 2 and 3 of a round as this aggregator takes its inputs: masked where the
        clients run (``secure`` on an executor that ``supports_secure``), summed where they ran
        (``linear`` on one that ``supports_partials``, unless the caller needs the ``uploads``),
        else from every upload. Returns (the uploads or None, the GlobalDelta, seconds of
        client work)."""
        t0 = time.perf_counter()
        if self.secure and executor.supports_secure:
            delta = self.remote_round(executor, cohort, params, ids, hp, round_idx)
            return None, delta, time.perf_counter() - t0
        if self.linear and executor.supports_partials and not uploads:
            parts = executor.partials(cohort, params, ids, self, hp)
            return None, self.reduce(parts, round_idx), time.perf_counter() - t0
        outputs = executor.run(cohort, params, ids)
        work = time.perf_counter() - t0
        return outputs, self(outputs, hp, round_idx), work

    def partials(self, out, hp):
        """The PartialSums of some clients' outputs, which a node or shard running them sends
        in place of their uploads (``linear`` only)."""
        raise NotImplementedError(f"{type(self).__name__} is not linear: it needs each "
                                  "client's upload")

    def reduce(self, parts, round_idx: int = 0):
        """The GlobalDelta from PartialSums reduced where the clients ran (``linear`` only)."""
        raise NotImplementedError(f"{type(self).__name__} is not linear: it needs each "
                                  "client's upload")

    def remote_round(self, executor, cohort, params: dict, ids, hp, round_idx: int):
        """The GlobalDelta of a ``secure`` round whose clients encode and mask where they run
        (an executor with ``supports_secure``)."""
        raise NotImplementedError(f"{type(self).__name__} does not mask uploads")

    def remote_reports(self, executor, cohort, params: dict, tangents, ids, clip: float,
                       round_idx: int = 0):
        """As ``report_mean``, the clients masking their reports where they run (``secure``
        only)."""
        raise NotImplementedError(f"{type(self).__name__} does not mask reports")


def phase_rule(kind: str, contract):
    """A parameter rule (see ``_validation``): a registered name or a ``contract`` instance,
    validated, as the object the run uses."""
    from ...registry import resolve

    def rule(name, value):
        obj = resolve(kind, value, contract, name)
        obj.validate()
        return obj
    return rule
