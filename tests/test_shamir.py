"""Shamir secret sharing of the secure-aggregation seeds (fedcf.federated.aggregators.shamir):
any t shares rebuild a secret, fewer say nothing of it, secrets come from the OS's randomness,
and bad shares are refused by name."""

import os

import numpy as np
import pytest

from fedcf.federated.aggregators import shamir


def _secret(rng):
    return rng.bytes(shamir.SECRET_BYTES)


@pytest.mark.parametrize("t,n", [(1, 1), (2, 3), (3, 5), (67, 100), (5, 1000)])
def test_any_t_shares_rebuild_each_secret(t, n):
    rng = np.random.RandomState(t * 1000 + n)
    secrets = [_secret(rng), _secret(rng), b"\xff" * 16, b"\0" * 16]
    shares = shamir.split(secrets, t, n)
    assert len(shares) == n and all(len(row) == 4 for row in shares)
    for _ in range(5):
        pick = rng.choice(n, t, replace=False)
        for j, s in enumerate(secrets):
            assert shamir.combine([(k + 1, shares[k][j]) for k in pick]) == s
    more = rng.choice(n, min(n, t + 2), replace=False)  # more than t give it too
    assert shamir.combine([(k + 1, shares[k][0]) for k in more]) == secrets[0]


def test_fewer_than_t_shares_are_independent_of_the_secret():
    # t = 2: holder 1's share of any secret is uniform on the field, whatever the secret
    a, b = b"\0" * 16, b"\xff" * 16
    first = {s: np.array([np.frombuffer(shamir.split([s], 2, 2)[0][0], "<u4")
                          for _ in range(3000)], np.int64) for s in (a, b)}
    for s, v in first.items():
        assert np.all(v < shamir.P)
        # uniform on [0, p): mean p/2 within 5 standard errors, in every chunk
        se = shamir.P / np.sqrt(12 * len(v))
        assert np.all(np.abs(v.mean(axis=0) - shamir.P / 2) < 5 * se), s
    # and one share never rebuilds a secret of threshold 2
    shares = shamir.split([a], 2, 3)
    with pytest.raises(ValueError, match="do not interpolate"):
        shamir.combine([(1, shares[0][0])])


def test_splits_are_fresh_and_drawn_from_the_os(monkeypatch):
    s = b"0123456789abcdef"
    assert shamir.split([s], 3, 4) != shamir.split([s], 3, 4)  # fresh coefficients each time
    calls = []
    real = os.urandom
    monkeypatch.setattr(shamir.os, "urandom", lambda n: calls.append(n) or real(n))
    shamir.split([s], 3, 4)
    assert calls  # the coefficients come from the OS's randomness
    v = shamir.field_elements((10_000,))
    assert v.min() >= 0 and v.max() < shamir.P and len(np.unique(v)) > 9_990


def test_bad_inputs_are_refused_by_name():
    s = b"0123456789abcdef"
    with pytest.raises(ValueError, match="16 bytes"):
        shamir.split([b"short"], 2, 3)
    with pytest.raises(ValueError, match="t <= n"):
        shamir.split([s], 4, 3)
    with pytest.raises(TypeError, match="whole numbers"):
        shamir.split([s], 2.5, 3)
    with pytest.raises(ValueError, match="t <= n"):
        shamir.split([s], 2, 70_000)
    sh = shamir.split([s], 2, 3)
    with pytest.raises(ValueError, match="distinct"):
        shamir.combine([(1, sh[0][0]), (1, sh[0][0])])
    with pytest.raises(ValueError, match="distinct"):
        shamir.combine([(0, sh[0][0]), (1, sh[0][0])])
    with pytest.raises(ValueError, match="bytes"):
        shamir.combine([(1, sh[0][0][:-1]), (2, sh[1][0])])
    with pytest.raises(ValueError, match="outside the field"):
        shamir.combine([(1, b"\xff" * shamir.SHARE_BYTES), (2, sh[1][0])])
    bad = bytearray(sh[1][0])
    bad[-1] ^= 0x10  # 2²⁸ off in the last chunk, which holds 8 bits: no 16-byte secret
    with pytest.raises(ValueError, match="do not interpolate"):
        shamir.combine([(1, sh[0][0]), (2, bytes(bad))])


def _lagrange_twin(xs):
    """λ_j = Π_{m≠j} x_m / (x_m − x_j) mod p, one Python integer at a time."""
    out = []
    for j, xj in enumerate(xs):
        num = den = 1
        for m, xm in enumerate(xs):
            if m != j:
                num, den = num * xm % shamir.P, den * (xm - xj) % shamir.P
        out.append(num * pow(den, shamir.P - 2, shamir.P) % shamir.P)
    return out


@pytest.mark.parametrize("t", [1, 2, 7, 65])
def test_batched_lagrange_weights_match_the_scalar_formula(t):
    rng = np.random.default_rng(t)
    xs = np.array([rng.choice(np.arange(1, shamir.MAX_HOLDERS + 1), t, replace=False)
                   for _ in range(4)])
    got = shamir.lagrange_at_zero(xs)
    assert got.tolist() == [_lagrange_twin([int(x) for x in row]) for row in xs]


def test_secrets_rebuilt_together_equal_those_rebuilt_one_by_one():
    """The server rebuilds every seed of a round in one call, holder sets and thresholds
    differing or repeated; a bad group is named by its position."""
    rng = np.random.default_rng(3)
    groups, secrets = [], []
    for t, n in [(3, 5), (3, 9), (2, 2), (5, 8), (3, 4)]:
        s = _secret(rng)
        sh = shamir.split([s], t, n)
        pick = rng.choice(n, t, replace=False)
        groups.append([(int(k) + 1, sh[k][0]) for k in pick])
        secrets.append(s)
    assert shamir.combine_many(groups) == secrets == [shamir.combine(g) for g in groups]
    assert shamir.combine_many(groups + groups[:2]) == secrets + secrets[:2]  # sets repeated
    broken = [list(g) for g in groups]
    broken[3][0] = (broken[3][0][0], b"\xff" * shamir.SHARE_BYTES)
    with pytest.raises(shamir.ShareError, match="outside the field") as e:
        shamir.combine_many(broken)
    assert e.value.group == 3
    assert shamir.combine_many([]) == []
