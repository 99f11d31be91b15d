"""Federated matrix-factorization estimators: FedReconMF (Federated Reconstruction), and the
stateful baselines FedAvgMF (user rows kept on the server) and FURLMF (user rows kept on device).

All three share one round loop: sample clients → one jitted call runs every sampled client →
deterministic weighted mean of the sparse global deltas → server optimizer step.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from sklearn.utils import check_random_state
from tqdm.auto import tqdm

from .._kernels.als import implicit_solve_rows
from .._kernels.federated import (
    INIT_UNIFORM,
    INIT_ZEROS,
    RECON_ALS,
    RECON_SGD,
    SPLIT_NONE,
    SPLIT_RANDOM,
    SPLIT_TIME,
    client_cfg,
    fedrecon_clients,
    fedrecon_implicit_clients,
    fedrecon_implicit_full_clients,
    implicit_slots,
    query_sizes,
    stateful_clients,
)
from .._kernels.rng import stream_key
from .._kernels.sgd import sgd_hp, sgd_reconstruct_rows
from .._validation import check_choice, check_dtype, check_float, check_int
from ..datasets import Interactions
from ..models.base import MFEstimatorBase
from ..models.implicit_mf import coerce_implicit, item_gram
from .optimizers import OPTIMIZERS, make_server_optimizer, state_from_arrays, state_to_arrays
from .rounds import aggregate, load_checkpoint, sample_round, save_checkpoint

_SPLITS = {"none": SPLIT_NONE, "random": SPLIT_RANDOM, "time": SPLIT_TIME}
_EVAL_STREAM = 2**40 + 17  # "round" index of the streams used for reconstruction at inference
# parameters that may differ between a checkpoint and the run that resumes it
_RESUME_FREE = {"verbose", "checkpoint_path", "checkpoint_every", "eval_every", "n_rounds"}


class _FederatedMFBase(MFEstimatorBase):
    """Round loop and parameters shared by the federated estimators (not used directly)."""

    # ------------------------------------------------------------------ validation
    def _validate_common(self):
        check_int("n_factors", self.n_factors, low=1)
        check_int("n_rounds", self.n_rounds, low=0)
        check_int("clients_per_round", self.clients_per_round, low=1)
        check_choice("server_optimizer", self.server_optimizer, set(OPTIMIZERS))
        check_float("learning_rate", self.learning_rate, low=0.0)
        check_int("batch_size", self.batch_size, low=1)
        check_int("update_steps", self.update_steps, low=0)
        check_int("update_epochs", self.update_epochs, low=1)
        check_float("regularization", self.regularization, low=0.0)
        check_choice("client_weighting", self.client_weighting, {"num_examples", "uniform"})
        check_int("min_examples", self.min_examples, low=0)
        check_float("oversample", self.oversample, low=0.0)
        check_float("dropout", self.dropout, low=0.0, high=1.0)
        check_float("init_scale", self.init_scale, low=0.0)
        check_int("eval_every", self.eval_every, low=0)
        check_int("checkpoint_every", self.checkpoint_every, low=1)
        if self.dropout >= 1.0:
            raise ValueError("dropout must be < 1 (with dropout=1 no client ever reports)")
        return check_dtype(self.dtype)

    def _seed(self) -> int:
        rs = self.random_state
        if isinstance(rs, (int, np.integer)) and not isinstance(rs, bool):
            return int(rs) & 0x7FFFFFFFFFFFFFFF
        return int(check_random_state(rs).randint(0, 2**31 - 1))

    def _update_hp(self, mu, joint):
        return sgd_hp(self.learning_rate, self.regularization, self.batch_size, self.update_steps,
                      self.update_epochs, mu, self.biases, joint)

    # ------------------------------------------------------------------ hooks for subclasses
    def _init_local_state(self, inter, rng, dtype):
        return None

    def _query_sizes(self, counts):
        return counts.astype(np.int64)

    def _slots(self, counts, query_sizes):
        """Output slots per client (default: one per query example)."""
        return query_sizes

    def _dense_delta(self, Q, weights, agg):
        """A dense term to add to the round's mean delta of Q (default: none)."""
        return None

    def _run_clients(self, data, clients, glob, local, ids, out, mu):  # pragma: no cover
        raise NotImplementedError

    def _values_down(self, n_items, K, n_clients):
        """Numbers broadcast to the clients of a round: the whole global model to each."""
        return n_clients * (n_items * (K + 1) + 1)

    def _values_up_local(self, n_used, K):
        return 0

    def _finish_local_state(self, local):
        pass

    # ------------------------------------------------------------------ fit
    def fit(self, X, y=None, *, callback=None, availability=None, **data_kwargs):
        """Train with federated rounds on a DataFrame / Interactions / sparse matrix.

        ``availability(round) -> dense user ids`` optionally says which clients are reachable in
        a round (e.g. charging and on Wi-Fi); sampling then draws only from those.

        Each user is one client. ``callback(model, round)`` is called every ``eval_every``
        rounds with the model's fitted attributes set to the current global parameters; a dict
        it returns is stored in that round's ``history_`` entry. With ``checkpoint_path`` the
        state is saved atomically every ``checkpoint_every`` rounds and at the end, and a later
        ``fit`` with the same parameters and data resumes from it (same result as one run).
        """
        dtype = self._validate()
        inter = Interactions.coerce(X, **data_kwargs)
        seed = self._seed()
        rng = np.random.default_rng([seed, 0xC0FFEE])
        K, n_items = self.n_factors, inter.n_items
        Q = rng.uniform(-self.init_scale, self.init_scale, (n_items, K)).astype(dtype)
        b = np.zeros(n_items, dtype)
        mu = float(inter.values.mean()) if self.biases else 0.0
        local = self._init_local_state(inter, rng, dtype)
        opt = make_server_optimizer(self.server_optimizer, self.server_learning_rate,
                                    self.server_optimizer_options)
        params = {"Q": Q, "b": b}
        opt_state = opt.init(params)
        history: list[dict] = []
        start = 0
        fingerprint = {"n_users": inter.n_users, "n_items": n_items, "nnz": inter.nnz,
                       "values_sum": float(inter.values.sum()), "seed": seed}
        if self.checkpoint_path is not None:
            resumed = self._try_resume(fingerprint, local)
            if resumed is not None:
                params, opt_state, history, start = resumed
        counts = inter.counts()
        eligible = np.flatnonzero(counts >= max(self.min_examples, 1))
        if len(eligible) == 0:
            raise ValueError(f"no client has at least min_examples={self.min_examples} examples "
                             f"(largest client has {int(counts.max()) if len(counts) else 0})")
        data = (inter.indptr, inter.items, inter.values)
        self.rating_scale_ = self.rating_scale or (float(inter.values.min()),
                                                   float(inter.values.max()))
        self.global_mean_ = mu
        self.user_ids_, self.item_ids_ = inter.user_ids, inter.item_ids
        self.interactions_ = inter
        bar = tqdm(range(start, self.n_rounds), desc=type(self).__name__, disable=not self.verbose,
                   initial=start, total=self.n_rounds, leave=False)
        last_good = (params, opt_state, start)
        last_saved = start if start > 0 else None
        all_bad_rounds = 0  # consecutive rounds in which every reporting client was non-finite
        for t in bar:
            t0 = time.perf_counter()
            pool = eligible if availability is None else np.intersect1d(
                eligible, np.asarray(availability(t), dtype=np.int64), assume_unique=False)
            sample = sample_round(seed, t, pool, self.clients_per_round,
                                  oversample=self.oversample, dropout=self.dropout)
            qs = self._query_sizes(counts[sample.clients])
            slots = self._slots(counts[sample.clients], qs)
            offsets = np.zeros(len(qs) + 1, np.int64)
            np.cumsum(slots, out=offsets[1:])
            total, m = int(offsets[-1]), len(qs)
            out = (offsets, np.empty(total, np.int64), np.empty((total, K), dtype),
                   np.empty(total, dtype), np.full(m, np.nan))
            ids = np.array([seed, t], dtype=np.uint64)
            self._run_clients(data, sample.clients, (params["Q"], params["b"]), local, ids, out, mu)
            w = qs.astype(np.float64)  # weight n_i = |query set|
            agg = aggregate(*out[:4], w, weighting=self.client_weighting)
            t_server = time.perf_counter()
            d_b = agg.d_b if self.biases else np.zeros_like(agg.d_b)
            dense_extra = self._dense_delta(params["Q"], w, agg)
            if opt.sparse and dense_extra is None:  # in place, O(touched rows × K)
                opt_state, new_params = opt.step_rows(opt_state, params, agg.items,
                                                      {"Q": agg.d_Q, "b": d_b})
            else:  # momentum / Adam / Yogi move rows with zero delta too: dense by nature
                dQ = np.zeros((n_items, K))
                db = np.zeros(n_items)
                dQ[agg.items] = agg.d_Q
                db[agg.items] = d_b
                if dense_extra is not None:
                    dQ += dense_extra
                opt_state, new_params = opt.step(opt_state, params, {"Q": dQ, "b": db})
            used_sparse = opt.sparse and dense_extra is None
            finite = (opt_state["rows_finite"] if used_sparse
                      else all(np.isfinite(v).all() for v in new_params.values()))
            t_server = time.perf_counter() - t_server
            all_bad_rounds = all_bad_rounds + 1 if (agg.n_nonfinite and not agg.n_used) else 0
            if all_bad_rounds >= 3 or not finite:
                kept = ""
                if self.checkpoint_path is not None and not opt.sparse:
                    self._save_checkpoint(fingerprint, *last_good, history, local)
                    kept = f" (state of round {last_good[2]} saved to {self.checkpoint_path})"
                elif self.checkpoint_path is not None and last_saved is not None:
                    # sparse steps update in place: the last periodic checkpoint is left as it is
                    kept = f" (checkpoint of round {last_saved} kept in {self.checkpoint_path})"
                what = ("every client update was non-finite for 3 rounds in a row"
                        if all_bad_rounds >= 3 else "global parameters became non-finite")
                raise FloatingPointError(
                    f"{what} at round {t}; lower server_learning_rate="
                    f"{self.server_learning_rate} or learning_rate={self.learning_rate}{kept}")
            params = new_params
            used = (w > 0) & np.isfinite(out[4])
            loss = float(np.average(out[4][used], weights=w[used])) if used.any() else float("nan")
            rec = {"round": t, "loss": loss, "clients_sampled": sample.n_sampled,
                   "clients_used": agg.n_used, "clients_dropped": sample.n_dropped,
                   "clients_surplus": sample.n_surplus, "clients_nonfinite": agg.n_nonfinite,
                   "clients_empty": agg.n_empty, "items_updated": int(len(agg.items)),
                   "values_up": agg.values_up + self._values_up_local(agg.n_used, K),
                   "values_down": self._values_down(n_items, K, m),
                   "server_seconds": t_server, "seconds": time.perf_counter() - t0}
            history.append(rec)
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            done = t + 1
            if callback is not None and self.eval_every and done % self.eval_every == 0:
                self._set_globals(params)
                self.history_ = history
                result = callback(self, done)
                if isinstance(result, dict):
                    rec["eval"] = result
            last_good = (params, opt_state, done)
            if self.checkpoint_path is not None and (done % self.checkpoint_every == 0
                                                     or done == self.n_rounds):
                self._save_checkpoint(fingerprint, params, opt_state, done, history, local)
                last_saved = done
        self._set_globals(params)
        self._finish_local_state(local)
        self.history_ = history
        return self

    def _set_globals(self, params):
        self.item_factors_ = params["Q"]
        self.item_biases_ = params["b"]

    # ------------------------------------------------------------------ checkpoints
    def _resume_params(self):
        return {k: v for k, v in self.get_params(deep=False).items() if k not in _RESUME_FREE}

    def _save_checkpoint(self, fingerprint, params, opt_state, done, history, local):
        arrays = {"Q": params["Q"], "b": params["b"], **state_to_arrays(opt_state)}
        if local is not None:
            arrays["P"], arrays["c"] = local
        meta = {"class": type(self).__name__, "round": done, "fingerprint": fingerprint,
                "params": {k: repr(v) for k, v in self._resume_params().items()},
                "history": history}
        save_checkpoint(self.checkpoint_path, arrays, meta)

    def _try_resume(self, fingerprint, local):
        import os

        if not os.path.exists(self.checkpoint_path):
            return None
        arrays, meta = load_checkpoint(self.checkpoint_path)
        if meta["class"] != type(self).__name__:
            raise ValueError(f"checkpoint {self.checkpoint_path} belongs to a {meta['class']}; "
                             "remove it or choose another checkpoint_path")
        mine = {k: repr(v) for k, v in self._resume_params().items()}
        for k in sorted(set(mine) | set(meta["params"])):
            if mine.get(k) != meta["params"].get(k):
                raise ValueError(
                    f"checkpoint {self.checkpoint_path} was written with {k}="
                    f"{meta['params'].get(k)}, this run has {k}={mine.get(k)}; it is left "
                    "untouched — use the same parameters to resume, or another checkpoint_path")
        if meta["fingerprint"] != fingerprint:
            raise ValueError(f"checkpoint {self.checkpoint_path} was written for other data "
                             f"({meta['fingerprint']} vs {fingerprint}); it is left untouched")
        if meta["round"] > self.n_rounds:
            raise ValueError(f"checkpoint {self.checkpoint_path} is at round {meta['round']}, past "
                             f"n_rounds={self.n_rounds}")
        if local is not None:
            local[0][...] = arrays["P"]
            local[1][...] = arrays["c"]
        params = {"Q": arrays["Q"], "b": arrays["b"]}
        return params, state_from_arrays(arrays), meta["history"], int(meta["round"])


