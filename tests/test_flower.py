"""fedcf as a Flower app: the server loop over message-passing nodes gives the in-process
FedReconMF bit for bit; bad replies are refused with a logged reason and the run goes on.

Most tests run the real ClientApp and ServerApp code against an in-process grid (``FakeGrid``:
Flower's Message and ClientApp objects, no network); test_flower_simulation runs Flower's
simulation engine (Ray) on ML-100K, test_flower_deployment a SuperLink and SuperNodes."""

import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("flwr")

from conftest import load_script  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedcf import FedReconMF  # noqa: E402
from fedcf.federated import DevicePolicy  # noqa: E402
from fedcf.flower import Settings, fit_in_process, make_client_app, serve, write_app  # noqa: E402
from fedcf.flower.node import (  # noqa: E402
    NodeDataError,
    load_dataset,
    partition,
    tangent_reports,
)
from fedcf.flower.secure import CT_BYTES  # noqa: E402
from fedcf.flower.wire import (  # noqa: E402
    SUM_FIELDS,
    UPLOAD_FIELDS,
    ReplyError,
    arrays,
    client_params,
    record_arrays,
)

DATA = {"dataset": "synthetic", "synthetic-users": 240, "synthetic-items": 50,
        "synthetic-ratings": 4800, "synthetic-seed": 3}
PARAMS = {"n_factors": 6, "n_rounds": 4, "clients_per_round": 30,
          "client_update": {"name": "sgd", "learning_rate": 0.1},
          "random_state": 5}
BIG = 2**63 + 11  # Flower node ids are uint64


class FakeGrid:
    """A Flower Grid in this process: each node is a ClientApp call with its own context, whose
    ``state`` lasts across the node's messages (as a SuperNode keeps it); a message gets its id
    when sent, as on a real grid. ``tamper[node](message, reply) -> reply`` lets a test play a
    broken or hostile node; ``log`` keeps every (type, direction, record -> fields) that
    crossed, ``sent`` every message and reply."""

    def __init__(self, node_configs, run_config=None, tamper=None, app=None):
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
        self.nodes = {BIG + k: cfg for k, cfg in enumerate(node_configs)}
        self.state = {n: RecordDict() for n in self.nodes}
        self.run_config = dict(run_config or DATA)
        self.tamper, self.log, self.sent = tamper or {}, [], []
        self.app = app or make_client_app()

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg.object_id  # as the grid's push does
            node = int(msg.metadata.dst_node_id)
            ctx = Context(1, node, self.nodes[node], self.state[node], self.run_config)
            reply = self.app(msg, ctx)
            if node in self.tamper:
                reply = self.tamper[node](msg, reply)
            if reply is None:
                continue  # the node never answers
            self.sent.append((msg, reply))
            for d, m in (("down", msg), ("up", reply)):
                if not m.has_error():
                    self.log.append((msg.metadata.message_type, d,
                                     {k: _fields(r) for k, r in m.content.items()}))
            replies.append(reply)
        return replies


def _fields(record) -> list:
    """The field names of a record: a packed ArrayRecord's arrays (its own keys if forged)."""
    if isinstance(record, ArrayRecord):
        try:
            return sorted(record_arrays(record))
        except ReplyError:
            pass
    return sorted(record)


def partitions(n, **policy):
    """Node configs of n partitions; ``policy``: each device's own rules (node config keys
    such as ``threshold``, ``min-cohort``). The fake grid's nodes hold a few evaluation users
    each, so their devices report ReconEval sums from 2 users up unless ``policy`` says
    otherwise (the default policy's 10 is tested on its own)."""
    return [{"partition-id": k, "num-partitions": n, **{"min-cohort": 2, **policy}}
            for k in range(n)]


def reference(params, eval_fraction=0.2, device=None):
    model, evaluation, _ = fit_in_process(params, DATA, eval_fraction, device_policy=None if
                                          device is None else DevicePolicy.from_config(device))
    return model, evaluation


def run(grid, tmp_path, params=PARAMS, **kw):
    settings = Settings(params=dict(params), eval_fraction=0.2,
                        model_path=str(tmp_path / "m.npz"), **kw).check()
    res = serve(grid, settings)
    return res, FedReconMF.load(res["model_path"])


@pytest.mark.parametrize("aggregator", [None, {"name": "trimmed-mean", "beta": 0.1}])
def test_same_model_as_in_process_fit(tmp_path, aggregator):
    grid = FakeGrid(partitions(7))
    res, model = run(grid, tmp_path, {**PARAMS, "aggregator": aggregator})
    ref, ref_eval = reference({**PARAMS, "aggregator": aggregator})
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(model.item_biases_, ref.item_biases_)
    assert model.global_mean_ == ref.global_mean_
    assert res["recon_eval"]["rmse"] == pytest.approx(ref_eval["rmse"], rel=1e-12)
    assert res["recon_eval"]["n_ratings"] == ref_eval["n_ratings"] > 0
    assert res["refusals"] == []
    # the saved model is an ordinary FedReconMF: reconstruct / predict / recommend work
    local = model.reconstruct(model.item_ids_[:5], [4.0, 3.0, 5.0, 2.0, 4.0])
    assert np.isfinite(model.predict_local(local, model.item_ids_[5:9])).all()
    assert len(model.recommend(model.item_ids_[:5], [4.0, 3.0, 5.0, 2.0, 4.0], n=3)) == 3
    rec = res["history"][-1]
    assert rec["flower_bytes_down"] > 4 * rec["values_down"] / rec["clients_sampled"]
    assert rec["flower_messages"] <= 7


def test_messages_carry_no_local_parameter(tmp_path):
    grid = FakeGrid(partitions(3))
    run(grid, tmp_path)
    allowed = {"upload": sorted(UPLOAD_FIELDS),
               "users": ["catalog", "counts", "sums", "users"],
               "recon": ["hits", "n", "sae", "sse", "users"]}
    kinds = set()
    for kind, direction, records in grid.log:
        kinds.add((kind, direction))
        for name, fields in records.items():
            if name == "config":
                assert set(fields) <= {"users", "clients", "params", "mu", "rating_scale",
                                       "support", "seed"}
            elif name == "global":  # (evaluation messages have no round ids)
                assert set(fields) in ({"Q", "b", "ids"}, {"Q", "b"}), (kind, direction)
            else:
                assert fields == allowed[name], (kind, direction, name)
    assert {("train", "up"), ("evaluate", "up"), ("query", "up")} <= kinds


def test_upload_rows_are_query_items_only(tmp_path):
    """A client's upload has one row per item of its query set: the item ids it rated in the
    query part, nothing about its embedding (the delta rows are item-row changes)."""
    seen = []

    def keep(msg, reply):
        if msg.metadata.message_type == "train":
            seen.append(record_arrays(reply.content["upload"])["d_Q"].shape)
        return reply

    run(FakeGrid(partitions(2), tamper={BIG: keep}), tmp_path)
    assert seen and all(s[1] == PARAMS["n_factors"] for s in seen)


DP = {"name": "dp", "clip_norm": 0.5, "noise_multiplier": 0.8, "insecure_seeded_noise": True}
DP_PARAMS = {**PARAMS, "rating_scale": [1.0, 5.0], "aggregator": DP, "clients_per_round": 40}


def test_under_dp_the_directory_holds_no_count_or_sum_and_the_model_is_the_in_process_one(
        tmp_path):
    """Under DP the server learns who is eligible and the catalog, nothing of a user's ratings
    before a node's sums; with seeded (insecure, test-only) noise the Flower model is the
    in-process one (bit for bit in this small run; in general up to rounding, since a reduce
    group's clients are added node by node)."""
    grid = FakeGrid(partitions(3))
    with pytest.warns(UserWarning, match="insecure_seeded_noise"):
        res, model = run(grid, tmp_path, DP_PARAMS)
        ref, _ = reference(DP_PARAMS)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    assert model.global_mean_ == ref.global_mean_ == 3.0  # the public scale's middle
    directory = [f for kind, d, f in grid.log if kind == "query" and d == "up"]
    assert directory and all(f == {"users": ["catalog", "users"]} for f in directory)
    assert all("counts" not in f and "sums" not in f for _, _, rec in grid.log
               for f in rec.values())
    assert len(model.user_ids_) == 0 and res["refusals"] == []


def test_under_dp_a_node_lists_only_its_eligible_users():
    from fedcf.flower.node import describe

    own = load_dataset(DATA).subset_users(np.arange(6))
    counts = own.counts()
    floor = int(np.sort(counts)[3])
    rec = record_arrays(describe(own, ConfigRecord({"private-floor": floor})))
    assert sorted(rec) == ["catalog", "users"]
    np.testing.assert_array_equal(rec["users"], own.user_ids[counts >= floor])
    assert sorted(record_arrays(describe(own))) == ["catalog", "counts", "sums", "users"]


def test_under_dp_a_reply_that_lies_about_its_layout_is_refused(tmp_path):
    """Adaptive clipping is not linear, so under it every upload crosses: a reply's layout is
    checked to be FedRecon's (its weights are its query sizes)."""
    grid = FakeGrid(partitions(3), tamper={BIG + 1: _replace_upload("weights", lambda a: a + 1)})
    adaptive = {**DP_PARAMS, "aggregator": {**DP, "name": "differential-privacy",
                                            "target_quantile": 0.5}}
    with pytest.warns(UserWarning, match="insecure_seeded_noise"):
        res, _ = run(grid, tmp_path, adaptive)
    assert any("not the clients' query sizes" in r["reason"] for r in res["refusals"])
    with pytest.raises(ValueError, match="weight_cap needs every user's rating count"):
        Settings(params={**DP_PARAMS, "aggregator": {**DP, "weight_cap": 5.0}}).check()


def _edit_reply(record, field, change, step=None, kind=None):
    """A node that changes ``field`` of its reply's ``record``: in training replies (or those of
    message type ``kind``), or with ``step`` in that secure-aggregation step's replies."""
    kind = kind or ("train" if step is None else "train.secagg")

    def tamper(msg, reply):
        if msg.metadata.message_type != kind or (
                step is not None and msg.content["config"]["step"] != step):
            return reply
        rec = record_arrays(reply.content[record])
        rec[field] = change(rec[field])
        return Message(RecordDict({record: arrays(**rec)}), reply_to=msg)
    return tamper


def _replace_upload(field, value_fn):
    return _edit_reply("upload", field, value_fn)


@pytest.mark.parametrize("tamper, reason", [
    (_replace_upload("d_Q", lambda a: a[:, :-1]), "d_Q has shape"),
    (_replace_upload("items", lambda a: a + 10_000), "items must be integer ids"),
    (_replace_upload("items", lambda a: np.full_like(a, a.max())), "one item in two delta slots"),
    (_replace_upload("weights", lambda a: a * 2), "weights are not the query sizes"),
    (_replace_upload("clients", lambda a: a[::-1] + 1), "answers for clients"),
    (lambda msg, reply: Message(RecordDict({}), reply_to=msg)
     if msg.metadata.message_type == "train" else reply, "no 'upload' record"),
    (lambda msg, reply: None if msg.metadata.message_type == "train" else reply, "no reply"),
])
def test_bad_reply_is_refused_and_round_goes_on(tmp_path, caplog, tamper, reason):
    grid = FakeGrid(partitions(4), tamper={BIG + 1: tamper})
    with caplog.at_level(logging.WARNING, logger="fedcf.flower"):
        res, model = run(grid, tmp_path)
    refused = [r for r in res["refusals"] if r["stage"].startswith("round")]
    assert refused and all(reason in r["reason"] and r["node"] == BIG + 1 for r in refused)
    assert reason in caplog.text
    assert len(res["history"]) == PARAMS["n_rounds"]
    assert np.isfinite(model.item_factors_).all()
    assert sum(r["flower_clients_refused"] for r in res["history"]) > 0


