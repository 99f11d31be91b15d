"""Prediction for (user, item) pairs."""

from __future__ import annotations

from numba import njit, prange


@njit(cache=True, parallel=True)
def predict_pairs(users, items, user_params, item_params, mu, out):
    """out[t] = μ + c_u + b_i + p_u·q_i for u = users[t], i = items[t].

    user_params : (P (n_users, K), c (n_users,));  item_params : (Q (n_items, K), b (n_items,)).
    A negative user (item) id means unknown: its terms are left out, so an unknown item scores
    μ + c_u, an unknown user μ + b_i, both unknown μ. ``out`` float64 (n,) is overwritten.
    """
    P, c = user_params[0], user_params[1]  # by index: see fedrecon_clients
    Q, b = item_params[0], item_params[1]
    K = Q.shape[1]
    for t in prange(users.shape[0]):
        u = users[t]
        i = items[t]
        s = mu
        if u >= 0:
            s += c[u]
        if i >= 0:
            s += b[i]
        if u >= 0 and i >= 0:
            for a in range(K):
                s += P[u, a] * Q[i, a]
        out[t] = s
