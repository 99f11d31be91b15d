"""What a server learns under secure aggregation, measured by attacking the protocol's
transcript (``secagg_protocol``) with real uploads: each client's rated set guessed from what
the server holds, scored against chance.

Attacks on one round of m clients (``transcript_attacks``):
(a) honest-but-curious: the masked vectors, public keys and encrypted shares it relayed;
(b) a server that knows ``random_state``: it replays the round with the same seed and zero
    inputs and subtracts the masks it regenerates (were the secrets seeded, this is the upload);
(c) a server that lies that client v dropped: from the survivors' answers it rebuilds v's mask
    key and strips v's pairwise masks from v's vector;
(d) a client whose vector arrives after the server declared it dropped: the same strip.
And what the *sum* reveals by cohort size (``sum_leakage``): the rows it touches are the union
of the members' rows, which narrows down each member's rated set the smaller the cohort.

The guess from a vector: the rows (item blocks) that deviate most from zero, as many as the
client rated — on a plain upload exactly its touched rows.
"""

from __future__ import annotations

import os

import numpy as np

from . import shamir
from .secagg_client import simulate
from .secagg_protocol import (
    Identities,
    MaskedInput,
    SecAggClient,
    SecAggServer,
    _x25519_from_seed,
    pair_key,
    prg,
    self_mask_key,
)


def guess_rows(view: np.ndarray, n_items: int, K: int, k: int) -> np.ndarray:
    """The k item rows of a uint32 vector that deviate most from zero (as signed values)."""
    signed = view[:n_items * (K + 1)].astype(np.int64)
    signed[signed >= 2**31] -= 2**32
    score = np.abs(signed).reshape(n_items, K + 1).sum(axis=1)
    return np.argsort(-score, kind="stable")[:k]


def recall(guess, rated: set) -> float:
    return len(set(np.asarray(guess).tolist()) & rated) / len(rated)


def chance(rated: list[set], n_items: int) -> tuple[float, float]:
    """(mean recall of a uniform guess of |rated| rows, half-width of its 95 % interval for
    the mean over the clients) — the hypergeometric draw, exactly."""
    r = np.array([len(s) for s in rated], np.float64)
    N = float(n_items)
    var = r * (r / N) * ((N - r) / N) * ((N - r) / max(N - 1, 1)) / r**2
    return float(np.mean(r / N)), float(1.96 * np.sqrt(var.sum()) / len(r))


def _run_to_unmask(q: np.ndarray, t: int, lie_dropped: int | None, late: int | None):
    """Play a round with real client halves; the server lies that ``lie_dropped`` dropped, or
    client ``late`` sends after the survivor list is fixed. Returns (server, answers, y_v)."""
    m = q.shape[0]
    session = os.urandom(16)
    ids = Identities(range(m))
    halves = [SecAggClient(c, t, session, ids.signing_key(c), ids.verifying) for c in range(m)]
    server = SecAggServer(t, q.shape[1], session)
    adverts = server.collect_adverts([h.advertise() for h in halves])
    inbox = server.route_shares([h.share_keys(adverts) for h in halves])
    inputs = [h.masked_input(q[h.id], inbox[h.id]) for h in halves]
    v = lie_dropped if lie_dropped is not None else late
    on_time = [i for i in inputs if i.client != late]
    server.collect_inputs(on_time)
    u3 = [c for c in server.u3 if c != v]  # the lie (c), or the late client missing (d)
    server.u3 = u3
    sigs = [halves[c].consistency(u3) for c in u3]
    answers = [halves[c].unmask(u3, sigs) for c in u3]
    return server, answers, inputs[v].y


def strip_masks(server: SecAggServer, answers, v: int, y_v: np.ndarray) -> np.ndarray:
    """y_v without every mask the answers let the server rebuild: the pairwise masks from the
    s-shares revealed for v, and the self-mask too if t answers also held a b-share of v (the
    protocol forbids it; a client that gave both would be read in the clear)."""
    t, out = server.threshold, y_v.copy()
    s_shares = [a.s_shares[v] for a in answers if v in a.s_shares]
    b_shares = [a.b_shares[v] for a in answers if v in a.b_shares]
    if len(s_shares) >= t:
        key = _x25519_from_seed(shamir.combine(s_shares[:t]), server.session)
        for u in server.u3:
            mask = prg(pair_key(key, server.adverts[u].s_pk, v, u, server.session), len(out))
            out = out - mask if v < u else out + mask
    if len(b_shares) >= t:
        out = out - prg(self_mask_key(shamir.combine(b_shares[:t]), server.session), len(out))
    return out


def transcript_attacks(q: np.ndarray, rated: list[set], n_items: int, K: int, t: int,
                       victims: int) -> dict:
    """Rated-set recall of attacks (a)–(d) on quantized uploads ``q`` (one row per client),
    for the first ``victims`` clients, with the chance level and its interval."""
    m = q.shape[0]
    _, _, server = simulate(q, range(m), t)
    ys = {msg.client: msg.y for msg in server.transcript if isinstance(msg, MaskedInput)}
    _, _, replay = simulate(np.zeros_like(q), range(m), t)  # same seed, zero inputs
    masks = {msg.client: msg.y for msg in replay.transcript if isinstance(msg, MaskedInput)}
    out = {name: [] for name in ("plain", "a", "b", "c", "d")}
    for v in range(victims):
        k = len(rated[v])
        out["plain"].append(recall(guess_rows(q[v], n_items, K, k), rated[v]))
        out["a"].append(recall(guess_rows(ys[v], n_items, K, k), rated[v]))
        out["b"].append(recall(guess_rows(ys[v] - masks[v], n_items, K, k), rated[v]))
        for name, kw in (("c", {"lie_dropped": v, "late": None}),
                         ("d", {"lie_dropped": None, "late": v})):
            server_v, answers, y_v = _run_to_unmask(q, t, **kw)
            view = strip_masks(server_v, answers, v, y_v)
            out[name].append(recall(guess_rows(view, n_items, K, k), rated[v]))
    level, half = chance(rated[:victims], n_items)
    return {name: float(np.mean(r)) for name, r in out.items()} | {
        "chance": level, "chance_halfwidth": half}


def sum_leakage(touched: list[set], rated: list[set], n_items: int, m: int, trials: int,
                rng: np.random.Generator) -> dict:
    """What the rows of a cohort's sum (the union of its members' touched rows) reveal of a
    member's rated set: precision of guessing "the union", against chance |rated|/n_items."""
    lift, prec, rec = [], [], []
    for _ in range(trials):
        members = rng.choice(len(touched), min(m, len(touched)), replace=False)
        union = set().union(*(touched[u] for u in members))
        if not union:
            continue
        for u in members[:20]:
            hit = len(union & rated[u])
            prec.append(hit / len(union))
            rec.append(hit / len(rated[u]))
            lift.append(prec[-1] / (len(rated[u]) / n_items))
    return {"cohort": int(min(m, len(touched))), "precision": float(np.mean(prec)),
            "recall": float(np.mean(rec)), "lift": float(np.mean(lift))}