HYPER = {**PARAMS, "n_rounds": 5, "server_optimizer": {"name": "sgd", "learning_rate": 0.5},
         "hypergradients": {"name": "default", "learning_rate": 0.05},
         "aggregator": {"name": "mean"}}


def test_learned_hyperparameters_over_messages_are_the_in_process_run(tmp_path):
    """Hypergradients in a Flower run: the held-out users' nodes answer train.tangents with
    each user's loss and derivatives; the learned rate, its hypergradients and the model are
    the in-process run's bit for bit, and the exchange is counted in the round's record."""
    grid = FakeGrid(partitions(5))
    res, model = run(grid, tmp_path, HYPER)
    ref, _ = reference(HYPER)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(model.item_biases_, ref.item_biases_)
    lr = [r["server_learning_rate"] for r in res["history"]]
    assert lr == [r["server_learning_rate"] for r in ref.history_] and lr[-1] != lr[0]
    assert [r.get("hypergrad_server_learning_rate") for r in res["history"]] == \
        [r.get("hypergrad_server_learning_rate") for r in ref.history_]
    assert res["refusals"] == []
    assert list(res["received"]["train.tangents"]) == ["reports"]
    assert sorted(res["received"]["train.tangents"]["reports"]) == ["clients", "jvp", "losses"]
    later = res["history"][1:]
    assert later and all(r["hyper_flower_messages"] >= 1 and r["hyper_flower_bytes_down"] > 0
                         for r in later)


@pytest.mark.parametrize("change, reason", [
    (lambda a: a[:, :0], "reports jvp must be floating point of shape"),
    (lambda a: a.astype(np.int64), "reports jvp must be floating point"),
])
def test_a_bad_hypergradient_reply_is_refused_and_its_users_do_not_report(tmp_path, change,
                                                                           reason):
    grid = FakeGrid(partitions(4), tamper={BIG + 1: _edit_reply("reports", "jvp", change,
                                                                  kind="train.tangents")})
    res, model = run(grid, tmp_path, HYPER)
    refused = [r for r in res["refusals"] if "hypergradients" in r["stage"]]
    assert refused and all(reason in r["reason"] and r["node"] == BIG + 1 for r in refused)
    assert np.isfinite(model.item_factors_).all() and len(res["history"]) == HYPER["n_rounds"]


def test_a_node_refuses_tangents_that_do_not_fit_its_catalog():
    own = load_dataset(DATA)
    glob = arrays(Q=np.zeros((own.n_items, 6), np.float32), b=np.zeros(own.n_items, np.float32),
                  ids=np.array([1, 0], np.uint64))
    config = {"users": [int(own.user_ids[0])], "clients": [0], "params": client_params(
        FedReconMF(**Settings(params=dict(PARAMS)).check().params)), "mu": 3.5}
    for TQ, Tb, reason in [(np.zeros((1, own.n_items, 5)), np.zeros((1, own.n_items)),
                            "tangents have TQ"),
                           (np.full((1, own.n_items, 6), np.nan), np.zeros((1, own.n_items)),
                            "must be finite")]:
        with pytest.raises(NodeDataError, match=reason):
            tangent_reports(own, config, glob, arrays(TQ=TQ, Tb=Tb))


def test_a_round_with_fewer_replies_than_min_replies_is_not_aggregated(tmp_path):
    """One node of four never answers: with min-replies=4 no round is aggregated (the model
    stays the initial one and each round says why); with min-replies=3 every round is."""
    silent = {BIG + 2: lambda msg, reply: None if msg.metadata.message_type == "train"
              else reply}
    params = {**PARAMS, "eval_every": 0}
    strict, model = run(FakeGrid(partitions(4), tamper=silent), tmp_path, params, min_replies=4)
    assert all(h["clients_used"] == 0 for h in strict["history"])
    dropped = [r for r in strict["refusals"] if "below min-replies=4" in r["reason"]]
    assert len(dropped) == PARAMS["n_rounds"] and all(r["node"] == -1 for r in dropped)
    loose, _ = run(FakeGrid(partitions(4), tamper=silent), tmp_path, params, min_replies=3)
    assert all(h["clients_used"] > 0 for h in loose["history"])
    assert not any("min-replies" in r["reason"] for r in loose["refusals"])
    with pytest.raises(ValueError, match="min-replies must be >= 1"):
        Settings(min_replies=0).check()


def test_nan_from_a_client_is_left_out_and_logged(tmp_path):
    grid = FakeGrid(partitions(4), tamper={BIG + 2: _replace_upload(
        "d_Q", lambda a: np.full_like(a, np.nan))})
    with pytest.warns(RuntimeWarning, match="non-finite"):
        res, model = run(grid, tmp_path)
    assert any("non-finite" in r["reason"] for r in res["refusals"])
    assert sum(r["clients_nonfinite"] for r in res["history"]) > 0
    assert np.isfinite(model.item_factors_).all()


def test_node_without_partition_or_users_is_skipped(tmp_path):
    configs = partitions(3) + [{}, {"partition-id": 9, "num-partitions": 3},
                               {"partition-id": 0, "num-partitions": 3}]
    res, model = run(FakeGrid(configs), tmp_path)
    reasons = " | ".join(r["reason"] for r in res["refusals"])
    assert "no 'partition-id'" in reasons and "partition-id=9 is not in [0" in reasons
    # the two nodes of partition 0 both lose the users they both list; nothing else is lost
    contested = [r for r in res["refusals"] if "another node also lists" in r["reason"]]
    assert {r["node"] for r in contested} == {BIG, BIG + 5}
    zero = partition(DATA, {"partition-id": 0, "num-partitions": 3}).n_users
    assert res["n_train_users"] + res["n_eval_users"] == 240 - zero


def test_empty_partition_and_bad_catalog_are_refused(tmp_path):
    def other_catalog(msg, reply):
        rec = record_arrays(reply.content["users"])
        rec["catalog"] = rec["catalog"][:-1]
        return Message(RecordDict({"users": arrays(**rec)}), reply_to=msg)

    configs = [{"partition-id": k, "num-partitions": 300} for k in (0, 1, 299)] + partitions(2)
    grid = FakeGrid(configs, tamper={BIG + 1: other_catalog})
    res, _ = run(grid, tmp_path)
    reasons = " | ".join(r["reason"] for r in res["refusals"])
    assert "holds no users" in reasons and "item catalog" in reasons


def _train_reply(users=(0,), clients=(0,), Q=(50, 6), dtype=np.float32, ids=2, params=None,
                 kind="train"):
    grid = FakeGrid(partitions(2))
    glob = arrays(Q=np.zeros(Q, dtype), b=np.zeros(Q[0], dtype), ids=np.zeros(ids, np.uint64))
    cfg = ConfigRecord({"users": list(users), "clients": list(clients), "mu": 3.0,
                        "params": json.dumps(PARAMS) if params is None else params,
                        "rating_scale": [1.0, 5.0], "support": 0.5, "seed": 0})
    return grid.send_and_receive([Message(RecordDict({"global": glob, "config": cfg}), BIG,
                                          kind)])[0]


@pytest.mark.parametrize("kw, reason", [
    ({"users": [10**9]}, "user 1000000000 is not held by this node"),
    ({"Q": (49, 6)}, "this node's catalog and parameters declare Q (50, 6)"),
    ({"Q": (50, 5)}, "declare Q (50, 6)"),
    ({"dtype": np.float64}, "dtype float64/float64, expected float32"),
    ({"ids": 3}, "ids must be two integers"),
    ({"users": [0, 2], "clients": [0, 0]}, "clients must be distinct"),
    ({"clients": [-1]}, "clients must be distinct ids >= 0"),
    ({"params": "{"}, "estimator parameters are refused"),
    ({"params": '{"n_factors": -1}'}, "n_factors"),
    ({"Q": (49, 6), "kind": "evaluate"}, "(item_factors_: 50 rows, rows, bias in item_biases_)"),
])
def test_node_refuses_a_bad_message(kw, reason):
    """A node answers a message it cannot serve with an error reply naming the problem (never a
    crash inside a kernel)."""
    reply = _train_reply(**kw)
    assert reply.has_error() and reason in reply.error.reason, reply.error.reason


def test_no_node_or_bad_settings_fail_clearly(tmp_path):
    with pytest.raises(RuntimeError, match="no Flower node connected"):
        serve(FakeGrid([]), Settings(params=PARAMS, wait_seconds=0.2).check())
    with pytest.raises(RuntimeError, match="no node answered the directory query"):
        run(FakeGrid([{}]), tmp_path)
    with pytest.raises(ValueError, match="not JSON"):
        Settings.from_run_config({"fedcf-params": "{n_factors: 3"})
    with pytest.raises(ValueError, match="no parameter 'n_factor'; did you mean n_factors"):
        Settings(params={"n_factor": 3}).check()
    with pytest.raises(ValueError, match="eval-fraction"):
        Settings(eval_fraction=1.0).check()
    for bad in ({"min_nodes": "two"}, {"min_nodes": 1.5}, {"eval_fraction": float("nan")},
                {"reply_timeout": True}):
        with pytest.raises(TypeError, match=list(bad)[0].replace("_", "-")):
            Settings(**bad).check()
    with pytest.raises(ValueError, match="executor"):
        Settings(params={"executor": "ray"}).check()
    with pytest.raises(ValueError, match="hypergradients in a Flower run take the plain mean"):
        Settings(params={**HYPER, "aggregator": DP}).check()
    with pytest.raises(ValueError, match="default aggregator is NormClippedMean"):
        Settings(params={k: v for k, v in HYPER.items() if k != "aggregator"}).check()
    with pytest.raises(ValueError, match="aggregator name: .Mean. is not a registered aggregator"):
        Settings(params={"aggregator": {"name": "Mean"}}).check()
    with pytest.raises(ValueError, match="n_factors"):
        Settings(params={"n_factors": 0}).check()
    from fedcf.federated import DifferentialPrivacy, SecureAggregation

    seeded = DifferentialPrivacy(SecureAggregation(), 0.5, 1.0, noise="distributed",
                                 insecure_seeded_noise=True)
    with pytest.raises(ValueError, match="own secure randomness"):
        Settings(params={"aggregator": seeded, "rating_scale": [1, 5]}).check()
    with pytest.raises(ValueError, match="not available in a Flower run"):
        Settings(params={"item_space": {"name": "open", "catalog": 0.5}}).check()
    s = Settings.from_run_config({"fedcf-params": json.dumps(PARAMS), "eval-fraction": 0.3,
                                  "dataset": "synthetic", "model-path": ""})
    assert s.eval_fraction == 0.3 and s.model_path is None and s.params["n_factors"] == 6


class Broken(FakeGrid):
    """Loses the connection at the ``fail_at``-th training exchange."""

    def __init__(self, *a, fail_at, **kw):
        super().__init__(*a, **kw)
        self.fail_at, self.trains = fail_at, 0

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            self.trains += 1
            if self.trains == self.fail_at:
                raise ConnectionError("SuperLink went away")
        return super().send_and_receive(messages, timeout=timeout)


