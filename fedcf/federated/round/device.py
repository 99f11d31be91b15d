"""The device's own rules for secure aggregation and distributed differential privacy.

A server sends each device a job (``SecureJob``: the encoding, the threshold t, the session);
an honest server's job follows its aggregator's settings, but a device cannot tell an honest
server from one that deviates. So the device holds a policy of its own (``DevicePolicy``),
which it is given by whoever runs it — a Flower node's node config, the executor of a
simulation — and never by a message, and a memory of what it answered (``Device``):

- it takes part only in cohorts of at least ``min_cohort`` clients with at least
  ``min_holders`` holders of its shares, and only when t ≥ ⌈threshold·h⌉ of its h holders
  (a cohort of one, or a threshold a few colluders reach, is refused);
- under a DP policy (``noise_multiplier``), it adds its own noise share at no less than the
  policy's σ for the job's clip and threshold, from the OS, and refuses a clip above
  ``max_clip``;
- it answers one job per (kind, round) and per (kind, model digest): the same round or the
  same model sent again (the difference attack: the cohorts S and S − {v} on one model) is
  refused;
- each of its clients takes part in at most ``max_participations`` rounds of a run.

A refusal raises ``DeviceRefusal`` (the device sends nothing more for the job) and is
logged on the device under "fedcf.device", naming the rule.
"""

from __future__ import annotations

import hashlib
import logging
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("fedcf.device")


class DeviceRefusal(RuntimeError):
    """A device's policy refuses a job or a protocol step; the client halves catch it, so the
    refusing client falls silent, and it never leaves the device.

    Parameters
    ----------
    message : str
        "<rule>: <why>", the rule being a ``DevicePolicy`` field or "one_answer".

    Examples
    --------
    >>> from fedcf.federated import DevicePolicy, DeviceRefusal
    >>> try:
    ...     DevicePolicy().check_survivors(7, 3)
    ... except DeviceRefusal as e:
    ...     str(e).split(":")[0]
    'min_cohort'
    """


def refuse(rule: str, why: str):
    """Log the refusal on the device and raise it."""
    log.warning("device refused (%s): %s", rule, why)
    raise DeviceRefusal(f"{rule}: {why}")


def _count(name, v, low):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise ValueError(f"DevicePolicy {name} must be an integer >= {low}, got {v!r}")


def _positive(name, v, optional=True):
    if v is None and optional:
        return
    if isinstance(v, bool) or not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
        raise ValueError(f"DevicePolicy {name} must be a finite number > 0"
                         f"{' or None' if optional else ''}, got {v!r}")