class FedReconMF(_FederatedMFBase):
    """Federated Reconstruction for biased matrix factorization (Singhal et al. 2021, Alg. 1).

    Global: item factors Q, item biases b (and the global mean μ). Local: the user's factors p and
    bias c — reconstructed on the device from its support set each round, frozen while
    ``update_steps`` mini-batch steps update the rows of (Q, b) its query set touches, then
    discarded. Only the sparse delta of (Q, b) and the query size leave a client.

    Parameters (beyond the shared federated ones)
    ----------
    split : {"random", "time", "none"}
        Support/query split of each client's data; "none" reuses all data for both (NO SPLIT).
    support_fraction : float
        Share of a client's data in the support set (paper: half).
    reconstruction : {"als", "sgd"}
        "als": exact ridge solve (the optimum of the local problem); "sgd": ``recon_steps``
        mini-batch steps at ``recon_learning_rate`` from ``recon_init`` (the paper's R).
    recon_steps, recon_epochs, recon_learning_rate, recon_init ("uniform" | "zeros")
    recon_regularization : float or None
        Ridge λ per rating for reconstruction; None means 0.1 for "als" and 0 for "sgd".
    joint : bool
        Also update the local parameters during the client update (JOINT TRAINING ablation).

    Shared parameters: n_factors, biases, n_rounds, clients_per_round, server_optimizer
    ("sgd", "momentum", "adagrad", "adam", "yogi"), server_learning_rate,
    server_optimizer_options, learning_rate (client η_u), batch_size, update_steps (k_u),
    update_epochs, regularization (client L2), client_weighting ("num_examples" | "uniform"),
    min_examples, oversample, dropout, init_scale, rating_scale, eval_every, checkpoint_path,
    checkpoint_every, dtype, random_state, verbose.
    """

    _recon_lam_attr = "recon_regularization"

    def __init__(self, n_factors=50, *, biases=True, n_rounds=500, clients_per_round=100,
                 server_optimizer="sgd", server_learning_rate=1.0, server_optimizer_options=None,
                 learning_rate=0.5, batch_size=5, update_steps=50, update_epochs=1,
                 regularization=0.0, client_weighting="num_examples", min_examples=1,
                 oversample=0.0, dropout=0.0, init_scale=0.05, rating_scale=None, split="random",
                 support_fraction=0.5, reconstruction="als", recon_steps=50, recon_epochs=1,
                 recon_learning_rate=0.1, recon_init="uniform", recon_regularization=None,
                 joint=False, eval_every=0, checkpoint_path=None, checkpoint_every=50,
                 dtype="float32", random_state=None, verbose=False):
        self.n_factors = n_factors
        self.biases = biases
        self.n_rounds = n_rounds
        self.clients_per_round = clients_per_round
        self.server_optimizer = server_optimizer
        self.server_learning_rate = server_learning_rate
        self.server_optimizer_options = server_optimizer_options
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.update_steps = update_steps
        self.update_epochs = update_epochs
        self.regularization = regularization
        self.client_weighting = client_weighting
        self.min_examples = min_examples
        self.oversample = oversample
        self.dropout = dropout
        self.init_scale = init_scale
        self.rating_scale = rating_scale
        self.split = split
        self.support_fraction = support_fraction
        self.reconstruction = reconstruction
        self.recon_steps = recon_steps
        self.recon_epochs = recon_epochs
        self.recon_learning_rate = recon_learning_rate
        self.recon_init = recon_init
        self.recon_regularization = recon_regularization
        self.joint = joint
        self.eval_every = eval_every
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    def _validate(self):
        dtype = self._validate_common()
        check_choice("split", self.split, set(_SPLITS))
        check_float("support_fraction", self.support_fraction, low=0.0, high=1.0, low_open=True)
        check_choice("reconstruction", self.reconstruction, {"als", "sgd"})
        check_int("recon_steps", self.recon_steps, low=0)
        check_int("recon_epochs", self.recon_epochs, low=1)
        check_float("recon_learning_rate", self.recon_learning_rate, low=0.0)
        check_choice("recon_init", self.recon_init, {"uniform", "zeros"})
        if self.recon_regularization is not None:
            check_float("recon_regularization", self.recon_regularization, low=0.0)
        return dtype

    def _recon_lam(self) -> float:
        if self.recon_regularization is not None:
            return float(self.recon_regularization)
        return 0.1 if self.reconstruction == "als" else 0.0

    def _recon_hp(self, mu):
        return sgd_hp(self.recon_learning_rate, self._recon_lam(), self.batch_size, self.recon_steps,
                      self.recon_epochs, mu, self.biases)

    def _client_cfg(self):
        return client_cfg(_SPLITS[self.split], self.support_fraction,
                          RECON_ALS if self.reconstruction == "als" else RECON_SGD,
                          INIT_UNIFORM if self.recon_init == "uniform" else INIT_ZEROS,
                          self.init_scale, self._recon_lam(), self._recon_lam0())

    def _query_sizes(self, counts):
        return query_sizes(counts.astype(np.int64), _SPLITS[self.split], float(self.support_fraction))

    def _run_clients(self, data, clients, glob, local, ids, out, mu):
        fedrecon_clients(data, clients, glob, self._client_cfg(), self._recon_hp(mu),
                         self._update_hp(mu, self.joint), ids, out)

    def _reconstruct_csr(self, indptr, items, values):
        if self.reconstruction == "als":
            return super()._reconstruct_csr(indptr, items, values)
        n, K = len(indptr) - 1, self.item_factors_.shape[1]
        seed = self._seed()
        rng = np.random.default_rng([seed, 0xE7A1])
        if self.recon_init == "uniform":
            P = rng.uniform(-self.init_scale, self.init_scale, (n, K))
        else:
            P = np.zeros((n, K))
        c = np.zeros(n)
        seeds = np.array([stream_key(np.uint64(seed), np.uint64(_EVAL_STREAM), np.uint64(r))
                          for r in range(n)], dtype=np.uint64)
        sgd_reconstruct_rows(indptr, items, values, (self.item_factors_, self.item_biases_),
                             self._recon_hp(float(self.global_mean_)), seeds, P, c)
        dt = self.item_factors_.dtype
        bad = ~(np.isfinite(P).all(axis=1) & np.isfinite(c)) | \
            (np.abs(P).max(axis=1, initial=0.0) > np.finfo(dt).max)
        if bad.any():
            warnings.warn(f"SGD reconstruction diverged for {int(bad.sum())} of {n} users "
                          f"(recon_learning_rate={self.recon_learning_rate}); their local "
                          "parameters are NaN — lower recon_learning_rate or use "
                          "reconstruction='als'", RuntimeWarning, stacklevel=3)
            P[bad] = np.nan
            c[bad] = np.nan
        return P.astype(dt), c.astype(dt)