def test_checkpoint_resume_and_periodic_eval(tmp_path):
    """A server that dies mid-run resumes from its checkpoint to the uninterrupted model;
    eval_every runs federated ReconEval into history_."""
    params = {**PARAMS, "checkpoint_path": str(tmp_path / "ck.npz"), "checkpoint_every": 1,
              "eval_every": 2}
    with pytest.raises(ConnectionError, match="SuperLink went away"):
        run(Broken(partitions(3), fail_at=3), tmp_path, params)
    res, model = run(FakeGrid(partitions(3)), tmp_path, params)
    ref, _ = reference({k: v for k, v in params.items() if k != "checkpoint_path"})
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    evals = [r["eval"]["rmse"] for r in res["history"] if "eval" in r]
    assert len(evals) == 2 and np.isfinite(evals).all()


def test_write_app_project(tmp_path):
    d = write_app(tmp_path / "app", dataset="ml-100k", **{"fedcf-params": '{"a": "b\\"c"}',
                                                           "min-nodes": 2, "flag": True})
    tomllib = pytest.importorskip("tomllib")
    conf = tomllib.loads((d / "pyproject.toml").read_text())
    assert conf["tool"]["flwr"]["app"]["config"] == {
        "dataset": "ml-100k", "fedcf-params": '{"a": "b\\"c"}', "min-nodes": 2, "flag": True}
    assert conf["tool"]["flwr"]["app"]["components"]["clientapp"] == \
        "fedcf_flower_app:client_app"
    with pytest.raises(TypeError, match="run config 'x' must be str"):
        write_app(tmp_path / "b", x=[1])