@dataclass(frozen=True)
class DevicePolicy:
    """What a device accepts from any server (see the module docstring).

    Parameters
    ----------
    min_cohort : int, default 10
        Fewest clients that advertised keys (and that survive to the unmasking) in a round it
        takes part in.
    min_holders : int, default 3
        Fewest holders of its secret shares (itself included).
    threshold : float in [0.5, 1), default 2/3
        The least t it accepts is ⌈threshold·h⌉ of its h share holders (and always > h/2).
    noise_multiplier : float > 0 or None, default None
        Under DP, the least σ: its noise share must be at least σ·C/√t (C the job's clip),
        so that any t survivors carry noise σ·C; None: no DP rule (a job without DP is
        accepted).
    max_clip : float > 0 or None, default None
        Under DP, the largest clip norm C it accepts.
    max_participations : int >= 1 or None, default None
        Rounds of one run a client of this device takes part in; past it the client sits out.

    Examples
    --------
    >>> from fedcf.federated import DevicePolicy
    >>> DevicePolicy().least_threshold(12)
    8
    >>> DevicePolicy.from_config({"min-cohort": 20, "noise-multiplier": 1.0}).min_cohort
    20
    """

    min_cohort: int = 10
    min_holders: int = 3
    threshold: float = 2 / 3
    noise_multiplier: float | None = None
    max_clip: float | None = None
    max_participations: int | None = None

    CONFIG = {"min-cohort": "min_cohort", "min-holders": "min_holders",
              "threshold": "threshold", "noise-multiplier": "noise_multiplier",
              "max-clip": "max_clip", "max-participations": "max_participations"}

    def __post_init__(self):
        _count("min_cohort", self.min_cohort, 2)
        _count("min_holders", self.min_holders, 2)
        t = self.threshold
        if isinstance(t, bool) or not (isinstance(t, numbers.Real) and 0.5 <= t < 1):
            raise ValueError(f"DevicePolicy threshold must be a share in [0.5, 1), got {t!r}")
        _positive("noise_multiplier", self.noise_multiplier)
        _positive("max_clip", self.max_clip)
        if self.max_participations is not None:
            _count("max_participations", self.max_participations, 1)

    @classmethod
    def from_config(cls, config) -> DevicePolicy:
        """The policy in a Flower node config (keys ``min-cohort``, ``min-holders``,
        ``threshold``, ``noise-multiplier``, ``max-clip``, ``max-participations``); keys not
        given keep their defaults."""
        kw = {}
        for key, name in cls.CONFIG.items():
            if key in config:
                v = config[key]
                kw[name] = int(v) if name in ("min_cohort", "min_holders",
                                              "max_participations") and \
                    isinstance(v, float) and v == int(v) else v
        try:
            return cls(**kw)
        except ValueError as e:
            raise ValueError(f"the node config's device policy: {e}") from None

    def least_threshold(self, holders: int) -> int:
        """The smallest t accepted with ``holders`` share holders."""
        return max(math.ceil(self.threshold * holders - 1e-9), holders // 2 + 1)

    def check_sharing(self, client: int, advertised: int, holders: int, t: int) -> None:
        """Before a client shares its secrets: the cohort, its holders and t."""
        if advertised < self.min_cohort:
            refuse("min_cohort", f"client {client}: {advertised} clients advertised keys; this "
                                 f"device takes part in cohorts of {self.min_cohort} or more")
        if holders < self.min_holders:
            refuse("min_holders", f"client {client}: {holders} holders of its shares; this "
                                  f"device needs {self.min_holders} or more")
        if t < self.least_threshold(holders):
            refuse("threshold", f"client {client}: t={t} of {holders} share holders; this "
                                f"device needs t >= {self.least_threshold(holders)}")

    def check_survivors(self, client: int, survivors: int) -> None:
        """Before a client helps unmask: the sum must hold at least ``min_cohort`` inputs."""
        if survivors < self.min_cohort:
            refuse("min_cohort", f"client {client}: the survivor list has {survivors} clients; "
                                 f"this device unmasks sums of {self.min_cohort} or more")

    def check_noise(self, enc, t: int) -> None:
        """Under a DP policy, the job's encoding: a clip no larger than ``max_clip``, noise
        shares from the OS of at least σ·C/√t, and (adaptive clipping) a count noised too."""
        if self.noise_multiplier is None:
            return
        clip = enc.clip
        if clip is None or not clip > 0:
            refuse("noise_multiplier", "the job has no clip norm: this device takes part only "
                                       "in DP rounds")
        if self.max_clip is not None and clip > self.max_clip:
            refuse("max_clip", f"the job's clip {clip:g} is above this device's {self.max_clip:g}")
        need = self.noise_multiplier * clip / math.sqrt(max(t, 1))
        if not enc.secret_noise:
            refuse("noise_multiplier", "the job asks for seeded noise; this device draws its "
                                       "share from its own secure randomness")
        if enc.noise_std < need * (1 - 1e-9):
            refuse("noise_multiplier", f"the job's noise share {enc.noise_std:.4g} is below "
                                       f"σ·C/√t = {need:.4g} (σ {self.noise_multiplier:g}, C "
                                       f"{clip:g}, t {t})")
        if enc.adaptive:  # the update and the centred count are one mechanism
            rt = math.sqrt(max(t, 1))
            s_u, s_b = enc.noise_std * rt / clip, enc.count_noise_std * rt
            z = 0.0 if s_b <= 0 else (s_u ** -2 + (2 * s_b) ** -2) ** -0.5
            if z < self.noise_multiplier * (1 - 1e-9):
                refuse("noise_multiplier", f"the job's update and clip-count noise shares "
                                           f"give σ {z:.4g} together, below "
                                           f"{self.noise_multiplier:g}")


def model_digest(*arrays) -> bytes:
    """SHA-256 of the arrays a job computes on (the model, the tangents)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.digest()


@dataclass
class Device:
    """A device — the clients a Flower node, a Ray shard or a simulation runs — with its
    ``policy`` and its ledger: for each client, the (kind, round) and (kind, model digest)
    pairs it answered and its participations in this run. It begins a server's ``SecureJob``
    only for the clients the policy admits.

    Parameters
    ----------
    policy : DevicePolicy, default DevicePolicy()
    answered : dict, default {}
        Client id -> the set of (kind, "round", round) and (kind, "model", digest) it answered.
    participations : dict, default {}
        Client id -> rounds of this run it took part in.

    Examples
    --------
    >>> import numpy as np
    >>> from fedcf.federated import Device, DevicePolicy
    >>> d = Device(DevicePolicy(max_participations=1))
    >>> d.admit("update", 0, b"model-0", np.array([3, 4])).tolist()
    [True, True]
    >>> d.admit("update", 1, b"model-1", np.array([3, 5])).tolist()
    [False, True]
    >>> d.admit("update", 2, b"model-1", np.array([5, 6])).tolist()  # 5 saw this model
    [False, True]
    """

    policy: DevicePolicy = field(default_factory=DevicePolicy)
    answered: dict = field(default_factory=dict)  # client -> {(kind, "round"|"model", key)}
    participations: dict = field(default_factory=dict)  # client -> rounds taken part in

    def admit(self, kind: str, round_idx: int, digest: bytes, clients) -> np.ndarray:
        """Which of ``clients`` take part in this job. A client sits out (logged here) when
        it answered this round or this model before (a repeated round would let the server
        subtract cohorts: S and S − {v} on one model) or is past its participation budget."""
        keys = ((kind, "round", int(round_idx)), (kind, "model", bytes(digest)))
        cap = self.policy.max_participations
        keep = np.ones(len(clients), bool)
        for k, c in enumerate(np.asarray(clients, np.int64).tolist()):
            seen, n = self.answered.setdefault(c, set()), self.participations.get(c, 0)
            why = "one_answer" if seen & set(keys) else \
                "max_participations" if cap is not None and n >= cap else None
            if why is not None:
                keep[k] = False
                (log.warning if why == "one_answer" else log.info)(  # a spent budget is normal
                    "device refused (%s): client %d sits out %s round %d", why, c, kind,
                    int(round_idx))
                continue
            seen.update(keys)
            self.participations[c] = n + 1
        return keep

    def admit_eval(self, digest: bytes, clients) -> np.ndarray:
        """Which of ``clients`` report evaluation sums (ReconEval) on the model of ``digest``:
        each at most once per model (a second ask, of S and then S − {v}, would let the server
        subtract one user's sums), and only when at least ``min_cohort`` of them do — a
        device's sum over fewer is refused whole (DeviceRefusal). Evaluation does not count
        against the participation budget."""
        key = ("recon-eval", "model", bytes(digest))
        clients = np.asarray(clients, np.int64)
        keep = np.array([key not in self.answered.get(c, ()) for c in clients.tolist()], bool)
        if int(keep.sum()) < self.policy.min_cohort:
            log.warning("device refused (min_cohort): evaluation sums over %d user(s) not "
                        "asked before on this model, fewer than min_cohort=%d",
                        int(keep.sum()), self.policy.min_cohort)
            raise DeviceRefusal(f"evaluation sums over {int(keep.sum())} user(s) not asked "
                                "before on this model, fewer than the device's min_cohort="
                                f"{self.policy.min_cohort}")
        for c in clients[keep].tolist():
            self.answered.setdefault(c, set()).add(key)
        return keep

    def begin(self, job, kind: str, round_idx: int, digest: bytes, clients, rows):
        """The protocol halves of the admitted ``clients`` with their encoded ``rows``, after
        the policy checked the job's noise (a ``SecureJob``: the server's recipe). A refused
        job gives halves of no client: the device stays silent (the refusal is logged here)."""
        clients = np.asarray(clients, np.int64)
        try:
            self.policy.check_noise(job.enc, job.t)
            keep = self.admit(kind, round_idx, digest, clients)
        except DeviceRefusal:
            keep = np.zeros(len(clients), bool)
        return job.begin(clients[keep], rows[keep], self.policy)

    def begin_updates(self, job, out, hp, params: dict, ids):
        """The protocol halves of the clients of ``out`` (their encoded uploads inside)."""
        return self.begin(job, "update", ids[1], model_digest(*params.values()),
                          out.client_ids(), job.enc.encode(out, hp)[0])

    def begin_reports(self, job, reports, params: dict, tangents, ids):
        """As ``begin_updates`` for hypergradient reports."""
        return self.begin(job, "reports", ids[1], model_digest(*params.values(), *tangents),
                          reports.clients, job.enc.encode(reports))
