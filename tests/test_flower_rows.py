"""Stateful estimators over Flower messages: FURL's, FedMF's, PFedRec's and FedNCF's devices
keep their user rows in the run's node state (the server never receives one), FedAvg's rows
travel with each message and back; either way the fitted global model is the in-process one
bit for bit."""

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Message, RecordDict  # noqa: E402
from test_flower import BIG, DATA, FakeGrid, partitions  # noqa: E402

from fedcf import FURLMF, FedAvgMF, load_model  # noqa: E402
from fedcf.flower import Settings, fit_in_process, serve  # noqa: E402
from fedcf.flower.node import load_dataset  # noqa: E402
from fedcf.flower.rows import ROWS_STATE  # noqa: E402
from fedcf.flower.wire import UPLOAD_FIELDS, arrays, record_arrays  # noqa: E402

PARAMS = {"n_factors": 4, "n_rounds": 3, "clients_per_round": 30, "random_state": 0}


def _serve(tmp_path, model, grid, aggregator=None, eval_fraction=0.2):
    params = {**PARAMS, "aggregator": aggregator}
    settings = Settings(params=dict(params), model=model, eval_fraction=eval_fraction,
                        model_path=str(tmp_path / "m.npz")).check()
    res = serve(grid, settings)
    ref, evaluation, _ = fit_in_process(params, DATA, eval_fraction, model=model)
    return res, load_model(res["model_path"]), ref, evaluation


def _kept(grid) -> dict:
    """raw user id -> (p, c) as the fake grid's devices keep them."""
    out = {}
    for state in grid.state.values():
        if ROWS_STATE in state:
            rec = record_arrays(state[ROWS_STATE])
            for u, p, c in zip(*(rec[k] for k in ("users", "P", "c"))):
                out[int(u)] = (p, c)
    return out


@pytest.mark.parametrize("aggregator", [None, {"name": "secure", "min_cohort": 2}])
def test_furl_over_messages_keeps_each_row_on_its_device(tmp_path, aggregator):
    """FURL: the global model, the losses and ReconEval are the in-process fit's; every trained
    user's row sits on its own node and equals the simulation's; no reply carries a row, and
    the saved model holds none."""
    grid = FakeGrid(partitions(3))
    res, model, ref, evaluation = _serve(tmp_path, "furl", grid, aggregator)
    assert isinstance(model, FURLMF) and res["refusals"] == []
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(model.item_biases_, ref.item_biases_)
    assert [h["loss"] for h in res["history"]] == [h["loss"] for h in ref.history_]
    assert res["recon_eval"]["rmse"] == pytest.approx(evaluation["rmse"], rel=1e-12)
    kept = _kept(grid)
    start, _, _ = fit_in_process({**PARAMS, "n_rounds": 0}, DATA, 0.2, model="furl")
    moved = (ref.user_factors_ != start.user_factors_).any(axis=1)
    assert moved.any() and set(ref.user_ids_[moved].tolist()) <= set(kept)
    for u, (p, c) in kept.items():
        k = int(np.searchsorted(ref.user_ids_, u))
        np.testing.assert_array_equal(p, ref.user_factors_[k])
        assert c == ref.user_biases_[k]
    for kind, direction, records in grid.log:
        if direction == "up":
            assert "rows" not in records, (kind, records)
    assert model._fitted("user_factors_") is None and len(model.user_ids_) == 0
    with np.load(res["model_path"]) as f:
        assert not {"user_factors_", "user_biases_", "seen_items"} & set(f.files)


