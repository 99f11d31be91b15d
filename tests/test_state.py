"""The global model as named arrays (fedcf.federated.round.state): each estimator declares its
arrays, and the round's table is packed and unpacked from the declaration alone."""

import numpy as np
import pytest

from fedcf import registry
from fedcf.datasets import make_synthetic_ratings
from fedcf.federated import FedNCF, FedReconMF, OpenCatalog
from fedcf.federated.algorithms.base import FederatedMFBase
from fedcf.federated.round.state import INLINE, ModelState, Part, dense_part


def _state():
    return ModelState((Part("item_factors_", 4, bias="item_biases_"),
                       Part("adapter_factors_", 2),
                       Part("default_params_", 1, bias=INLINE),
                       dense_part("dense_params_", 7, 3)), 3)


def test_pack_and_unpack_are_inverse_and_lay_out_each_part_in_its_rows():
    rng = np.random.default_rng(0)
    arrays = {"item_factors_": rng.normal(size=(4, 3)), "item_biases_": rng.normal(size=4),
              "adapter_factors_": rng.normal(size=(2, 3)), "default_params_": rng.normal(size=4),
              "dense_params_": rng.normal(size=7)}
    s = _state()
    assert s.shape == (10, 3) and s.dense_rows == 3
    assert s.names == ("item_factors_", "item_biases_", "adapter_factors_", "default_params_",
                       "dense_params_")
    t = s.pack(arrays, np.float64)
    np.testing.assert_array_equal(t["Q"][:4], arrays["item_factors_"])
    np.testing.assert_array_equal(t["b"][:4], arrays["item_biases_"])
    np.testing.assert_array_equal(t["b"][4:6], 0.0)  # no bias array: the column stays zero
    np.testing.assert_array_equal(np.r_[t["Q"][6], t["b"][6]], arrays["default_params_"])
    np.testing.assert_array_equal(t["Q"][7:].ravel()[:7], arrays["dense_params_"])
    np.testing.assert_array_equal(t["Q"][7:].ravel()[7:], 0.0)  # zero padded
    np.testing.assert_array_equal(t["b"][7:], 0.0)
    back = s.unpack(t)
    assert set(back) == set(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v, err_msg=k)
    assert np.shares_memory(back["item_factors_"], t["Q"])  # row parts are views
    assert not np.shares_memory(back["dense_params_"], t["Q"])  # dense parts are copies


def test_a_table_of_another_shape_and_a_bad_part_are_refused():
    s = _state()
    with pytest.raises(ValueError, match=r"shape \(9, 3\), not the declared state's \(10, 3\)"):
        s.unpack({"Q": np.zeros((9, 3)), "b": np.zeros(9)})
    with pytest.raises(ValueError, match="role must be one of"):
        Part("x", 1, "sparse")
    with pytest.raises(ValueError, match="a dense part has no bias column"):
        Part("x", 1, "dense", bias="b_")
    assert s.describe()[0] == "item_factors_: 4 rows, rows, bias in item_biases_"


@pytest.mark.parametrize("name", [n for n in registry.names("estimator")
                                  if issubclass(registry.lookup("estimator", n),
                                                FederatedMFBase)])
def test_every_federated_estimators_fitted_arrays_are_its_declared_state(name, monkeypatch):
    """A fit leaves exactly the declared arrays, and packing them gives the round's table
    back: no estimator lays out the table by hand."""
    cls = registry.lookup("estimator", name)
    extra = {"layers": (4,)} if cls is FedNCF else {}
    data = make_synthetic_ratings(40, 15, 400, random_state=0)
    seen = []
    real = cls._set_globals

    def spy(self, params):
        seen.append({k: v.copy() for k, v in params.items()})
        return real(self, params)

    monkeypatch.setattr(cls, "_set_globals", spy)
    m = cls(n_factors=3, n_rounds=2, clients_per_round=10, random_state=0, **extra).fit(data)
    state, table = m._model_state(len(m.item_ids_)), m._global_params()
    assert table["Q"].shape == state.shape
    for k in ("Q", "b"):  # the declared arrays hold the whole final table, padding included
        np.testing.assert_array_equal(table[k], seen[-1][k], err_msg=k)


def test_an_open_catalog_declares_its_adapter_and_default_rows():
    data = make_synthetic_ratings(40, 15, 400, random_state=0)
    space = OpenCatalog(0.6, unknown_item_row=True, learned_default=True)
    m = FedReconMF(n_factors=3, n_rounds=2, clients_per_round=10, item_space=space,
                   random_state=0).fit(data)
    state = m._model_state(len(m.item_ids_))
    assert [p.name for p in state.parts] == ["item_factors_", "adapter_factors_",
                                             "default_params_"]
    assert state.shape == (len(m.item_ids_) + 1 + 1, 3)
    G, gb = m._rows().join(m)
    back = state.unpack({"Q": G, "b": gb})
    for n in state.names:
        np.testing.assert_array_equal(back[n], m._fitted(n), err_msg=n)