class _StatefulMF(_FederatedMFBase):
    """FedPer-style training: each user's row is trained jointly with the item rows it touches
    and kept between rounds (by the server for FedAvgMF, on the device for FURLMF).

    The client learning rate defaults to 0.1: with the paper's 0.5, joint steps on user and item
    rows diverge on MovieLens-100K (measured). A client whose update turns non-finite keeps its
    old user row and its item delta is dropped."""

    _saved_arrays = ("item_factors_", "item_biases_", "user_factors_", "user_biases_")
    _recon_lam_attr = "recon_regularization"

    def __init__(self, n_factors=50, *, biases=True, n_rounds=500, clients_per_round=100,
                 server_optimizer="sgd", server_learning_rate=1.0, server_optimizer_options=None,
                 learning_rate=0.1, batch_size=5, update_steps=50, update_epochs=1,
                 regularization=0.0, client_weighting="num_examples", min_examples=1,
                 oversample=0.0, dropout=0.0, init_scale=0.05, rating_scale=None,
                 recon_regularization=0.1, eval_every=0, checkpoint_path=None,
                 checkpoint_every=50, dtype="float32", random_state=None, verbose=False):
        self.n_factors = n_factors
        self.biases = biases
        self.n_rounds = n_rounds
        self.clients_per_round = clients_per_round
        self.server_optimizer = server_optimizer
        self.server_learning_rate = server_learning_rate
        self.server_optimizer_options = server_optimizer_options
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.update_steps = update_steps
        self.update_epochs = update_epochs
        self.regularization = regularization
        self.client_weighting = client_weighting
        self.min_examples = min_examples
        self.oversample = oversample
        self.dropout = dropout
        self.init_scale = init_scale
        self.rating_scale = rating_scale
        self.recon_regularization = recon_regularization
        self.eval_every = eval_every
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    def _validate(self):
        dtype = self._validate_common()
        check_float("recon_regularization", self.recon_regularization, low=0.0)
        return dtype

    def _init_local_state(self, inter, rng, dtype):
        P = rng.uniform(-self.init_scale, self.init_scale, (inter.n_users, self.n_factors))
        return P.astype(dtype), np.zeros(inter.n_users, dtype)

    def _run_clients(self, data, clients, glob, local, ids, out, mu):
        stateful_clients(data, clients, glob, local, self._update_hp(mu, True), ids, out)

    def _finish_local_state(self, local):
        self.user_factors_, self.user_biases_ = local