@pytest.mark.parametrize("model, aggregator", [
    ("fedmf", None), ("pfedrec", {"name": "mean"}), ("fedncf", None),
    ("fedncf", {"name": "secure", "min_cohort": 2}),
])
def test_sampled_negative_models_over_messages_are_the_in_process_model(tmp_path, model,
                                                                        aggregator):
    """FedMF, PFedRec and FedNCF: each device draws its negatives from its own items (the
    node builds the client program on its own data; the server holds none) and keeps its user
    part; the global model — FedNCF's MLP too — is the in-process fit's bit for bit, plain,
    as node sums, or masked; no row leaves a device; the saved model serves new users."""
    grid = FakeGrid(partitions(3))
    res, fitted, ref, _ = _serve(tmp_path, model, grid, aggregator, eval_fraction=0.0)
    assert res["refusals"] == [] and type(fitted) is type(ref)
    np.testing.assert_array_equal(fitted.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(fitted.item_biases_, ref.item_biases_)
    if model == "fedncf":
        np.testing.assert_array_equal(fitted.dense_params_, ref.dense_params_)
    assert [h["loss"] for h in res["history"]] == [h["loss"] for h in ref.history_]
    kept = _kept(grid)
    assert kept
    for u, (p, c) in kept.items():
        k = int(np.searchsorted(ref.user_ids_, u))
        np.testing.assert_array_equal(p, ref.user_factors_[k])
        assert c == ref.user_biases_[k]
    assert all("rows" not in records for _, d, records in grid.log if d == "up")
    assert fitted._fitted("user_factors_") is None
    if model != "pfedrec":  # (PFedRec finetunes on fit data, which a loaded model lacks)
        top = fitted.recommend(fitted.item_ids_[:3], n=5)
        assert len(top) == 5 and not set(top["item"]) & set(fitted.item_ids_[:3])


def test_fedavg_over_messages_brings_each_row_back_to_the_server(tmp_path):
    """FedAvg: the rows are the server's, as the algorithm has it; each message carries its
    clients' rows and the reply the trained ones; the fit is the in-process one, rows too."""
    grid = FakeGrid(partitions(3))
    res, model, ref, evaluation = _serve(tmp_path, "fedavg", grid)
    assert isinstance(model, FedAvgMF) and res["refusals"] == []
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(model.user_factors_, ref.user_factors_)
    np.testing.assert_array_equal(model.user_biases_, ref.user_biases_)
    assert res["received"]["train"] == {"upload": sorted(UPLOAD_FIELDS), "rows": ["P", "c"]}
    assert _kept(grid) == {}  # the devices keep nothing


def test_a_fedavg_reply_with_bad_rows_is_refused_and_the_old_rows_stay(tmp_path):
    """A node that sends non-finite rows is refused: the model and every row are as if it had
    not answered at all (its clients keep their old rows on the server)."""
    def nan_rows(msg, reply):
        if msg.metadata.message_type != "train":
            return reply
        rows = record_arrays(reply.content["rows"])
        rows["P"] = np.full_like(rows["P"], np.nan)
        return Message(RecordDict({"upload": reply.content["upload"], "rows": arrays(**rows)}),
                       reply_to=msg)

    res, model, _, _ = _serve(tmp_path, "fedavg", FakeGrid(partitions(3),
                                                           tamper={BIG + 1: nan_rows}))
    refused = [r for r in res["refusals"] if r["stage"].startswith("round")]
    assert refused and all("rows P must be finite" in r["reason"] for r in refused)
    start, _, _ = fit_in_process({**PARAMS, "n_rounds": 0}, DATA, 0.2, model="fedavg")
    full = load_dataset(DATA).user_ids  # node k holds every 3rd user from position k
    on_node1 = np.isin(model.user_ids_, full[1::3])
    assert on_node1.any() and np.isfinite(model.user_factors_).all()
    np.testing.assert_array_equal(model.user_factors_[on_node1], start.user_factors_[on_node1])
    assert (model.user_factors_[~on_node1] != start.user_factors_[~on_node1]).any()


def _send(users, rows=None, params=None, state=None):
    """A FURL train message for the node's users at positions ``users`` with ``rows`` = (P, c)
    (None: no rows record), through the ClientApp of a fake node whose run state is ``state``."""
    from fedcf.flower.node import partition

    grid = FakeGrid(partitions(2))
    if state is not None:
        grid.state[BIG] = state
    own = partition(DATA, {"partition-id": 0, "num-partitions": 2})
    glob = arrays(Q=np.full((own.n_items, 4), 0.1, np.float32),
                  b=np.zeros(own.n_items, np.float32), ids=np.array([0, 1], np.uint64))
    cfg = ConfigRecord({"users": [int(u) for u in own.user_ids[users]],
                        "clients": [int(u) for u in users], "mu": 3.5,
                        "params": json.dumps({"model": "furl", **PARAMS, **(params or {})})})
    content = {"global": glob, "config": cfg}
    if rows is not None:
        content["rows"] = arrays(P=rows[0], c=rows[1])
    return grid.send_and_receive([Message(RecordDict(content), BIG, "train")])[0], grid


def _rows(m, value):
    return np.full((m, 4), value, np.float32), np.zeros(m, np.float32)


def test_a_device_trains_its_own_row_whatever_the_server_sends():
    """Once a device has trained a user, the rows a message carries do not reach that user:
    its upload is what it would be from the device's own row, and the device keeps training
    that row. The server cannot reset or plant a row."""
    users = np.array([0, 1, 2])
    first, grid = _send(users, _rows(3, 0.05))
    kept = record_arrays(grid.state[BIG][ROWS_STATE])
    assert not first.has_error() and not np.allclose(kept["P"], 0.05)
    planted, grid2 = _send(users, _rows(3, 7.0), state=grid.state[BIG])
    own_rows, _ = _send(users, (kept["P"], kept["c"]))
    np.testing.assert_array_equal(record_arrays(planted.content["upload"])["d_Q"],
                                  record_arrays(own_rows.content["upload"])["d_Q"])
    assert np.abs(record_arrays(grid2.state[BIG][ROWS_STATE])["P"]).max() < 1.0  # never 7
    # a user the device has not trained yet starts from the message's row
    new, grid3 = _send(np.array([0, 3]), _rows(2, 0.05), state=grid.state[BIG])
    assert set(record_arrays(grid3.state[BIG][ROWS_STATE])["users"]) >= set(kept["users"])
    assert len(record_arrays(grid3.state[BIG][ROWS_STATE])["users"]) == 4


@pytest.mark.parametrize("rows, reason", [
    (None, "carries no 'rows' record"),
    (_rows(2, 0.1), "rows must be finite float32 of shapes (3, 4) and (3,)"),
    ((np.full((3, 4), np.nan, np.float32), np.zeros(3, np.float32)), "must be finite"),
    ((np.zeros((3, 4)), np.zeros(3)), "got float64"),
])
def test_a_node_refuses_a_stateful_message_without_sound_rows(rows, reason):
    reply, _ = _send(np.array([0, 1, 2]), rows)
    assert reply.has_error() and reason in reply.error.reason, reply.error.reason


def test_fedavg_with_secure_aggregation_is_refused_before_the_run():
    """FedAvg's rows go to the server in the clear, which a masked round cannot carry."""
    with pytest.raises(ValueError, match="use 'furl', whose rows stay on the devices"):
        Settings(params={"aggregator": {"name": "secure"}}, model="fedavg").check()


def test_under_adaptive_dp_a_sampled_models_layout_is_checked_by_its_own_rule(tmp_path):
    """Adaptive clipping needs every upload, and under DP the server knows no count: a reply's
    layout is checked by the client program's own rule (FedNCF: its slots follow from the
    positives, plus the dense rows), so honest replies pass — the model is the in-process
    one — and a reply whose weights do not give its slots is refused."""
    import warnings

    from test_flower import _replace_upload

    dp = {"name": "dp", "clip_norm": 0.5, "noise_multiplier": 0.8, "target_quantile": 0.5,
          "insecure_seeded_noise": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (seeded noise: no ε, said by a warning)
        res, fitted, ref, _ = _serve(tmp_path, "fedncf", FakeGrid(partitions(3)), dp, 0.0)
        assert res["refusals"] == []
        np.testing.assert_array_equal(fitted.item_factors_, ref.item_factors_)
        np.testing.assert_array_equal(fitted.dense_params_, ref.dense_params_)
        lying = FakeGrid(partitions(3), tamper={BIG + 1: _replace_upload(
            "weights", lambda a: a + 1)})
        res, _, _, _ = _serve(tmp_path / "l", "fedncf", lying, dp, 0.0)
    reasons = [r["reason"] for r in res["refusals"] if r["node"] == BIG + 1]
    assert reasons and all("other slot counts" in r for r in reasons)
