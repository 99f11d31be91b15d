"""The compact upload under secure aggregation: each dense value travels in the fewest whole
bytes that hold the cohort's sum at ``precision`` bits below ``value_bound``
(``Encoding.word_bytes``), and what PRIVACY.md says of it: the width is a public function of the
recipe, and the bytes a server receives from a client are uniform whatever its input."""

import numpy as np
import pytest
from scipy import stats

from fedcf.federated import SecureAggregation
from fedcf.federated.aggregators.secagg_client import Encoding, simulate
from fedcf.federated.aggregators.secagg_masks import pack_words, unpack_words
from fedcf.federated.round.contracts import RunContext
from fedcf.federated.round.reports import signed_sum


def _twin_pack(y, word_bytes) -> bytes:
    """Obviously correct: each word's low bytes, little-endian, one after the other."""
    return b"".join(int(v).to_bytes(4, "little")[:b] for v, b in zip(y, word_bytes))


def test_packing_matches_its_twin_and_round_trips():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 300):
        y = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
        wb = rng.integers(1, 5, n)
        packed = pack_words(y, wb)
        assert packed.dtype == np.uint8 and packed.tobytes() == _twin_pack(y, wb)
        back = unpack_words(packed, wb)
        assert back.dtype == np.uint32
        np.testing.assert_array_equal(back, y & ((np.uint64(1) << (8 * wb).astype(np.uint64))
                                                 - np.uint64(1)).astype(np.uint32))
    with pytest.raises(ValueError, match="must have 6 bytes, got 5"):
        unpack_words(np.zeros(5, np.uint8), [3, 3])


@pytest.mark.parametrize("m", [2, 12, 100, 1000, 20000])
@pytest.mark.parametrize("precision", [4, 8, 12, 16, 20, 24])
def test_the_width_holds_the_cohorts_extreme_sums_at_the_promised_step(m, precision):
    """Every client at +value_bound (or −value_bound) sums exactly; the step is at most
    value_bound·2^−precision whenever fewer than 4 bytes suffice; one byte fewer would not
    hold the sum (the width is the fewest whole bytes)."""
    bound = 0.75
    enc = Encoding(6, 2, m, bound, 1000.0, precision=precision)
    wb, scale = enc.word_bytes()[0], enc.scales()[0]
    for sign in (1, -1):
        word = np.uint32(np.int64(round(sign * bound * scale)) % 2**32)
        total = np.array([(int(word) * m) % 2**32], np.uint32)
        assert signed_sum(total, [wb])[0] / scale == pytest.approx(sign * m * bound)
    # power-of-two steps no larger than value_bound·2^-precision in the largest sum
    needed = m * bound * 2.0 ** np.ceil(precision - np.log2(bound))
    if wb < 4:
        assert 1.0 / scale <= bound * 2.0 ** -precision
        assert needed > 2.0 ** (8 * (wb - 1) - 1) - 1  # a byte fewer does not hold it
    else:
        assert needed > 2.0 ** 23 - 1
    assert list(enc.word_bytes()[enc.n_values:]) == [4] * (len(enc.stats) + 1)


def test_a_cohort_of_100_sends_three_bytes_a_value_at_the_default_and_four_without():
    assert list(Encoding(5, 3, 100, 1.0, 1000.0, precision=16)._block_bytes()) == [3]
    assert list(Encoding(5, 3, 1000, 1.0, 1000.0, precision=16)._block_bytes()) == [4]
    assert list(Encoding(5, 3, 100, 1.0, 1000.0)._block_bytes()) == [4]  # precision None
    for sigma, nbytes in ((0.05, 3), (3.0, 4)):  # the noise shares' 8σ√m of headroom
        noisy = Encoding(5, 3, 100, 1.0, 1000.0, noise_std=sigma, precision=16)
        assert noisy._block_bytes() == [nbytes]
        assert noisy.scales()[0] * (100 + 8 * sigma * 10) <= 2 ** (8 * nbytes - 1) - 1


def _bound(**kw):
    return SecureAggregation(**kw).bind(RunContext(n_eligible=1000, clients_per_round=12,
                                                   n_rounds=3, n_items=30, n_factors=3,
                                                   seed=1))


def test_a_round_at_16_bits_rounds_within_its_bound_and_sends_less():
    from test_secagg import HP, cohort

    out = cohort()
    fine, compact = _bound(max_weight=8.0), _bound(max_weight=8.0, precision=16)
    fine(out, HP, 0)
    compact(out, HP, 0)
    enc = compact.encoding(12)
    step = 1.0 / enc.scales()[0]
    used = fine._last_stats["used"]  # the summed weight the mean divides by
    assert fine.round_stats["secagg_error"] < 1e-7
    assert 1e-7 < compact.round_stats["secagg_error"] <= 12 * step / 2 / used
    saved = fine.round_stats["secagg_bytes_per_client"] - \
        compact.round_stats["secagg_bytes_per_client"]
    assert saved == enc.n_values  # one byte a value, nothing else changed


def test_the_bytes_a_server_receives_are_uniform_whatever_the_input():
    """PRIVACY.md: a client's packed masked vector is uniform on its bytes given the sum. Two
    cohorts, one sending zeros and one sending the largest words the width holds: a server
    sees bytes it cannot tell apart from uniform in either, and its packed vectors are
    exactly Σ word_bytes long (no high byte of the input travels). The unpacked vectors
    still sum to the inputs modulo 2^(8b)."""
    m, d = 6, 4000
    wb = np.full(d, 3)
    top = (1 << 23) - 1
    for x in (np.zeros((m, d), np.uint32), np.full((m, d), top, np.uint32)):
        total, u3, server = simulate(x, range(m), 4)
        ys = {msg.client: msg.y for msg in server.transcript if type(msg).__name__ ==
              "MaskedInput"}
        packed = [pack_words(ys[c], wb) for c in range(m)]
        assert all(p.size == wb.sum() for p in packed)
        counts = np.bincount(np.concatenate(packed), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-4
        removed = total - sum(ys.values())  # the masks the server half took off (mod 2³²)
        received = sum(unpack_words(p, wb) for p in packed)  # from the packed bytes alone
        np.testing.assert_array_equal(signed_sum(received + removed, wb),
                                      signed_sum(x.sum(axis=0, dtype=np.uint32), wb))


@pytest.mark.parametrize("bad", [0, 31, -3, "16", 16.0, True, np.nan])
def test_a_precision_that_is_not_bits_is_named(bad):
    with pytest.raises(ValueError, match="precision must be None .* or a number of bits"):
        SecureAggregation(precision=bad)


def test_precision_is_a_parameter_the_estimator_clones_and_sets():
    from sklearn.base import clone

    from fedcf import FedReconMF

    est = FedReconMF(aggregator=SecureAggregation(precision=12))
    assert clone(est).get_params()["aggregator__precision"] == 12
    assert est.set_params(aggregator__precision=None).aggregator.precision is None


def test_a_numpy_integer_precision_travels_to_a_node_as_json():
    from fedcf.flower.secure import encoding_json, read_encoding

    enc = _bound(precision=np.int64(12)).encoding(12)
    assert read_encoding(encoding_json(enc), 30, 3).precision == 12