@pytest.mark.network
@pytest.mark.cluster
@pytest.mark.ray
def _simulate(tmp_path, *args) -> dict:
    """scripts/flower_simulation.py with ``args`` in a subprocess: its result JSON, checked for
    the in-process model's item factors and ReconEval, and for no refusal or stray field."""
    out = tmp_path / "sim.json"
    proc = subprocess.run([sys.executable, str(load_script("flower_simulation").__file__),
                           *args, "--json", str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["identical_item_factors"] and r["rmse_relative_difference"] < 1e-9
    assert r["unexpected_fields"] == [] and r["refusals"] == []
    return r


def test_flower_simulation_ml100k_matches_fedreconmf(tmp_path):
    """Flower's simulation engine (Ray backend), 10 nodes holding ML-100K partitions, 4
    rounds: the same model bit for bit as FedReconMF in process, and the same ReconEval."""
    load_dataset({"dataset": "ml-100k"})  # skips the test when the data are unreachable
    r = _simulate(tmp_path, "--partitions", "10", "--rounds", "4")
    assert r["identical_item_biases"]
    assert r["messages"]["train/up"] >= 4 and r["messages"]["query/up"] == 10


def test_flower_simulation_keeps_furls_rows_on_the_nodes_across_rounds(tmp_path):
    """FURL through Flower's simulation engine: 4 nodes, 5 rounds of 100 of 540 users (so
    users come back): the nodes' run state carries each user's row from round to round, as
    the in-process fit keeps it, so the model is that fit's bit for bit; no row goes up."""
    r = _simulate(tmp_path, "--model", "furl", "--dataset", "synthetic", "--partitions", "4",
                  "--rounds", "5", "--clients-per-round", "100")
    assert r["identical_losses"]


def test_stopping_a_deployment_also_stops_what_its_processes_detached(tmp_path):
    """The SuperLink starts its SuperExec, which starts ``flwr-serverapp``, in a session of
    its own, out of the process group the deployment kills: ``stop`` finds such processes by
    their parent and stops them too, and names their group among those it stopped."""
    deploy = load_script("flower_deploy")
    pid_file = tmp_path / "grandchild"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(120)'], start_new_session=True); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        for _ in range(200):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.05)
        grandchild = int(pid_file.read_text())
        groups = deploy.stop([parent], grace=5.0)
        assert grandchild in groups and parent.pid in groups
        assert deploy.members(groups) == set()
        assert parent.poll() is not None
    finally:
        for pid in [parent.pid] + ([int(pid_file.read_text())] if pid_file.exists() and
                                   pid_file.read_text() else []):
            try:
                os.killpg(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.mark.cluster
def test_flower_deployment_superlink_and_supernodes(tmp_path):
    """A SuperLink and three SuperNodes as separate processes on 127.0.0.1 with TLS and
    SuperNode authentication, each a device holding its own users' ratings in its own file
    (the run config names no dataset; the server sends its catalog), ``flwr run``, training
    under secure aggregation, every node's messages answered by one warm process
    (``fedcf.flower.warm``, ``--isolation process``): a fourth node whose key was never
    registered is kept out (it
    would hold the first device's users, which the directory would refuse); the server
    received protocol messages only (no upload record); the model is the in-process
    secure-aggregation model bit for bit; every socket is on loopback, every process is gone.
    (A node killed after masking in a deployment: eval/results/flower_deploy_secagg.json; in
    this process: test_a_node_lost_after_masking_is_unmasked_by_the_others.)"""
    deploy = load_script("flower_deploy")
    params = {**SEC_PARAMS, "n_rounds": 1, "clients_per_round": 15}
    devices, catalog = deploy.device_files(tmp_path / "devices", DATA, 3)
    config = {"fedcf-params": json.dumps(params), "eval-fraction": 0.2,  # no dataset named
              "catalog-path": catalog, "model-path": str(tmp_path / "deployed.npz")}
    res = deploy.deploy(tmp_path / "run", nodes=3, run_config=config, deadline=300,
                        intruders=1, node_configs=devices, warm=True)
    assert res["listening"] and all(a.startswith("127.0.0.1:") for a in res["listening"])
    assert res["refusals"] == [] and res["n_nodes"] == 3  # the intruder never got in
    assert res["intruders_turned_away"] == 1  # the SuperLink refused to activate it
    assert (tmp_path / "run" / "credentials" / "ca.crt").exists()
    assert list(res["received"]) == ["train.secagg"]  # no "train": no upload ever came
    assert list(res["received"]["train.secagg"]) == ["secagg"]
    assert res["history"][0]["secagg_survivors"] == 15
    model = FedReconMF.load(res["model_path"])
    ref, ref_eval = reference(params)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    assert res["recon_eval"]["rmse"] == pytest.approx(ref_eval["rmse"], rel=1e-12)
    assert res["left_running"] == []
    assert res["detached_groups_stopped"] >= 1  # the SuperLink's SuperExec, in its own session
    # what each message cost a device, from the nodes' own logs (never sent to the server)
    costs = res["node_costs"]
    assert {"query", "train.secagg", "evaluate"} <= {c["message"] for c in costs}
    handled = [c for c in costs if "seconds" in c]
    assert all(c["startup_seconds"] is None and c["peak_rss_mib"] > 0 for c in handled)
    assert {c["node"] for c in costs} == {0, 1, 2}
    tasks = [c for c in costs if "task_seconds" in c]  # each message a task of the warm process
    assert len(tasks) == len(handled) and all(c["status"] == "completed" for c in tasks)
    assert all(c["task_seconds"] >= h["seconds"] for c, h in zip(tasks, handled))


# ------------------------------------------------------------------ secure aggregation
SECAGG = {"name": "secure", "min_cohort": 5, "value_bound": 10.0, "precision": 16}
SEC_PARAMS = {**PARAMS, "aggregator": SECAGG, "n_rounds": 2}


def _encoded_rows(monkeypatch):
    """Record every row a node encodes (the plain, quantized uploads) as the test's ground
    truth of what must never reach the server."""
    from fedcf.federated.aggregators.secagg_client import Encoding

    rows, real = [], Encoding.encode

    def encode(self, out, hp):
        q, f = real(self, out, hp)
        rows.append((q.copy(), self.word_bytes()))
        return q, f

    monkeypatch.setattr(Encoding, "encode", encode)
    return rows


def _masked_words(replies, word_bytes) -> np.ndarray:
    """The masked vectors in ``replies``' protocol tables, unpacked to words as the server
    half reads them."""
    from fedcf.federated.aggregators.secagg_masks import unpack_words

    tables = [record_arrays(r.content["secagg"]) for r in replies if "secagg" in r.content]
    packed = [t["masked.data"] for t in tables if "masked.data" in t]
    return np.array([unpack_words(row, word_bytes) for rows in packed for row in rows])


def _reduced(words, word_bytes) -> np.ndarray:
    """Words modulo 2^(8·word_bytes): what a packed vector can carry."""
    return (words.astype(np.uint64) % (np.uint64(1) << (8 * word_bytes).astype(np.uint64))
            ).astype(np.uint32)


def test_secure_aggregation_over_messages_is_the_in_process_model(tmp_path, monkeypatch):
    """Each node encodes and masks its own clients; the server gets protocol messages only —
    no upload record, no vector equal to an encoded row, no field outside the protocol's —
    and the model is the in-process secure-aggregation model bit for bit (the sum is exact);
    the nodes keep no protocol state after a round."""
    rows = _encoded_rows(monkeypatch)
    grid = FakeGrid(partitions(3))
    res, model = run(grid, tmp_path, SEC_PARAMS)
    words = rows[0][1]
    assert (words[:-9] == 3).all()  # 16 bits below value_bound fit 3 bytes
    plain = _reduced(np.concatenate([q for q, _ in rows]), words)
    ref, _ = reference(SEC_PARAMS)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    np.testing.assert_array_equal(model.item_biases_, ref.item_biases_)
    assert res["refusals"] == [] and len(plain) == SEC_PARAMS["n_rounds"] * 30
    assert all(h["secagg_survivors"] == 30 and not h["secagg_lost_round"]
               for h in res["history"])
    assert all(h["flower_messages"] == 15 for h in res["history"])  # 5 steps x 3 nodes
    ups = [reply for msg, reply in grid.sent if msg.metadata.message_type == "train.secagg"]
    assert ups and all(set(r.content.keys()) == {"secagg"} for r in ups)
    fields = set().union(*(record_arrays(r.content["secagg"]) for r in ups))
    assert {f.split(".")[0] for f in fields} == {"keys", "adverts", "shares", "masked",
                                                 "sigs", "unmask"}
    masked = _masked_words(ups, words)
    assert masked.shape == (len(plain), plain.shape[1])
    assert (masked[:, None, :] == plain[None, :, :]).mean() < 1e-3  # chance: 2^-24 per word
    assert not any(m.metadata.message_type == "train" for m, _ in grid.sent)
    assert all("fedcf-secagg" not in st for st in grid.state.values())


def test_hypergradients_under_secure_aggregation_stay_masked_on_the_nodes(tmp_path,
                                                                          monkeypatch):
    """Learned hyperparameters under secure aggregation over messages: each node computes,
    clips, weighs and encodes its users' reports and masks them in the reports' own protocol
    session (group round-<t>-hyper); no train.tangents message and no report record reaches the
    server, no masked vector equals an encoded report row, and the learned rate and the model
    are the in-process run's bit for bit."""
    from fedcf.federated.round.reports import ReportEncoding

    rows, real = [], ReportEncoding.encode

    def encode(self, reports):
        q = real(self, reports)
        rows.append(q.copy())
        return q

    monkeypatch.setattr(ReportEncoding, "encode", encode)
    params = {**HYPER, "aggregator": SECAGG, "n_rounds": 4}
    grid = FakeGrid(partitions(3))
    res, model = run(grid, tmp_path, params)
    plain = np.concatenate(rows)  # the nodes' encoded reports (the reference encodes too)
    ref, _ = reference(params)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    lr = [h["server_learning_rate"] for h in res["history"]]
    assert lr == [h["server_learning_rate"] for h in ref.history_] and lr[-1] != lr[0]
    assert res["refusals"] == [] and rows
    assert "train.tangents" not in res["received"]
    hyper = [(m, r) for m, r in grid.sent if m.metadata.message_type == "train.secagg"
             and str(m.metadata.group_id).endswith("-hyper/begin")]
    assert hyper and all(set(r.content.keys()) == {"secagg"} for _, r in hyper)
    masked = _masked_words([r for m, r in grid.sent if "-hyper/" in str(m.metadata.group_id)],
                           np.full(plain.shape[1], 4))
    assert masked.shape == (len(plain), plain.shape[1])
    assert (masked[:, None, :] == plain[None, :, :]).mean() < 1e-3
    later = res["history"][1:]
    assert all(h["hyper_flower_messages"] >= 5 for h in later)  # five protocol steps


@pytest.mark.parametrize("enc, reason", [
    ({"H": 2, "m": 3, "clip": 1.0}, "does not fit 1 tangents"),
    ({"H": 1, "m": 3, "clip": float("nan")}, "a finite clip"),
    ({"H": 1, "m": 3, "clip": 1.0, "unknown": 1}, "not one"),
    ({"H": 1, "m": 3, "clip": 1.0, "noise_std": 0.5, "secret_noise": False}, "seeded noise"),
])
def test_a_node_refuses_a_report_encoding_it_must_not_use(enc, reason):
    from fedcf.flower.secure import NodeProtocolError, read_report_encoding

    with pytest.raises(NodeProtocolError, match=reason):
        read_report_encoding(json.dumps(enc), 1)


@pytest.mark.parametrize("precision, ok", [(None, True), (16, True), (0, False), (31, False),
                                           ("16", False), (16.0, False), (True, False)])
def test_a_node_reads_the_encodings_precision_only_as_bits(precision, ok):
    from fedcf.federated.aggregators.secagg_client import Encoding
    from fedcf.flower.secure import NodeProtocolError, encoding_json, read_encoding

    text = encoding_json(Encoding(4, 2, 10, 1.0, 1000.0, precision=precision))
    if ok:
        assert read_encoding(text, 4, 2).precision == precision
    else:
        with pytest.raises(NodeProtocolError, match="precision must be null or bits"):
            read_encoding(text, 4, 2)


@pytest.mark.parametrize("field, value, match", [
    ("value_bound", -1.0, "value_bound must be a finite number > 0"),
    ("value_bound", float("nan"), "value_bound must be a finite number > 0"),
    ("max_weight", float("inf"), "max_weight must be a finite number > 0"),
    ("loss_bound", "1e3", "loss_bound must be a finite number > 0"),
    ("m", 0, "cohort m must be a count >= 1"),
    ("m", 2.5, "cohort m must be a count >= 1"),
    ("noise_std", -0.1, "noise_std finite >= 0"),
])
def test_a_node_names_an_encoding_whose_public_figures_cannot_be_true(field, value, match):
    """A server's encoding with bounds no fixed point rests on is refused by name on the node
    (not a NaN deep inside the scales)."""
    import dataclasses

    from fedcf.federated.aggregators.secagg_client import Encoding
    from fedcf.flower.secure import NodeProtocolError, read_encoding

    text = json.dumps({**dataclasses.asdict(Encoding(4, 2, 10, 1.0, 1000.0, precision=16)),
                       field: value})
    with pytest.raises(NodeProtocolError, match=match):
        read_encoding(text, 4, 2)


def _silent(steps):
    def tamper(msg, reply):
        step = msg.content["config"]["step"] if msg.metadata.message_type == "train.secagg" \
            else None
        return None if step in steps else reply
    return tamper


def _unavailable(steps):
    """The SuperLink's answer for a node that stopped sending heartbeats: an error reply in the
    SuperLink's own name (node id 1), tied to the message by reply_to_message_id."""
    from flwr.app import Error

    def tamper(msg, reply):
        if msg.metadata.message_type != "train.secagg" or \
                msg.content["config"]["step"] not in steps:
            return reply
        err = Message(error=Error(5, "Node Unavailable"), reply_to=msg)
        err.metadata.__dict__["_src_node_id"] = 1
        return err
    return tamper


def test_a_node_lost_after_masking_is_unmasked_by_the_others(tmp_path):
    """A node that sent its masked vectors and then died: the other clients' shares remove its
    clients' self-masks, so the round's sum — and the model — are the ones with no failure;
    the SuperLink's error reply is logged against the dead node, not against node 1."""
    grid = FakeGrid(partitions(4), tamper={BIG + 2: _unavailable({"consistency", "unmask"})})
    res, model = run(grid, tmp_path, SEC_PARAMS)
    ref, _ = reference(SEC_PARAMS)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    lost = [r for r in res["refusals"] if "secagg consistency" in r["stage"]]
    assert len(lost) == SEC_PARAMS["n_rounds"] and all(r["node"] == BIG + 2 for r in lost)
    assert all("Node Unavailable" in r["reason"] and r["clients"] > 0 for r in lost)
    assert all(h["secagg_survivors"] == 30 for h in res["history"])


def test_a_node_lost_before_masking_drops_its_clients_and_the_round_goes_on(tmp_path):
    grid = FakeGrid(partitions(4), tamper={BIG + 1: _silent({"mask"})})
    res, model = run(grid, tmp_path, SEC_PARAMS)
    first, second = res["history"]
    assert 0 < first["secagg_survivors"] < 30 and not first["secagg_lost_round"]
    # it missed a deadline: it sits out the next round, whose cohort is the others' users
    assert second["secagg_survivors"] == 30 and not second["secagg_lost_round"]
    assert np.isfinite(model.item_factors_).all()


def _forge(step, field, change):
    return _edit_reply("secagg", field, change, step)


@pytest.mark.parametrize("tamper, reason", [
    (_forge("begin", "keys.client", lambda a: a + 1000), "not one per client asked"),
    (_forge("mask", "masked.client", lambda a: a + 1000), "clients it was not asked about"),
    (_forge("mask", "masked.data", lambda a: a[:, :-1]), "rows of"),
    (_forge("share", "shares.data", lambda a: a.astype(np.int64)), f"uint8 rows of {CT_BYTES}"),
    (_forge("unmask", "unmask.secret", lambda a: a + 2), "secret 0 (mask key) or 1"),
])
def test_a_hostile_node_is_refused_and_the_others_aggregate(tmp_path, tamper, reason):
    """A node that answers for clients it does not hold, or with malformed protocol tables, is
    refused at that step with the reason; the round goes on with the other nodes' clients."""
    res, model = run(FakeGrid(partitions(4), tamper={BIG + 3: tamper}), tmp_path, SEC_PARAMS)
    refused = [r for r in res["refusals"] if "secagg" in r["stage"]]
    assert refused and all(reason in r["reason"] and r["node"] == BIG + 3 for r in refused)
    assert any(not h["secagg_lost_round"] for h in res["history"])
    assert np.isfinite(model.item_factors_).all()


def test_a_node_refuses_what_a_device_must_not_do(tmp_path):
    """The node side decides for its device: no seeded noise share, no step without the
    round's state (a restart), no key registry that replaces its own clients' keys."""
    from fedcf.federated.aggregators.secagg_client import Encoding
    from fedcf.flower.secure import NodeProtocolError, node_step, read_encoding

    seeded = json.dumps({**Encoding(50, 6, 10, 1.0, 10.0, noise_std=0.1,
                                    secret_noise=False).__dict__})
    with pytest.raises(NodeProtocolError, match="own secure randomness"):
        read_encoding(seeded, 50, 6)
    with pytest.raises(NodeProtocolError, match="50 items and K=6; this node"):
        read_encoding(seeded, 49, 6)
    msg = RecordDict({"config": ConfigRecord({"step": "mask", "session": b"s" * 16})})
    with pytest.raises(NodeProtocolError, match="no protocol state for this session"):
        node_step(None, msg, RecordDict())
    with pytest.raises(NodeProtocolError, match="step in"):
        node_step(None, RecordDict({"config": ConfigRecord({"step": "peek"})}), RecordDict())
    from fedcf.federated.aggregators.secagg_client import ClientHalves
    from fedcf.federated.aggregators.secagg_protocol import ProtocolAbort

    halves = ClientHalves([1, 2], np.zeros((2, 3), np.uint32), 2, b"s" * 16)
    halves.advertise(halves.verifying())
    with pytest.raises(ProtocolAbort, match="replaces the identity key"):
        halves.trust({1: b"\0" * 32, 2: halves.verifying()[2]})


@pytest.mark.parametrize("change, reason", [
    ({"params": json.dumps({"n_factors": -1})}, "n_factors"),
    ({"params": json.dumps({"n_factors": 6, "client_update": {"name": "sgd",
                                                              "learning_rate": float("nan")}})},
     "learning_rate"),
    ({"params": json.dumps({"n_factors": 6, "split": {"name": "bogus"}})}, "bogus"),
    ({"mu": float("nan")}, "mu must be a finite number"),
    ({"mu": "3"}, "mu must be a finite number"),
    ({"support": 5.0}, "support fraction 5.0 is not in"),
    ({"rating_scale": [5.0, 1.0]}, "rating_scale"),
    ({"rating_scale": [1.0]}, r"rating_scale\[1\] must be"),
    ({"seed": 1.5}, "seed must be a finite integer"),
])
def test_a_node_refuses_numbers_it_must_not_compute_with(change, reason):
    """What a train or evaluate message asks a device to compute with is checked on the
    device: bad parameters, NaN or a missing mu, a support fraction outside (0, 1)."""
    from fedcf.flower.node import client_outputs, evaluate

    own = load_dataset(DATA).subset_users(np.arange(4))
    glob = arrays(Q=np.zeros((own.n_items, 6), np.float32), b=np.zeros(own.n_items, np.float32),
                  ids=np.array([1, 0]))
    config = {"users": [int(u) for u in own.user_ids], "clients": [0, 1, 2, 3], "mu": 3.0,
              "params": json.dumps({"n_factors": 6}), "support": 0.5, "seed": 1,
              "rating_scale": [1.0, 5.0]}
    policy = {"min-cohort": 2}  # the device reports sums over its 4 users
    evaluate(own, config, glob, None, policy)  # the unchanged message is served
    with pytest.raises(ValueError, match=reason):
        work = client_outputs if "support" not in reason and "scale" not in reason and \
            "seed" not in reason else evaluate
        work(own, {**config, **change}, glob)


def test_a_device_reports_evaluation_sums_once_per_model_and_over_a_cohort_only():
    """A node's ReconEval sums are in the clear: its device reports each user once per model
    (no S and S − {v} on one model) and only over at least its policy's min-cohort users."""
    from fedcf.flower.node import evaluate

    own = load_dataset(DATA).subset_users(np.arange(12))
    Q = np.random.default_rng(0).normal(0, 0.1, (own.n_items, 6)).astype(np.float32)
    glob = arrays(Q=Q, b=np.zeros(own.n_items, np.float32), ids=np.array([1, 0]))
    users = [int(u) for u in own.user_ids]
    config = {"users": users, "mu": 3.0, "params": json.dumps({"n_factors": 6}),
              "support": 0.5, "seed": 1, "rating_scale": [1.0, 5.0]}
    with pytest.raises(RuntimeError, match="fewer than the device's min_cohort=10"):
        evaluate(own, {**config, "users": users[:9]}, glob)  # the default policy's 10
    state = {}
    first = evaluate(own, {**config, "users": users[:11]}, glob, state)
    assert first == evaluate(own, {**config, "users": users[:11]}, glob) and first["n"] > 0
    with pytest.raises(RuntimeError, match="1 user"):  # S − {v} after S, or v alone
        evaluate(own, {**config, "users": users[1:]}, glob, state, {"min-cohort": 2})
    with pytest.raises(ValueError, match="more than once"):
        evaluate(own, {**config, "users": [users[0]] * 10}, glob, None, {"min-cohort": 2})
    moved = arrays(Q=Q + 0.01, b=np.zeros(own.n_items, np.float32), ids=np.array([1, 1]))
    again = evaluate(own, config, moved, state)  # a new model: all twelve answer
    assert again == evaluate(own, config, moved) and again["users"] >= first["users"]


def test_nodes_below_their_evaluation_cohort_leave_recon_eval_out(tmp_path):
    """Over the fake grid, devices at the default policy (min-cohort 10) with fewer evaluation
    users refuse to report, and the run says so."""
    res, _ = run(FakeGrid([{**p, "min-cohort": 10} for p in partitions(7)]), tmp_path,
                 {**PARAMS, "n_rounds": 2})
    refused = [r for r in res["refusals"] if r["stage"].startswith("recon eval")]
    assert refused and all("min_cohort=10" in r["reason"] for r in refused)


def test_secure_aggregation_with_dp_over_messages(tmp_path):
    """DP around secure aggregation in a Flower run: with server noise (seeded, test-only) the
    model is the in-process one bit for bit; with distributed noise each device adds its
    share, and the run reports the in-process ε."""
    dp = {"name": "differential-privacy", "aggregator": SECAGG, "clip_norm": 0.5, "noise_multiplier": 0.8,
          "insecure_seeded_noise": True}
    params = {**SEC_PARAMS, "rating_scale": [1.0, 5.0], "aggregator": dp,
              "clients_per_round": 20, "n_rounds": 2}
    with pytest.warns(UserWarning, match="insecure_seeded_noise"):
        res, model = run(FakeGrid(partitions(3)), tmp_path, params)
        ref, _ = reference(params)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    dist = {**params, "aggregator": {**dp, "noise": "distributed", "insecure_seeded_noise":
                                     False}}
    res, model = run(FakeGrid(partitions(3)), tmp_path, dist)
    ref, _ = reference(dist)
    eps = res["history"][-1]["epsilon"]
    assert eps == pytest.approx(ref.epsilon_) and np.isfinite(eps)
    assert res["refusals"] == [] and np.isfinite(model.item_factors_).all()
    assert all(h["secagg_survivors"] > 0 for h in res["history"])


def test_a_node_sizes_its_arrays_by_its_own_users_and_uploads_what_the_simulation_would():
    """A node's client work runs on a CSR of its own users, each row's random stream keyed by
    the client's id in the run (rng.client_key): the uploads equal a population-wide CSR's
    for the same clients, and a client id of 10^8 costs no 10^8-sized array."""
    import tracemalloc

    from fedcf.federated.round.phases import BoundLocalExecutor, Cohort
    from fedcf.flower.node import client_outputs

    own = load_dataset(DATA).subset_users(np.arange(4))
    glob = arrays(Q=np.random.default_rng(0).normal(0, 0.1, (own.n_items, 6)).astype(np.float32),
                  b=np.zeros(own.n_items, np.float32), ids=np.array([7, 2]))
    params = json.dumps({"n_factors": 6})
    config = {"users": [int(u) for u in own.user_ids], "clients": [3, 17, 5, 42], "mu": 3.0,
              "params": params}
    got = client_outputs(own, config, glob)
    # the same four users as rows 3, 17, 5, 42 of a population CSR (the other rows empty)
    counts = np.zeros(43, np.int64)
    counts[config["clients"]] = own.counts()
    indptr = np.r_[0, np.cumsum(counts)]
    order = np.argsort(config["clients"])
    take = np.concatenate([np.arange(own.indptr[r], own.indptr[r + 1]) for r in order])
    from fedcf.flower.wire import client_estimator

    program = client_estimator(params).client_program(None, 3.0)
    ref = BoundLocalExecutor(program, (indptr, own.items[take], own.values[take])).run(
        Cohort(np.array(config["clients"]), 4, 0, 0),
        {k: record_arrays(glob)[k] for k in ("Q", "b")}, np.array([7, 2], np.uint64))
    for field in ("offsets", "items", "d_Q", "d_b", "weights", "losses", "clients"):
        np.testing.assert_array_equal(getattr(got, field), getattr(ref, field), err_msg=field)
    tracemalloc.start()
    client_outputs(own, {**config, "clients": [3, 10**8, 5, 42]}, glob)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * 2**20, peak  # a 10^8-row CSR alone would be 800 MB


def _device_files(tmp_path, n_nodes):
    """The synthetic data split into one MovieLens ratings.csv per node, each node's users
    only, plus a rating of an item outside the run's catalog on the first; and the catalog."""
    full = load_dataset(DATA)
    df = full.to_dataframe()
    catalog = tmp_path / "catalog.txt"
    catalog.write_text("# the run's items\n" + "\n".join(str(i) for i in full.item_ids) + "\n")
    nodes = []
    for k in range(n_nodes):
        part = df[df.user.isin(full.user_ids[k::n_nodes])]
        if k == 0:
            part = pd.concat([part, pd.DataFrame({"user": [part.user.iloc[0]], "item": [99_999],
                                                  "rating": [5.0], "timestamp": [0]})])
        folder = tmp_path / f"device{k}"
        folder.mkdir()
        part.rename(columns={"user": "userId", "item": "movieId"}).to_csv(
            folder / "ratings.csv", index=False)
        nodes.append({"data-path": str(folder / "ratings.csv")})
    return nodes, str(catalog)


def test_nodes_holding_their_own_data_train_the_in_process_model(tmp_path, caplog):
    """Devices that hold their own ratings (node config data-path, no dataset named by the
    server): the server sends its catalog with the directory query, each node maps its items
    into it (a rating outside it is left out and logged) — the model is the in-process fit's
    on the same ratings, and no node reports a catalog."""
    nodes, catalog = _device_files(tmp_path, 3)
    grid = FakeGrid(nodes, run_config={})
    with caplog.at_level(logging.INFO, logger="fedcf.flower.node"):
        res, model = run(grid, tmp_path, catalog_path=catalog)
    ref, _ = reference(PARAMS)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    assert res["refusals"] == [] and "1 of" in caplog.text and "outside the run's catalog" \
        in caplog.text
    ups = [f for kind, d, f in grid.log if kind == "query" and d == "up"]
    assert ups and all("catalog" not in f["users"] for f in ups)


@pytest.mark.parametrize("node, catalog_text, match", [
    ({"data-path": "/nonexistent/ratings.csv"}, "1\n2\n", "cannot be read"),
    (None, None, "has no item catalog yet"),
    (None, "123456\n", "none of this node's"),
])
def test_a_device_node_refuses_what_it_cannot_serve(tmp_path, node, catalog_text, match):
    nodes, _ = _device_files(tmp_path, 1)
    cfg = node or nodes[0]
    from fedcf.flower.node import node_data

    catalog = None if catalog_text is None else np.array(
        [int(x) for x in catalog_text.split()], np.int64)
    with pytest.raises(ValueError, match=match):
        node_data({}, cfg, RecordDict(), catalog)


@pytest.mark.parametrize("text, match", [("1\nx\n", "line 2: 'x' is not an integer"),
                                         ("# none\n", "lists no item id"),
                                         ("3\n3\n", "lists item 3 twice")])
def test_a_bad_catalog_file_is_named_before_any_node_is_contacted(tmp_path, text, match):
    path = tmp_path / "c.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        Settings(params=PARAMS, catalog_path=str(path)).check()


@pytest.mark.parametrize("scale", [1e3, 1e30])
def test_one_wild_node_is_clipped_by_default(tmp_path, scale):
    """A Flower run that names no aggregator clips each upload to 3x the round's median norm:
    one node of four sending deltas scaled 1000-fold (or 10^30-fold) barely moves the held-out
    RMSE. Under the plain mean (named explicitly), whose node sums no clip bounds, a node
    whose sums per client are far beyond the other nodes' is refused by name each round and
    the run goes on; a node 5-fold off the others is not refused."""
    wild = {BIG + 1: _replace_upload("d_Q", lambda a: a * scale)}
    wild_sums = {BIG + 1: _edit_reply("sums", "s_Q", lambda a: a * scale)}  # the plain mean's
    honest, _ = run(FakeGrid(partitions(4)), tmp_path, {**PARAMS, "eval_every": 0})
    clipped, _ = run(FakeGrid(partitions(4), tamper=wild), tmp_path, PARAMS)
    mean = {**PARAMS, "aggregator": {"name": "mean"}}
    plain, _ = run(FakeGrid(partitions(4), tamper=wild_sums), tmp_path, mean)
    base = honest["recon_eval"]["rmse"]
    assert clipped["recon_eval"]["rmse"] < 1.01 * base, (clipped["recon_eval"], base)
    assert all(h["clients_clipped"] > 0 for h in clipped["history"])
    # the clipped uploads are the wild node's, and the history says so
    assert all(str(BIG + 1) in h["flower_clipped_by_node"] and
               h["flower_clipped_by_node"][str(BIG + 1)] == max(
                   h["flower_clipped_by_node"].values()) for h in clipped["history"])
    refused = [r for r in plain["refusals"] if r["stage"].startswith("round")]
    assert len(refused) == PARAMS["n_rounds"] and all(
        r["node"] == BIG + 1 and "times the median" in r["reason"] for r in refused)
    assert plain["recon_eval"]["rmse"] < 1.05 * base, (plain["recon_eval"], base)
    mild, _ = run(FakeGrid(partitions(4), tamper={BIG + 1: _edit_reply(
        "sums", "s_Q", lambda a: a * 5)}), tmp_path, mean)
    assert not [r for r in mild["refusals"] if r["stage"].startswith("round")]


def test_a_node_share_cap_keeps_a_random_part_of_an_oversized_node():
    """No node keeps more than max-node-share of the users kept: three nodes of 50 users and
    one of 200 keep 50, 50, 50 and 100 (40 % of 250); balanced nodes, two nodes, or a share of
    1 keep everyone; the capped node is named; the choice is the run seed's."""
    from fedcf.flower import Directory
    from fedcf.flower.directory import Refusals, cap_node_shares

    def directory(sizes):
        node_of = np.repeat(np.arange(len(sizes)), sizes)
        return Directory(user_ids=np.arange(len(node_of)), node_of=node_of,
                         nodes=[BIG + k for k in range(len(sizes))], counts=None, sums=None,
                         catalog=np.arange(3))

    d, refusals = directory([50, 50, 200, 50]), Refusals()
    kept = cap_node_shares(d, 0.4, 0, refusals)
    assert np.bincount(d.node_of[kept]).tolist() == [50, 50, 100, 50]
    assert [r["node"] for r in refusals.items] == [BIG + 2]
    assert "lists 200 users" in refusals.items[0]["reason"]
    assert np.array_equal(kept, cap_node_shares(d, 0.4, 0, Refusals()))
    assert not np.array_equal(kept, cap_node_shares(d, 0.4, 1, Refusals()))
    for sizes, share in (([60, 50, 55], 0.4), ([50, 200], 0.4), ([50, 50, 200], 1.0)):
        d, refusals = directory(sizes), Refusals()
        assert len(cap_node_shares(d, share, 0, refusals)) == sum(sizes)
        assert refusals.items == []


def _fabricated_run(tmp_path):
    """Three honest device nodes and a registered liar listing 4x an honest node's users
    (fabricated, plausible ratings) that negates and scales its clients' deltas 1000-fold;
    ``fit(name, params, share, liar=True)`` -> (result, held-out RMSE on the honest users)."""
    from fedcf.eval.protocols import federated_recon_eval

    nodes, catalog = _device_files(tmp_path, 3)
    full = load_dataset(DATA)
    rng = np.random.default_rng(0)
    fake_users = np.repeat(np.arange(10**6, 10**6 + 320), 20)
    fake = pd.DataFrame({"userId": fake_users, "movieId": rng.choice(full.item_ids,
                                                                     len(fake_users)),
                         "rating": rng.integers(1, 6, len(fake_users)).astype(float),
                         "timestamp": 0}).drop_duplicates(["userId", "movieId"])
    (tmp_path / "liar").mkdir()
    fake.to_csv(tmp_path / "liar" / "ratings.csv", index=False)
    liar = {"data-path": str(tmp_path / "liar" / "ratings.csv")}
    flip = {BIG + 3: _replace_upload("d_Q", lambda a: a * -1e3)}

    def fit(name, params, share=0.4, with_liar=True):
        grid = FakeGrid(nodes + [liar], {}, tamper=flip) if with_liar else \
            FakeGrid(nodes, run_config={})
        res = serve(grid, Settings(params=dict(params), eval_fraction=0.0, catalog_path=catalog,
                                   max_node_share=share,
                                   model_path=str(tmp_path / f"{name}.npz")).check())
        model = FedReconMF.load(res["model_path"])
        return res, federated_recon_eval(model, full, seed=0, support_fraction=0.5)["rmse"]
    return fit


def test_fabricated_users_are_capped_so_the_median_clip_stays_honest(tmp_path):
    """Uncapped (max-node-share=1) the liar of ``_fabricated_run`` holds most of each cohort,
    the median clip follows its deltas and the held-out RMSE degrades; at the default cap (40 %
    of the users) the median stays the honest clients', so the clip stays near the honest
    run's and the RMSE moves much less (not nothing: the liar's 40 % still send negated
    deltas, each within the honest clip). The node is named."""
    fit = _fabricated_run(tmp_path)
    params = {**PARAMS, "n_rounds": 6, "eval_every": 0}
    runs = {"honest": fit("honest", params, with_liar=False), "capped": fit("capped", params),
            "uncapped": fit("uncapped", params, 1.0)}
    capped, uncapped = runs["capped"][0], runs["uncapped"][0]
    assert [r["node"] for r in capped["refusals"] if r["stage"] == "directory"] == [BIG + 3]
    assert not [r for r in uncapped["refusals"] if r["stage"] == "directory"]
    clip = {k: np.median([h["clip_norm"] for h in r["history"]]) for k, (r, _) in runs.items()}
    rmse = {k: v for k, (_, v) in runs.items()}
    assert clip["capped"] < 3 * clip["honest"] < clip["uncapped"] / 30, clip
    assert rmse["capped"] - rmse["honest"] < (rmse["uncapped"] - rmse["honest"]) / 3, rmse


@pytest.mark.parametrize("seed", [0, 2])
def test_fabricated_users_capped_under_a_row_clipped_median_cost_under_one_percent(tmp_path,
                                                                                    seed):
    """Against the same liar, the cap plus a coordinate median whose clients' rows are clipped
    (``{"name": "median", "row_clip": 1.0}``) keeps the held-out RMSE within 1 % of the honest
    run's with the same aggregator: the liar's 40 % cannot move a median past the honest
    majority, and a clipped row cannot carry a 1000-fold delta on an item few clients touch.
    (The default clip at 3x the median norm lets the capped liar's negated deltas through,
    each within the clip, and the damage then depends on the seed.)"""
    fit = _fabricated_run(tmp_path)
    params = {**PARAMS, "n_rounds": 6, "eval_every": 0, "random_state": seed,
              "aggregator": {"name": "median", "row_clip": 1.0}}
    _, honest = fit("honest", params, with_liar=False)
    res, capped = fit("capped", params)
    assert [r["node"] for r in res["refusals"] if r["stage"] == "directory"] == [BIG + 3]
    assert capped < 1.01 * honest, (capped, honest)


LINEAR = [{"name": "mean"}, {"name": "norm-clipped", "clip_norm": 0.3}, DP]


@pytest.mark.parametrize("aggregator", LINEAR, ids=["mean", "clipped", "dp"])
def test_a_linear_aggregate_gets_each_nodes_sums_never_an_upload(tmp_path, aggregator):
    """For a linear aggregate each node applies its public recipe to its clients and sends
    their sums per reduce group and item: no upload crosses, and the model is the in-process
    one up to float rounding (a group's clients are added node by node)."""
    params = {**PARAMS, "clients_per_round": 150, "rating_scale": [1.0, 5.0],
              "aggregator": aggregator}
    grid = FakeGrid(partitions(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # DP's seeded test noise says so
        res, model = run(grid, tmp_path, params)
        ref, _ = reference(params)
    np.testing.assert_allclose(model.item_factors_, ref.item_factors_, rtol=1e-4, atol=1e-6)
    ups = [r for kind, d, r in grid.log if kind == "train" and d == "up"]
    assert ups and all(r == {"sums": sorted(SUM_FIELDS)} for r in ups)
    downs = [r for kind, d, r in grid.log if kind == "train" and d == "down"]
    assert all("recipe" in r["config"] for r in downs)
    assert res["refusals"] == []


def _edit_sums(field, change):
    return _edit_reply("sums", field, change)


def _add_column(k, amount):
    def change(stats):
        stats = stats.copy()
        stats[:, k] += amount
        return stats
    return change


@pytest.mark.parametrize("tamper, reason", [
    (_edit_sums("s_Q", lambda a: a * 1e3), "longer than 0.3 times"),
    (_edit_sums("s_b", lambda a: np.full_like(a, np.inf)), "must be finite"),
    (_edit_sums("stats", _add_column(0, 100.0)), "weights exceed"),
    (_edit_sums("stats", _add_column(1, 1.0)), "do not count the clients"),
    (_edit_sums("items", lambda a: a + 10_000), "items outside"),
    (_edit_sums("groups", lambda a: np.full_like(a, a[0])), "twice"),
    (_edit_sums("stat_groups", lambda a: (a + 1) % 64), "one per reduce group"),
    (_edit_sums("worst_client", lambda a: a + 100_000), "worst client"),
    (_edit_sums("s_Q", lambda a: a[:, :-1]), "s_Q has shape"),
])
def test_sums_no_set_of_its_clients_could_send_are_refused(tmp_path, tamper, reason):
    """A node's sums are checked against what its clients could send one by one: their reduce
    groups, counts and weights, the catalog, finiteness, and the clip (a node moves the model
    no more than C per unit of its clients' weight). The node is named; the round goes on."""
    params = {**PARAMS, "aggregator": {"name": "norm-clipped", "clip_norm": 0.3}}
    res, model = run(FakeGrid(partitions(4), tamper={BIG + 1: tamper}), tmp_path, params)
    refused = [r for r in res["refusals"] if r["stage"].startswith("round")]
    assert refused and all(reason in r["reason"] and r["node"] == BIG + 1 for r in refused)
    assert len(res["history"]) == PARAMS["n_rounds"] and np.isfinite(model.item_factors_).all()


@pytest.mark.parametrize("recipe, reason", [
    ("{", "recipe is not a JSON object"),
    ('{"clip": 1.0, "cap": null, "weighted": true}', "recipe is not a JSON object"),
    ('{"clip": NaN, "cap": null, "weighted": true, "exponent": 1}', "clip=nan"),
    ('{"clip": -1, "cap": null, "weighted": false, "exponent": 1}', "clip=-1.0"),
    ('{"clip": 1, "cap": 0, "weighted": false, "exponent": 1}', "cap=0.0"),
    ('{"clip": 1, "cap": null, "weighted": true, "exponent": Infinity}', "exponent=inf"),
])
def test_a_node_refuses_a_recipe_it_must_not_compute_with(recipe, reason):
    from fedcf.flower.node import train

    own = load_dataset(DATA).subset_users(np.arange(4))
    glob = arrays(Q=np.zeros((own.n_items, 6), np.float32), b=np.zeros(own.n_items, np.float32),
                  ids=np.array([1, 0]))
    config = {"users": [int(u) for u in own.user_ids], "clients": [0, 1, 2, 3], "mu": 3.0,
              "params": json.dumps({"n_factors": 6})}
    assert set(train(own, {**config, "recipe": '{"clip": 1, "cap": null, "weighted": true, '
                                               '"exponent": 1}'}, glob)) == {"sums"}
    with pytest.raises(ValueError, match=reason):
        train(own, {**config, "recipe": recipe}, glob)


def test_node_sums_are_the_aggregators_partial_sums():
    """The recipe a node applies gives the numbers the aggregator itself computes, bit for bit
    (weighted mean, norm clipping, DP with a weight cap)."""
    from fedcf.federated import DPGaussianMean, NormClippedMean, RoundHyperparams, WeightedMean
    from fedcf.flower.node import client_outputs, node_sums

    own = load_dataset(DATA).subset_users(np.arange(12))
    rng = np.random.default_rng(0)
    glob = arrays(Q=rng.normal(0, 0.1, (own.n_items, 6)).astype(np.float32),
                  b=np.zeros(own.n_items, np.float32), ids=np.array([1, 3]))
    out = client_outputs(own, {"users": [int(u) for u in own.user_ids],
                               "clients": list(range(0, 120, 10)), "mu": 3.0,
                               "params": json.dumps({"n_factors": 6})}, glob)
    hp = RoundHyperparams(1.0, {}, weight_exponent=0.5)
    for agg in (WeightedMean(), NormClippedMean(0.05), DPGaussianMean(0.05, 1.0, weight_cap=3)):
        want = agg.partials(out, hp)
        got = node_sums(out, {**agg.node_recipe(), "exponent": 0.5})
        for f in ("groups", "items", "s_Q", "s_b", "stat_groups", "stats", "worst_client"):
            np.testing.assert_array_equal(getattr(got, f), getattr(want, f))


class ChurnGrid(FakeGrid):
    """A grid whose connected nodes change by round: ``online(t)`` -> node ids connected when
    round t starts (read from the groups of the messages sent so far)."""

    def __init__(self, node_configs, online, **kw):
        super().__init__(node_configs, **kw)
        self.online, self.last_round = online, -1

    def get_node_ids(self):
        return [n for n in self.online(self.last_round + 1) if n in self.nodes]

    def send_and_receive(self, messages, *, timeout=None):
        live = set(self.get_node_ids())
        for m in messages:
            if m.metadata.group_id.startswith("round-"):
                self.last_round = max(self.last_round, int(m.metadata.group_id.split("-")[1]))
        up = [m for m in messages if int(m.metadata.dst_node_id) in live]
        return super().send_and_receive(up, timeout=timeout)


def test_each_round_samples_the_connected_nodes_and_a_returning_node_rejoins(tmp_path):
    """Churn: a node leaves after round 1 and comes back with a new id (same data) for round 3.
    Rounds 2 sample only users of connected nodes — nobody is asked who cannot answer — and
    from round 3 the returning node serves its users again: the model is the in-process fit
    with the same availability, bit for bit; a newcomer claiming users a live node serves is
    refused."""
    from fedcf.eval.splits import user_split_indices
    from fedcf.federated.algorithms.base import run_seed

    parts = partitions(3)
    back = BIG + 7  # node 2's device, restarted: a new node id, the same partition
    nodes = parts + [parts[2], parts[0]]  # BIG + 3: a rogue copy of node 0's partition

    def online(t):
        return [BIG, BIG + 1, BIG + 2] if t <= 1 else [BIG, BIG + 1] if t == 2 else \
            [BIG, BIG + 1, back, BIG + 4]

    grid = ChurnGrid(nodes, online)
    grid.nodes = {BIG: parts[0], BIG + 1: parts[1], BIG + 2: parts[2], back: parts[2],
                  BIG + 4: parts[0]}
    grid.state = {n: RecordDict() for n in grid.nodes}
    params = {**PARAMS, "eval_every": 0}
    res, model = run(grid, tmp_path, params)
    # the in-process twin: the same training users, available as their partition is online
    full = load_dataset(DATA)
    est = FedReconMF(**Settings(params=dict(params)).check().params)
    train, _ = user_split_indices(full.n_users, (0.8, 0.2), run_seed(est.random_state))
    pos = np.arange(full.n_users)

    def available(t):
        live = [0, 1, 2] if t != 2 else [0, 1]
        return full.user_ids[train][np.isin(pos[train] % 3, live)]

    ref = est.fit(full.subset_users(train), availability=available)
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    reasons = [r["reason"] for r in res["refusals"]]
    assert any("claims users a connected node serves" in r for r in reasons), reasons
    assert not any("no reply" in r or "Node Unavailable" in r for r in reasons), reasons


@pytest.mark.parametrize("aggregator,record,field", [
    # (the plain mean's node sums that far off the others are refused before they count:
    # test_one_wild_node_is_clipped_by_default)
    ({"name": "trimmed-mean", "beta": 0.0}, "upload", "d_Q")])  # every upload
def test_a_divergence_caused_by_one_node_names_the_node(tmp_path, aggregator, record, field):
    """With an unclipped aggregate of uploads, one node sending 10^30-scaled deltas makes the
    run diverge: the error names that node and what was measured (it used to blame
    server_learning_rate)."""
    wild = {BIG + 1: _edit_reply(record, field, lambda a: a * 1e30)}
    with pytest.raises(FloatingPointError, match=rf"one node's uploads dwarf.*node {BIG + 1}'s "
                                                 r"updates had norm"):
        run(FakeGrid(partitions(4), tamper=wild), tmp_path, {**PARAMS, "aggregator": aggregator})


@pytest.mark.parametrize("aggregator", [None, {"name": "secure", "min_cohort": 2}])
def test_an_implicit_model_over_messages_is_the_in_process_model(tmp_path, aggregator):
    """fedcf-model="fedrecon-implicit": the nodes run FedReconImplicitMF's client program from
    the message's parameters (the ``model`` field names it), plain or under secure
    aggregation; the fitted model is the in-process one bit for bit."""
    from fedcf import FedReconImplicitMF, load_model

    params = {"n_factors": 4, "n_rounds": 3, "clients_per_round": 30, "random_state": 0,
              "aggregator": aggregator}
    settings = Settings(params=dict(params), model="fedrecon-implicit", eval_fraction=0.0,
                        model_path=str(tmp_path / "m.npz")).check()
    res = serve(FakeGrid(partitions(3)), settings)
    model = load_model(res["model_path"])
    ref, evaluation, _ = fit_in_process(params, DATA, 0.0, model="fedrecon-implicit")
    assert isinstance(model, FedReconImplicitMF) and evaluation is None
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    assert [h["loss"] for h in res["history"]] == [h["loss"] for h in ref.history_]
    assert res["params"]["model"] == "fedrecon-implicit" and res["refusals"] == []


@pytest.mark.parametrize("kw, match", [
    (dict(model="centralized"), "a Flower run trains estimators that declare their client"),
    (dict(model="nope"), "fedcf-model=.nope.: .nope. is not a registered estimator"),
    (dict(model="fedrecon-implicit", eval_fraction=0.2), "eval-fraction=0.2 with fedcf-model"),
    (dict(model="fedrecon-implicit", params={"rating_scale": [1, 5]}),
     "FedReconImplicitMF has no parameter 'rating_scale'"),
])
def test_a_flower_model_setting_is_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        Settings(**{"params": {}, **kw}).check()


def test_a_node_refuses_parameters_its_model_does_not_take():
    """The device checks what it is asked to compute with: an unknown model, or a parameter the
    model does not take, is refused."""
    import json

    from fedcf.flower.wire import client_estimator

    with pytest.raises(ValueError, match="is not one"):
        client_estimator(json.dumps({"model": "centralized"}))
    with pytest.raises(ValueError, match="FedReconImplicitMF has no parameter 'rating_scale'"):
        client_estimator(json.dumps({"model": "fedrecon-implicit", "rating_scale": [1, 5]}))


def test_a_new_estimator_runs_over_flower_unchanged(custom_estimator, tmp_path):
    """examples/custom_estimator.py's NormalInitMF, registered on the server and the nodes,
    trains over Flower messages (run config fedcf-model) as in process, with nothing in the
    Flower app written for it; the saved model loads as that class."""
    from fedcf import load_model

    settings = Settings(params=dict(PARAMS), model="normal-init-mf", eval_fraction=0.2,
                        model_path=str(tmp_path / "m.npz")).check()
    res = serve(FakeGrid(partitions(3)), settings)
    ref, ref_eval, _ = fit_in_process(PARAMS, DATA, 0.2, model="normal-init-mf")
    model = load_model(res["model_path"])
    assert type(model) is custom_estimator and res["params"]["model"] == "normal-init-mf"
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    assert res["recon_eval"]["rmse"] == pytest.approx(ref_eval["rmse"], rel=1e-12)


# ------------------------------------------------------------------ a server that deviates
def test_nodes_refuse_a_threshold_below_their_policy(tmp_path, monkeypatch, caplog):
    """A ServerApp that asks for t = 2 of 30 share holders (two colluders would rebuild a
    client's secrets): every device refuses to share, so no round is unmasked, and each
    device's log names the rule; nothing was aggregated."""
    from fedcf.federated import SecureAggregation

    monkeypatch.setattr(SecureAggregation, "threshold_for", lambda self, m: 2)
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        res, model = run(FakeGrid(partitions(3)), tmp_path, SEC_PARAMS)
    assert all(h["secagg_lost_round"] for h in res["history"])
    assert "device refused (threshold)" in caplog.text


def _first_begin(tmp_path):
    """(the grid, a begin message of an honest secure round, the node it went to)."""
    grid = FakeGrid(partitions(3))
    run(grid, tmp_path, {**SEC_PARAMS, "n_rounds": 1})
    msg = next(m for m, _ in grid.sent if m.metadata.message_type == "train.secagg"
               and m.content["config"]["step"] == "begin")
    return grid, msg, int(msg.metadata.dst_node_id)


def test_a_node_takes_its_policy_from_its_own_config(tmp_path, caplog):
    """A node whose own config asks for DP (noise-multiplier) refuses a round without noise,
    whatever the message says; the same message on a node without that rule is answered."""
    from fedcf.flower.node import node_data
    from fedcf.flower.secure import node_step

    grid, msg, node = _first_begin(tmp_path)
    own = node_data(grid.run_config, grid.nodes[node])
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        reply = node_step(own, msg.content, RecordDict(),
                          {**grid.nodes[node], "noise-multiplier": 1.0})
    assert len(reply["keys.client"]) == 0
    assert "device refused (noise_multiplier)" in caplog.text
    assert len(node_step(own, msg.content, RecordDict(), grid.nodes[node])["keys.client"])


def test_a_node_answers_one_begin_per_round_and_model(tmp_path, caplog):
    """The difference attack over messages: the server replays a round's begin (same model,
    same round, a fresh session, the cohort without one user) — the node answers with no
    client, and logs why."""
    from fedcf.flower.node import node_data
    from fedcf.flower.secure import node_step

    grid, msg, node = _first_begin(tmp_path)
    config = dict(msg.content["config"])
    config.update(session=os.urandom(16), users=list(config["users"])[1:],
                  clients=list(config["clients"])[1:])
    content = RecordDict({**{k: v for k, v in msg.content.items() if k != "config"},
                          "config": ConfigRecord(config)})
    own = node_data(grid.run_config, grid.nodes[node], grid.state[node])
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        reply = node_step(own, content, grid.state[node], grid.nodes[node])
    assert len(reply["keys.client"]) == 0 and len(reply["adverts.client"]) == 0
    assert "device refused (one_answer)" in caplog.text


# ------------------------------------------------------------------ nodes that lie
def _claim(user_sums):
    """A node's directory reply with its first user's (Σv, Σv², min, max) replaced."""
    def tamper(msg, reply):
        if msg.metadata.message_type != "query" or reply.has_error():
            return reply
        rec = record_arrays(reply.content["users"])
        rec["sums"] = rec["sums"].copy()
        rec["sums"][0] = user_sums(rec["counts"][0]) if callable(user_sums) else user_sums
        return Message(RecordDict({"users": arrays(**rec)}), reply_to=msg)
    return tamper


@pytest.mark.parametrize("params, sums, reason", [
    (PARAMS, [1e6, 1e12, -1e6, 1e6], "far beyond the other nodes'"),  # no public scale
    ({**PARAMS, "rating_scale": [1.0, 5.0]}, [1e6, 1e12, -1e6, 1e6],
     "outside the public rating scale"),
    (PARAMS, [50.0, 60.0, 1.0, 2.0], "mean is outside its [min, max]"),
    (PARAMS, lambda n: [2.5 * n, 1.0, 1.0, 4.0], "Σv² is impossible"),
])
def test_a_node_whose_claims_cannot_be_true_is_refused_by_name(tmp_path, params, sums, reason):
    """One node claiming one user with Σv = 10⁶ and ratings in ±10⁶ moved μ from 3.5 to 14.7
    and the scale to ±10⁶: such a node is refused by name at the directory, and μ and the
    scale are the honest nodes'."""
    grid = FakeGrid(partitions(4), tamper={BIG + 2: _claim(sums)})
    res, model = run(grid, tmp_path, params)
    refused = [r for r in res["refusals"] if r["stage"] == "directory"]
    assert refused and reason in refused[0]["reason"]
    assert all(r["node"] == BIG + 2 for r in refused)  # later rounds: its users stay out
    asked = [m for m, _ in grid.sent if int(m.metadata.dst_node_id) == BIG + 2]
    assert len(asked) == 1  # refused once, never asked again (not re-queried every round)
    assert 1.0 <= model.global_mean_ <= 5.0
    assert res["n_nodes"] == 4 and res["n_train_users"] + res["n_eval_users"] < 240


def test_one_user_two_nodes_claim_costs_only_that_user(tmp_path):
    """A node that also lists one user of another node: that user is left out of both (who
    is honest cannot be told), and both nodes keep every other user — before, the node with
    the higher id lost all of its users."""
    stolen = int(partition(DATA, {"partition-id": 0, "num-partitions": 3}).user_ids[0])

    def overlap(msg, reply):
        if msg.metadata.message_type != "query" or reply.has_error():
            return reply
        rec = record_arrays(reply.content["users"])
        order = np.argsort(np.append(rec["users"], stolen))
        rec["users"] = np.append(rec["users"], stolen)[order]
        rec["counts"] = np.append(rec["counts"], rec["counts"][0])[order]
        rec["sums"] = np.vstack([rec["sums"], rec["sums"][:1]])[order]
        return Message(RecordDict({"users": arrays(**rec)}), reply_to=msg)

    res, _ = run(FakeGrid(partitions(3), tamper={BIG + 1: overlap}), tmp_path)
    contested = [r for r in res["refusals"] if "another node also lists" in r["reason"]]
    assert {r["node"] for r in contested} == {BIG, BIG + 1}
    assert all(r["reason"].startswith("1 of its users") for r in contested)
    assert res["n_nodes"] == 3 and res["n_train_users"] + res["n_eval_users"] == 240 - 1


class RestartGrid(FakeGrid):
    """A grid whose node ``node`` restarts (keeps its id, loses its state, as a SuperNode under
    node authentication) just before its ``at``-th training message."""

    def __init__(self, node_configs, node, at, **kw):
        super().__init__(node_configs, **kw)
        self.node, self.at, self.seen = node, at, 0

    def send_and_receive(self, messages, *, timeout=None):
        for msg in messages:
            if int(msg.metadata.dst_node_id) == self.node and \
                    msg.metadata.message_type == "train":
                self.seen += 1
                if self.seen == self.at:
                    self.state[self.node] = RecordDict()
        return super().send_and_receive(messages, timeout=timeout)


def test_a_restarted_device_node_loses_no_round(tmp_path):
    """A node holding its own data restarts between rounds, keeping its id, and no round
    noticed: its first message after the restart fails ("no item catalog yet": its state is
    gone); the server sends it the catalog and the same message again within the round, so
    its clients train in every round — the model is the one without the restart."""
    nodes, catalog = _device_files(tmp_path, 3)
    grid = RestartGrid(nodes, BIG + 1, at=2, run_config={})
    params = {**PARAMS, "n_rounds": 4}
    res, model = run(grid, tmp_path, params, catalog_path=catalog)
    lost = [r for r in res["refusals"] if "no item catalog yet" in r["reason"]]
    assert len(lost) == 1 and lost[0]["node"] == BIG + 1 and lost[0]["stage"] == "round 1"
    to_it = [(m.metadata.message_type, not r.has_error()) for m, r in grid.sent
             if int(m.metadata.dst_node_id) == BIG + 1 and m.metadata.message_type != "evaluate"]
    assert to_it == [("query", True), ("train", True), ("train", False), ("query", True),
                     ("train", True), ("train", True), ("train", True)], to_it
    assert all(h["clients_used"] + h["clients_empty"] == h["clients_sampled"]
               for h in res["history"])
    _, honest = run(FakeGrid(nodes, run_config={}), tmp_path / "h", params,
                    catalog_path=catalog)
    np.testing.assert_array_equal(model.item_factors_, honest.item_factors_)


def test_a_stalled_node_sits_out_a_growing_back_off(tmp_path):
    """A node that gives no reply in time is not asked for 1, then 2 rounds (then 4, 8): over
    six rounds it costs three deadlines, not six; the others train every round."""
    asked = []

    def stalled(msg, reply):
        if msg.metadata.message_type != "train":
            return reply
        asked.append(msg)
        return None

    grid = FakeGrid(partitions(4), tamper={BIG + 1: stalled})
    res, model = run(grid, tmp_path, {**PARAMS, "n_rounds": 6})
    missed = [r for r in res["refusals"] if r["node"] == BIG + 1 and "no reply" in r["reason"]]
    assert len(asked) == len(missed) == 3  # rounds 1, 3 and 6
    assert all(h["clients_used"] > 0 for h in res["history"])


def test_a_node_that_crashed_in_a_round_gets_the_catalog_before_it_works_again(tmp_path):
    """A device that dies mid-round (no reply) and comes back under its old id without its
    state: after its back-off the server sends it the directory query with the catalog before
    the round's message, so it never fails with "no item catalog yet" and trains again."""
    nodes, catalog = _device_files(tmp_path, 3)
    trains = []

    def crash(msg, reply):
        if msg.metadata.message_type == "train":
            trains.append(msg)
            if len(trains) == 2:  # dies in its second round, restarts empty
                grid.state[BIG + 1] = RecordDict()
                return None
        return reply

    grid = FakeGrid(nodes, run_config={}, tamper={BIG + 1: crash})
    res, _ = run(grid, tmp_path, {**PARAMS, "n_rounds": 5}, catalog_path=catalog)
    assert not [r for r in res["refusals"] if "no item catalog" in r["reason"]], res["refusals"]
    to_it = [(m.metadata.message_type, r.has_error()) for m, r in grid.sent
             if int(m.metadata.dst_node_id) == BIG + 1 and m.metadata.message_type != "evaluate"]
    # directory, round 1, (round 2: no reply), round 3 sat out, re-query, rounds 4 and 5
    assert to_it == [("query", False), ("train", False), ("query", False), ("train", False),
                     ("train", False)], to_it
    assert len(trains) == 4


class AwayGrid(FakeGrid):
    """A grid whose node ``node`` is not connected for one look at the nodes after its first
    training message, and comes back without its state (a SuperNode the SuperLink saw leave)."""

    def __init__(self, node_configs, node, **kw):
        super().__init__(node_configs, **kw)
        self.node, self.looks = node, 0

    def get_node_ids(self):
        trained = any(int(m.metadata.dst_node_id) == self.node and
                      m.metadata.message_type == "train" for m, _ in self.sent)
        if trained:
            self.looks += 1
            if self.looks == 1:
                self.state[self.node] = RecordDict()
                return [n for n in self.nodes if n != self.node]
        return list(self.nodes)


def test_a_node_that_left_and_came_back_gets_the_catalog_again(tmp_path):
    nodes, catalog = _device_files(tmp_path, 3)
    grid = AwayGrid(nodes, BIG + 2, run_config={})
    res, _ = run(grid, tmp_path, {**PARAMS, "n_rounds": 4}, catalog_path=catalog)
    assert not [r for r in res["refusals"] if "no item catalog" in r["reason"]], res["refusals"]
    kinds = [m.metadata.message_type for m, _ in grid.sent
             if int(m.metadata.dst_node_id) == BIG + 2]
    assert kinds.count("query") == 2 and kinds.count("train") == 3  # one round away


def test_a_node_works_only_the_current_round(tmp_path):
    """A stalled node catching up on its queue: a training message for a round older than one
    it already worked is refused, naming both rounds."""
    grid = FakeGrid(partitions(3))
    run(grid, tmp_path, {**PARAMS, "n_rounds": 3})
    old = next(m for m, _ in grid.sent if m.metadata.message_type == "train")
    node = int(old.metadata.dst_node_id)
    ctx = Context(1, node, grid.nodes[node], grid.state[node], grid.run_config)
    reply = grid.app(Message(old.content, dst_node_id=node, message_type="train"), ctx)
    assert reply.has_error() and "a stale message for round 0" in reply.error.reason
    assert "has worked round 2" in reply.error.reason


def test_a_prepared_deployment_names_only_files_it_wrote(tmp_path, capsys):
    """``flower_deploy.py --prepare`` (the manual's walkthrough) writes the certificates, node
    keys, devices' files, catalog and app, and prints commands that use them: each path in the
    commands exists, every process binds to 127.0.0.1, and each node is registered by its key
    before it starts."""
    deploy = load_script("flower_deploy")
    deploy.main(["--prepare", "--device-data", "--nodes", "2", "--folder", str(tmp_path)])
    cmds = capsys.readouterr().out.strip().splitlines()
    assert cmds[0] == f"export FLWR_HOME={tmp_path / 'flwr_home'}"
    assert (tmp_path / "flwr_home" / "config.toml").read_text().count("127.0.0.1:9093") == 1
    paths = [w.strip("'\"").split("=", 1)[-1].strip("'\"") for c in cmds for w in c.split()
             if str(tmp_path) in w]
    missing = [p for p in paths if not Path(p).exists() and not p.endswith("state.db")]
    assert not missing, missing
    for k in range(2):
        reg = next(i for i, c in enumerate(cmds) if f"node{k}.pub" in c)
        start = next(i for i, c in enumerate(cmds) if f"--auth-supernode-private-key "
                     f"{tmp_path}/credentials/node{k} " in c)
        assert reg < start and f"device{k}/ratings.csv" in cmds[start]
    assert all("--host 127.0.0.1" in c for c in cmds if "flower-super" in c)
    assert cmds[-1].endswith("local --stream")
    catalog = (tmp_path / "devices" / "catalog.txt").read_text().split()
    assert len(catalog) > 0 and (tmp_path / "app" / "pyproject.toml").exists()


@pytest.mark.parametrize("argv, match", [
    (["--scenario", "liar"], "--scenario needs --device-data"),
    (["--scenario", "fabricated", "--device-data"], "--scenario fabricated needs --warm"),
    (["--scenario", "lying"], "invalid choice"),
])
def test_a_deployment_scenario_names_what_it_needs(argv, match, capsys):
    deploy = load_script("flower_deploy")
    with pytest.raises(SystemExit) as e:
        deploy.main(argv)
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_a_prepared_warm_deployment_starts_one_warm_process_per_node(tmp_path, capsys):
    """``--prepare --warm``: each SuperNode starts with ``--isolation process`` (no process
    per message) and is followed by its warm process, on that node's runtime API port."""
    deploy = load_script("flower_deploy")
    deploy.main(["--prepare", "--device-data", "--warm", "--nodes", "2", "--folder",
                 str(tmp_path)])
    cmds = capsys.readouterr().out.strip().splitlines()
    nodes = [i for i, c in enumerate(cmds) if "flower-supernode" in c]
    assert len(nodes) == 2 and all("--isolation process" in cmds[i] for i in nodes)
    for i in nodes:
        port = cmds[i].split("--port ")[1].split()[0]
        worker = next(c for c in cmds[i + 1:] if "fedcf.flower.warm" in c)
        assert f"--runtime-api-address 127.0.0.1:{port} " in worker + " "


def test_the_in_process_reference_leaves_out_nodes_that_would_not_report():
    """fit_in_process(partitions=...) scores ReconEval over the users the simulated devices
    report on: the users of nodes holding fewer evaluation users than their min-cohort are
    left out, as the devices leave them out."""
    _, everyone, _ = fit_in_process(PARAMS, DATA, 0.2)
    _, reported, _ = fit_in_process(PARAMS, DATA, 0.2, device_policy=DevicePolicy(min_cohort=10),
                                    partitions=5)
    assert 0 < reported["n_ratings"] < everyone["n_ratings"]
    with pytest.raises(ValueError, match="partitions must be a whole number"):
        fit_in_process(PARAMS, DATA, 0.2, partitions=0)