class FedAvgMF(_StatefulMF):
    """FedAvg for MF with user embeddings stored on the server.

    A sampled client downloads the global item rows *and its own user row*, trains both jointly
    for ``update_steps`` mini-batch steps on all its data, and uploads the item delta and its new
    user row; only that row changes on the server. As the paper notes, this equals the stateful
    FedPer approach in result — and exposes every user's embedding to the server. Unseen users are
    served by reconstruction (exact ridge solve, ``recon_regularization``).
    """

    def _values_down(self, n_items, K, n_clients):
        return n_clients * (n_items * (K + 1) + 1 + (K + 1))

    def _values_up_local(self, n_used, K):
        return n_used * (K + 1)


class FURLMF(_StatefulMF):
    """FURL (Bui et al. 2019): private user embeddings kept on each device across rounds (stateful),
    trained jointly with the federated item parameters; only the item delta is uploaded. The
    training arithmetic equals FedAvgMF's (split personalization ≡ FedPer for MF); the difference
    is where the user rows live and what is communicated. Unseen users fall back to
    reconstruction. ``user_factors_`` here stands for the rows held by the simulated devices.
    """


class FedReconImplicitMF(_FederatedMFBase):
    """Federated Reconstruction for implicit feedback (clicks, shares), score = p_u·q_i.

    Each round a sampled client reconstructs its embedding p exactly by confidence-weighted ALS
    (Hu, Koren & Volinsky: confidence 1 + ``alpha``·r on its items, 1 elsewhere) against the
    global item matrix Q and the server-broadcast Gram QᵀQ — O(n·K² + K³) on the device — then
    takes ``update_steps`` mini-batch steps on the rows of Q its positives touch plus
    ``negatives`` weak negatives drawn uniformly from the catalog per positive visit, with p
    frozen. Only the sparse delta of Q (positives and sampled negatives) and the weight leave the
    device. ``split="none"`` (support = query) is the default, as in the paper's deployment where
    most clients hold one or two shares.

    ``full_negatives=True`` uses the exact full-catalog negative term instead: with p frozen its
    effect on every item row is a rank-1 map, so a client uploads its positive rows plus one K×K
    matrix (which reveals p up to sign: use it under secure aggregation), and the server applies
    a dense −Q·M step (O(n_items·K²) per round, a dense server update). Sampling is the default:
    the upload is sparse rows only, the server step stays sparse, and on the simulated
    population and MovieLens the two reach similar quality (eval/CTR.md).
    """

    biases = False
    _recon_lam_attr = "recon_regularization"

    def __init__(self, n_factors=50, *, alpha=1.0, recon_regularization=0.01, n_rounds=500,
                 clients_per_round=100, server_optimizer="sgd", server_learning_rate=1.0,
                 server_optimizer_options=None, learning_rate=0.5, batch_size=5,
                 update_steps=50, update_epochs=1, regularization=0.0, negatives=4,
                 negative_weight=1.0, full_negatives=False, split="none", support_fraction=0.5,
                 client_weighting="num_examples", min_examples=1, oversample=0.0, dropout=0.0,
                 init_scale=0.1, eval_every=0, checkpoint_path=None, checkpoint_every=50,
                 dtype="float32", random_state=None, verbose=False):
        self.n_factors = n_factors
        self.alpha = alpha
        self.recon_regularization = recon_regularization
        self.n_rounds = n_rounds
        self.clients_per_round = clients_per_round
        self.server_optimizer = server_optimizer
        self.server_learning_rate = server_learning_rate
        self.server_optimizer_options = server_optimizer_options
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.update_steps = update_steps
        self.update_epochs = update_epochs
        self.regularization = regularization
        self.negatives = negatives
        self.negative_weight = negative_weight
        self.full_negatives = full_negatives
        self.split = split
        self.support_fraction = support_fraction
        self.client_weighting = client_weighting
        self.min_examples = min_examples
        self.oversample = oversample
        self.dropout = dropout
        self.init_scale = init_scale
        self.eval_every = eval_every
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every = checkpoint_every
        self.dtype = dtype
        self.random_state = random_state
        self.verbose = verbose

    rating_scale = None  # implicit scores are not clipped

    def _validate(self):
        dtype = self._validate_common()
        check_float("alpha", self.alpha, low=0.0)
        check_float("recon_regularization", self.recon_regularization, low=0.0, low_open=True)
        check_int("negatives", self.negatives, low=0)
        check_float("negative_weight", self.negative_weight, low=0.0)
        check_choice("split", self.split, set(_SPLITS))
        check_float("support_fraction", self.support_fraction, low=0.0, high=1.0, low_open=True)
        return dtype

    def _cfg(self):
        return np.array([_SPLITS[self.split], self.support_fraction, self.alpha,
                         self.recon_regularization, self.negatives, self.negative_weight],
                        dtype=np.float64)

    def _query_sizes(self, counts):
        return query_sizes(counts.astype(np.int64), _SPLITS[self.split], float(self.support_fraction))

    def _slots(self, counts, query_sizes):
        if self.full_negatives:
            return query_sizes
        return implicit_slots(counts.astype(np.int64), self._cfg(), self._update_hp(0.0, False))

    def _run_clients(self, data, clients, glob, local, ids, out, mu):
        Q = glob[0]
        offsets, d_items, d_Q, d_b, losses = out
        d_b[:] = 0.0
        hp = self._update_hp(0.0, False)
        if self.full_negatives:
            K = Q.shape[1]
            self._round_W = np.zeros((len(clients), K, K))
            fedrecon_implicit_full_clients(data, clients, (Q, item_gram(Q)), self._cfg(), hp, ids,
                                           Q.shape[0], (offsets, d_items, d_Q, losses,
                                                        self._round_W))
        else:
            fedrecon_implicit_clients(data, clients, (Q, item_gram(Q)), self._cfg(), hp, ids,
                                      Q.shape[0], (offsets, d_items, d_Q, losses))

    def _values_up_local(self, n_used, K):
        return n_used * K * K if self.full_negatives else 0  # the K×K matrix per client

    def _dense_delta(self, Q, weights, agg):
        """Full negatives: −Q · Σ w_u W_u / Σ w (the rank-1 parts of every client's delta),
        over the clients the aggregate kept (finite, positive weight)."""
        if not self.full_negatives:
            return None
        w = agg.client_weights
        if agg.total_weight <= 0 or not np.isfinite(self._round_W[w > 0]).all():
            return np.zeros(Q.shape)  # nothing usable this round (the guard counts it)
        M = np.tensordot(w, self._round_W, axes=1) / agg.total_weight
        return -(Q.astype(np.float64) @ M)

    def fit(self, X, y=None, *, callback=None, availability=None, **data_kwargs):
        """Fit on implicit interactions (Interactions, DataFrame with user/item[/rating as
        strength], or a sparse matrix); strengths must be >= 0. ``callback`` and
        ``availability`` as in FedReconMF.fit."""
        inter = coerce_implicit(X, **data_kwargs)
        super().fit(inter, callback=callback, availability=availability)
        self.rating_scale_ = None
        return self

    def _reconstruct_csr(self, indptr, items, values):
        n, K = len(indptr) - 1, self.item_factors_.shape[1]
        P = np.zeros((n, K), self.item_factors_.dtype)
        implicit_solve_rows(indptr, items, values, self.item_factors_,
                            item_gram(self.item_factors_),
                            np.array([float(self.alpha), float(self.recon_regularization)]), P)
        return P, np.zeros(n, P.dtype)
