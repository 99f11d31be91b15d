"""User-level differential privacy as a mechanism around a summing aggregator (DP-FedAvg,
McMahan et al. 2018): ``DifferentialPrivacy`` around the clipped sum in the clear
(``ClippedSum``) or secure aggregation, and ``DPGaussianMean``, the clipped sum in the clear
under DP. Noise and Poisson cohorts come from ``secret`` (the OS's secure
generator); ε from ``accounting``; adaptive clipping after Andrew et al. 2021.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings

import numpy as np
import pandas as pd

from ..round import secret
from ..round.contracts import Aggregator, RunContext
from ..round.phases import ClientOutputs, GlobalDelta, RoundHyperparams
from ..round.reports import clipped, dp_noise
from .dp_plan import check_delta, report_plan, warn_if_noise_swamps
from .robust import _positive
from .secagg import SecureAggregation
from .weighted import ClippedSum


class DifferentialPrivacy(Aggregator):
    """User-level differential privacy around a summing aggregator (DP-FedAvg, McMahan et al.
    2018): the clipped sum in the clear (``aggregator=None``: ``ClippedSum``) or
    ``SecureAggregation``. This class is the mechanism only — the clip, the fixed denominator,
    the noise, the accountant — and ``inner`` is the summing aggregator it wraps.

    Each client's whole upload (item-row deltas and bias deltas) is clipped to L2 norm
    ``clip_norm`` = C; the clipped uploads are summed with equal weight; Gaussian noise
    N(0, σ²C²) is added to *every* row of the catalog (noise on touched rows only would reveal
    which rows were touched); the result is divided by the fixed expected cohort size q·N. Give
    either ``noise_multiplier`` σ, or ``target_epsilon`` and σ is calibrated for the planned
    rounds at ``delta`` (fedcf.federated.aggregators.accounting). The estimator then samples clients by
    Poisson sampling with rate q = clients_per_round / eligible clients, as the accountant
    assumes, and records ε(δ) after every round in ``history_`` and ``epsilon_``.

    ``weight_cap`` = c weighs client k by w_k = min(n_k, c) / c ≤ 1 (its query size, capped)
    instead of equally — McMahan et al.'s weighted estimator: the sum Σ w_k·clip(Δ_k) still
    moves by at most C when one user is added or removed, and it is divided by the fixed
    q·Σ_users w_u. That total is taken from the simulated population (a deployment would use a
    public or privately estimated figure).

    Around ``SecureAggregation`` the clients clip and scale their own uploads before masking, and
    ``noise`` says who adds the noise: "server" (central DP: the server adds it to the unmasked
    sum) or "distributed" (each client adds N(0, σ²C²/t) before masking, t the threshold, so a
    completed round carries at least the accounted noise and the server never sees a noise-free
    sum; a lost round releases no update). Robust statistics (trimmed mean, median, FoolsGold)
    are not sums of uploads, so the Gaussian mechanism's sensitivity bound does not hold for them
    and they are refused.

    Parameters
    ----------
    aggregator : None or SecureAggregation
        What sums the clipped uploads: None, the weighted mean in the clear (linear: also from
        the shards' partial sums), or the secure-aggregation protocol.
    clip_norm : float > 0
        C, the largest L2 norm of one client's upload.
    noise_multiplier : float > 0 or None
        σ; give this or ``target_epsilon``.
    target_epsilon : float > 0 or None
        Calibrate σ so that the planned rounds spend this ε at ``delta``. A σ whose noise has
        more than ``NOISE_SWAMP`` (100) times the norm of the largest mean update warns before
        training: the model would be mostly noise.
    delta : float in (0, 1), default 1e-6
        Must be below 1 / (eligible clients).
    weight_cap : float > 0 or None
        c of the capped weights above; None weighs every client equally.
    noise : {"server", "distributed"}, default "server"
        Who adds the noise ("distributed" needs ``SecureAggregation``).
    target_quantile : float in (0, 1) or None, default None
        Adaptive clipping (Andrew et al. 2021): the clip starts at ``clip_norm`` and follows
        this quantile of the clients' upload norms, C ← C·exp(−η(b̃ − γ)) after every round,
        b̃ the noised share of clients at or below C. None: the clip stays ``clip_norm``.
        Under ``SecureAggregation`` each client's "at or below C" bit travels inside the
        masked sum, so the server learns only the survivors' count.
    clip_learning_rate : float > 0, default 0.2
        η of that update.
    clip_count_stddev : float > 0 or None, default None
        σ_b, the noise on the count of unclipped clients (None: the expected cohort / 20, the
        paper's choice). The update noise is then σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) so that the
        round stays a Gaussian mechanism of multiplier σ (accounted as such); 2σ_b must exceed σ.
    public_mean : float or None, default None
        μ of the release, a public figure within the estimator's ``rating_scale`` (which DP
        requires): the training ratings' mean would be a statistic outside ε. None: the middle
        of the scale (the item and user biases absorb the difference).
    public_items : list of raw item ids or None, default None
        The public item vocabulary: the model has a row for each of these items, rated or not,
        and a training item outside it is refused. None takes the item catalog of the data
        given to ``fit`` as public (pass ``Interactions`` built with a public ``item_catalog``
        where the set of rated items must stay private).
    accounting : {"rdp", "pld"}, default "rdp"
        dp-accounting's accountant for ε and for calibrating σ to ``target_epsilon``: Rényi DP,
        or the privacy-loss distribution (tighter for many rounds, a little slower per round).
        The fitted model reports both in ``epsilons_``. At a tiny σ (a huge target ε) the PLD
        grid is made coarser (still a pessimistic bound), or RDP's bound is reported for it,
        so accounting takes seconds, not gigabytes.
    insecure_seeded_noise : bool, default False
        Draw the noise and the Poisson cohorts from ``random_state`` (reproducible runs, tests)
        instead of the operating system's secure generator (``fedcf.federated.round.secret``). Anyone
        who knows the seed can then remove the noise, so no ε is reported (``epsilon_`` is None
        and a warning says why).

    By default the noise and the cohorts are secret: two runs with the same ``random_state``
    differ in them (and in everything they touch), a resumed run is valid but not bit-identical,
    and a Ray run equals a local one only with ``insecure_seeded_noise=True``.

    Examples
    --------
    >>> from fedcf import FedReconMF
    >>> from fedcf.federated import DifferentialPrivacy, SecureAggregation
    >>> agg = DifferentialPrivacy(SecureAggregation(value_bound=10.0), clip_norm=0.5,
    ...                           target_epsilon=2.0, noise="distributed")
    >>> agg.sampling, agg.linear, DifferentialPrivacy(clip_norm=0.5, noise_multiplier=1.0).linear
    ('poisson', False, True)
    >>> from fedcf.federated import DPGaussianMean
    >>> est = FedReconMF(aggregator=DPGaussianMean(1.0, noise_multiplier=0.5))
    >>> est.set_params(aggregator__clip_norm=0.3).aggregator.clip_norm
    0.3
    """

    def __init__(self, aggregator=None, clip_norm: float = 1.0,
                 noise_multiplier: float | None = None, *, target_epsilon: float | None = None,
                 delta: float = 1e-6, weight_cap: float | None = None, noise: str = "server",
                 target_quantile: float | None = None, clip_learning_rate: float = 0.2,
                 clip_count_stddev: float | None = None, public_mean: float | None = None,
                 public_items=None, accounting: str = "rdp", insecure_seeded_noise: bool = False):
        self.aggregator, self.clip_norm, self.noise_multiplier = aggregator, clip_norm, \
            noise_multiplier
        if isinstance(public_items, (np.ndarray, pd.Index, pd.Series)):
            public_items = public_items.tolist()  # a list compares by value
        self.public_mean, self.public_items = public_mean, public_items
        self.target_quantile, self.clip_learning_rate = target_quantile, clip_learning_rate
        self.clip_count_stddev = clip_count_stddev
        self.clip_, self.unclipped_ = clip_norm, 0
        self.target_epsilon, self.delta, self.weight_cap = target_epsilon, delta, weight_cap
        self.noise = noise
        self.accounting = accounting
        self.insecure_seeded_noise = insecure_seeded_noise
        self.context, self.sigma_, self.denominator_, self.clear_ = None, None, None, None
        self.validate()

    @property
    def inner(self):
        """The summing aggregator the noise wraps: secure aggregation, or the clipped sum in the
        clear (``ClippedSum``; the bound run's own after ``bind``)."""
        if self.aggregator is not None:
            return self.aggregator
        return self.clear_ or ClippedSum(self.clip_norm, self.weight_cap)

    def _clear(self) -> ClippedSum:
        """The clipped sum in the clear (``inner``) at this round's clip."""
        clear = self.inner
        clear.clip_norm = self.clip_
        return clear

    @property
    def linear(self) -> bool:  # the mean in the clear with a fixed clip: reducible from partials
        return self.aggregator is None and self.target_quantile is None

    @property
    def round_stats(self) -> dict:
        stats = {} if self.aggregator is None else dict(self.aggregator.round_stats)
        if self.target_quantile is not None:
            stats["clip_norm"] = self.used_clip_
        return stats

    @property
    def sampling(self) -> str:
        return "poisson"  # what the accountant's subsampling amplification assumes

    @property
    def secret_sampling(self) -> bool:
        """Cohorts from the OS's secure generator (not from the seed)."""
        return not self.insecure_seeded_noise

    @property
    def guarantee(self) -> bool:
        """Whether the accountant's ε holds: not when the noise can be regenerated."""
        return not self.insecure_seeded_noise

    def validate(self):
        _positive("clip_norm", self.clip_norm)
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        for name, value in (("noise_multiplier", self.noise_multiplier),
                            ("target_epsilon", self.target_epsilon),
                            ("weight_cap", self.weight_cap)):
            if value is not None:
                _positive(name, value)
        _positive("delta", self.delta, upper=1.0)
        if self.aggregator is not None and not isinstance(self.aggregator, SecureAggregation):
            raise TypeError(f"DifferentialPrivacy sums clipped uploads: aggregator must be None "
                            f"(the weighted mean) or a SecureAggregation, got {self.aggregator!r}"
                            " (a robust statistic is not a sum: its sensitivity is not C)")
        if self.noise not in ("server", "distributed"):
            raise ValueError(f"noise must be 'server' or 'distributed', got {self.noise!r}")
        pm = self.public_mean
        if pm is not None and (isinstance(pm, bool) or not isinstance(pm, (int, float, np.number))
                               or not np.isfinite(pm)):
            raise ValueError(f"public_mean must be None or a finite number, got {pm!r}")
        items = self.public_items
        if items is not None:
            if not isinstance(items, (list, tuple)) or not len(items):
                raise ValueError(f"public_items must be None or a non-empty list of raw item "
                                 f"ids, got {items!r}")
            dup = pd.Index(items).duplicated()
            if dup.any():
                raise ValueError(f"public_items: item {items[int(np.argmax(dup))]!r} appears "
                                 "twice")
        if self.target_quantile is not None:
            tq = self.target_quantile
            if isinstance(tq, bool) or not isinstance(tq, numbers.Real) or not 0 < tq < 1:
                raise ValueError(f"target_quantile must be None or in (0, 1), got {tq!r}")
            _positive("clip_learning_rate", self.clip_learning_rate)
            if self.clip_count_stddev is not None:
                _positive("clip_count_stddev", self.clip_count_stddev)
        if self.accounting not in ("rdp", "pld"):
            raise ValueError(f"accounting must be 'rdp' or 'pld', got {self.accounting!r}")
        if not isinstance(self.insecure_seeded_noise, (bool, np.bool_)):
            raise ValueError(f"insecure_seeded_noise must be True or False, got "
                             f"{self.insecure_seeded_noise!r}")
        if self.noise == "distributed" and self.aggregator is None:
            raise ValueError("noise='distributed' needs aggregator=SecureAggregation(...): "
                             "clients' noise shares only hide anything under masking")

    def bind(self, context: RunContext) -> DifferentialPrivacy:
        """Fix q, the rounds, the catalog and the seed of the noise for one run."""
        from .accounting import PldAccountant, RdpAccountant, noise_for_epsilon

        self.validate()
        n, m = context.n_eligible, context.clients_per_round
        check_delta(self.delta, n)
        q = min(1.0, m / n)
        plan, report_clients = report_plan(context, q)
        sigma = self.noise_multiplier if self.noise_multiplier is not None else \
            noise_for_epsilon(self.target_epsilon, q, max(context.n_rounds, 1), self.delta,
                              self.accounting, mechanisms=plan)
        bound = type(self)(**self.get_params(deep=False))
        if self.aggregator is not None:
            bound.aggregator = self.aggregator.bind(context)
        bound.sigma_ = float(sigma)
        bound.mechanisms_ = [(float(r), float(sigma) * f) for r, f in plan]
        bound.report_denominator_ = report_clients
        total = n if self.weight_cap is None else float(
            np.minimum(context.eligible_weights, self.weight_cap).sum() / self.weight_cap)
        bound.context = context
        bound.q, bound.denominator_ = q, q * total
        if self.aggregator is None:
            bound.clear_ = ClippedSum(float(self.clip_norm), self.weight_cap, bound.denominator_)
        bound.accountant = (RdpAccountant if self.accounting == "rdp" else
                            PldAccountant)(self.delta)
        bound.clip_ = bound.used_clip_ = float(self.clip_norm)
        bound.count_std_, bound.update_sigma_ = None, bound.sigma_
        if self.target_quantile is not None:
            bound.count_std_ = float(self.clip_count_stddev or q * n / 20.0)
            if not 2 * bound.count_std_ > bound.sigma_:
                raise ValueError(f"clip_count_stddev={bound.count_std_:g} is too small for noise "
                                 f"multiplier {bound.sigma_:.4g}: 2·σ_b must exceed σ (the "
                                 "count's noise is part of the accounted mechanism)")
            bound.update_sigma_ = (bound.sigma_ ** -2 - (2 * bound.count_std_) ** -2) ** -0.5
        warn_if_noise_swamps(bound, context)
        if self.insecure_seeded_noise:
            warnings.warn("insecure_seeded_noise=True: the DP noise and the client sampling are "
                          "drawn from random_state, so anyone who knows it can remove the noise; "
                          "no ε is reported for this run (epsilon_ is None)", UserWarning,
                          stacklevel=2)
        return bound

    def __call__(self, out: ClientOutputs, hp: RoundHyperparams, round_idx: int = 0
                 ) -> GlobalDelta:
        if self.aggregator is None:
            clear = self._clear()
            delta = clear(out, hp, round_idx)
            self.unclipped_ = clear.unclipped_
            return self.finish(delta, round_idx)
        return self.after_secure(self.aggregator.masked_mean(
            out, hp, round_idx, **self.secure_kwargs()), round_idx)

    def partials(self, out: ClientOutputs, hp: RoundHyperparams):
        """The clipped sum's PartialSums (``linear``: a fixed clip in the clear)."""
        return self._clear().partials(out, hp)

    def reduce(self, parts, round_idx: int = 0) -> GlobalDelta:
        """The clipped sum of the partial sums, noised."""
        return self.finish(self._clear().reduce(parts, round_idx), round_idx)

    @property
    def secure(self) -> bool:
        return isinstance(self.aggregator, SecureAggregation)

    def remote_round(self, executor, cohort, params, ids, hp, round_idx: int) -> GlobalDelta:
        """Under secure aggregation with clients that run elsewhere (Ray shards): they clip,
        noise and mask there."""
        return self.after_secure(self.aggregator.remote_round(
            executor, cohort, params, ids, hp, round_idx, **self.secure_kwargs()), round_idx)

    def secure_kwargs(self) -> dict:
        """How the clients encode under secure aggregation: clipped by this rule, divided by
        the fixed denominator, with their share of the noise in the distributed mode."""
        distributed, adaptive = self.noise == "distributed", self.target_quantile is not None
        return dict(clip=(self.clip_, self.weight_cap), denominator=self.denominator_,
                    noise_scale=self.update_sigma_ * self.clip_ if distributed else 0.0,
                    secret_noise=not self.insecure_seeded_noise, adaptive=adaptive,
                    count_noise_scale=self.count_std_ if distributed and adaptive else 0.0)

    def after_secure(self, delta: GlobalDelta, round_idx: int) -> GlobalDelta:
        """The server's step after the unmasked sum: the clients' not-clipped bits arrive as
        one count (adaptive clipping); server noise is added here, distributed noise is
        already in the sum."""
        self.unclipped_ = self.aggregator.round_stats.get("secagg_indicator_sum", 0)
        if delta.summary.n_used == 0:  # a round not aggregated: no release, no clip step
            return delta
        if self.noise == "distributed":  # the clients noised the count too
            self.adapt_clip(round_idx, noised=True)
            return delta
        return self.finish(delta, round_idx)

    def node_recipe(self) -> dict | None:
        return self._clear().node_recipe() if self.linear else None

    def finish(self, delta: GlobalDelta, round_idx: int) -> GlobalDelta:
        """The mechanism's step after the sum: Gaussian noise on every row of the catalog, then
        the adaptive clip's step."""
        c = self.context
        n_items, K = c.n_items, c.n_factors
        std = self.update_sigma_ * self.clip_ / self.denominator_
        if self.insecure_seeded_noise:
            rng = np.random.default_rng([c.seed, round_idx, 0xD9])
            dQ = rng.normal(0.0, std, (n_items, K))
            db = rng.normal(0.0, std, n_items) if c.biases else np.zeros(n_items)
        else:  # secret: from the OS, never from the seed
            dQ = secret.normal((n_items, K), std)
            db = secret.normal(n_items, std) if c.biases else np.zeros(n_items)
        dQ[delta.items] += delta.d_Q
        if c.biases:
            db[delta.items] += delta.d_b
        self.adapt_clip(round_idx)
        return dataclasses.replace(delta, items=np.arange(n_items), d_Q=dQ, d_b=db)

    @property
    def noise_std(self) -> float | None:
        """The noise's standard deviation per value of the mean update (a bound run; None
        before ``bind``): public, from σ, the clip and the fixed denominator."""
        if self.denominator_ is None:
            return None
        return float(self.update_sigma_ * self.clip_ / self.denominator_)

    def adapt_clip(self, round_idx: int, noised: bool = False) -> None:
        """Adaptive clipping's geometric step toward the target quantile, from the noised
        share of unclipped clients (a no-op with a fixed clip). The released count is of
        centred bits, Σ (b − ½) (Andrew et al. 2021, as tf-privacy's quantile estimator):
        one user moves it by ½, the sensitivity the accountant's σ/(2σ_b) assumes. With
        ``noised`` the clients already added the count's noise (distributed DP)."""
        self.used_clip_ = self.clip_
        if self.target_quantile is None:
            return
        noise = 0.0 if noised else np.random.default_rng(
            [self.context.seed, round_idx, 0xC1]).normal(0.0, self.count_std_) \
            if self.insecure_seeded_noise else float(secret.normal(1, self.count_std_)[0])
        share = (self.unclipped_ + noise) / (self.q * self.context.n_eligible) + 0.5
        self.clip_ = float(self.clip_ * np.exp(-self.clip_learning_rate *
                                               (share - self.target_quantile)))

    def state(self) -> dict:
        return {"clip": self.clip_} if self.target_quantile is not None else {}

    def load_state(self, state: dict) -> None:
        if self.target_quantile is not None and "clip" in state:
            self.clip_ = float(state["clip"])

    def public_release(self, rating_scale, biases: bool) -> float:
        """μ of the release under DP: ``public_mean`` (checked against the public
        ``rating_scale``), else the scale's middle; 0 without biases."""
        if rating_scale is None:
            raise ValueError("differential privacy needs a public rating_scale=(low, high) on "
                             "the estimator: the range of the training ratings would reveal the "
                             "users who gave the extreme ones")
        lo, hi = rating_scale
        pm = (lo + hi) / 2.0 if self.public_mean is None else float(self.public_mean)
        if not lo <= pm <= hi:
            raise ValueError(f"public_mean={self.public_mean} is outside rating_scale="
                             f"{tuple(rating_scale)}; give a mean within the scale")
        return pm if biases else 0.0

    def check_resume(self, spent) -> None:
        """Under ``target_epsilon`` σ was calibrated for this run's ``n_rounds``: a checkpoint
        whose rounds ran at another σ (written with another n_rounds) cannot be continued
        within the target, so it is refused."""
        if self.target_epsilon is None:
            return
        used = sorted({s for _, s, r in spent.events if r})
        if used and not np.allclose(used, self.sigma, rtol=1e-9, atol=0.0):
            raise ValueError(f"the checkpoint's rounds ran with noise multiplier {used[0]:.6g}, "
                             f"calibrated for target_epsilon={self.target_epsilon} over another "
                             f"n_rounds; this run's n_rounds needs {self.sigma:.6g}, and the "
                             "rounds already run cannot be re-noised. Resume with the original "
                             "n_rounds, or give noise_multiplier (ε is then composed over the "
                             "rounds as they ran)")

    def round_mechanism(self) -> tuple[float, float]:
        """(q, σ): each round is a Poisson-sampled Gaussian mechanism (per user)."""
        return self.q, self.sigma

    def round_mechanisms(self) -> list:
        """What a round composes: (q, σ); with hypergradient reports from the round's own
        cohort, the update and the reports (each of multiplier σ, on the same Poisson cohort)
        are one Gaussian mechanism of multiplier σ/√2; with a held-out reporting cohort,
        (q_h, σ) is composed too, as if every user were in both populations."""
        return list(self.mechanisms_)

    # ------------------------------------------------------------------ hypergradient reports
    def report_mean(self, reports, clip: float, round_idx: int = 0):
        """Hypergradient reports under DP: each clipped to L2 norm ``clip`` and summed with
        equal weight (in the clear, or masked by ``SecureAggregation``), Gaussian noise
        N(0, σ²·clip²) added, divided by the expected number of reporting clients."""
        if self.aggregator is not None:
            return self._noised_report(self.aggregator.report_mean(
                reports, clip, round_idx, **self._report_kwargs(clip)), clip, round_idx)
        ok = reports.usable()
        total = clipped(reports.jvp[ok], clip).sum(axis=0) / self.report_denominator_
        return self._noised_report(total, clip, round_idx)

    def remote_reports(self, executor, cohort, params, tangents, ids, clip: float,
                       round_idx: int = 0):
        """As ``report_mean``, the clients clipping and masking where they run."""
        return self._noised_report(self.aggregator.remote_reports(
            executor, cohort, params, tangents, ids, clip, round_idx,
            **self._report_kwargs(clip)), clip, round_idx)

    @property
    def report_stats(self) -> dict:
        return {} if self.aggregator is None else self.aggregator.report_stats

    def _report_kwargs(self, clip: float) -> dict:
        distributed = self.noise == "distributed"
        return dict(equal=True, denominator=self.report_denominator_,
                    noise_scale=self.sigma_ * clip if distributed else 0.0,
                    secret_noise=not self.insecure_seeded_noise)

    def _noised_report(self, mean, clip: float, round_idx: int):
        """Server noise on a report mean (the distributed mode's is already in it); None (a
        round not aggregated) releases nothing."""
        if mean is None or self.noise == "distributed":
            return mean
        std = self.sigma_ * clip / self.report_denominator_
        return mean + dp_noise(len(mean), std, not self.insecure_seeded_noise,
                               (self.context.seed, round_idx))

    @property
    def sigma(self) -> float | None:
        """σ of the bound run (None before ``bind``)."""
        return self.sigma_


class DPGaussianMean(DifferentialPrivacy):
    """The weighted mean under user-level differential privacy: ``DifferentialPrivacy`` with
    the mean in the clear (linear, so a Ray run reduces it from the shards' partial sums).

    Parameters
    ----------
    clip_norm, noise_multiplier, target_epsilon, delta, weight_cap, target_quantile,
    clip_learning_rate, clip_count_stddev, public_mean, public_items, accounting,
    insecure_seeded_noise
        As in ``DifferentialPrivacy``.

    Examples
    --------
    >>> from fedcf.federated import DPGaussianMean
    >>> DPGaussianMean(0.5, noise_multiplier=1.1).sampling
    'poisson'
    """

    def __init__(self, clip_norm: float = 1.0, noise_multiplier: float | None = None, *,
                 target_epsilon: float | None = None, delta: float = 1e-6,
                 weight_cap: float | None = None, target_quantile: float | None = None,
                 clip_learning_rate: float = 0.2, clip_count_stddev: float | None = None,
                 public_mean: float | None = None, public_items=None, accounting: str = "rdp",
                 insecure_seeded_noise: bool = False):
        super().__init__(None, clip_norm, noise_multiplier, target_epsilon=target_epsilon,
                         delta=delta, weight_cap=weight_cap, target_quantile=target_quantile,
                         clip_learning_rate=clip_learning_rate,
                         clip_count_stddev=clip_count_stddev, public_mean=public_mean,
                         public_items=public_items, accounting=accounting,
                         insecure_seeded_noise=insecure_seeded_noise)
