"""A warm device's runtime-API client (fedcf.flower.runtime) against a real loopback HTTP server:
Flower's paths and headers, the task's token, kept-alive connections, Flower's retry policy, and
the pulls and pushes of a message's objects without thread pools."""

import http.server
import threading

import pytest

pytest.importorskip("flwr")

from fedcf.flower import runtime  # noqa: E402


class Server:
    """A loopback HTTP/1.1 server answering every POST with ``reply()`` (status, body); it
    records (path, headers, connection port) and can drop a connection after each answer."""

    def __init__(self, tls=None):
        self.seen, self.statuses, self.drop, self.hang = [], [], False, False
        self.body = b""
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - the stdlib's name
                self.rfile.read(int(self.headers["content-length"]))
                outer.seen.append((self.path, dict(self.headers), self.client_address[1]))
                if outer.hang:
                    threading.Event().wait(1.0)
                status = outer.statuses.pop(0) if outer.statuses else 200
                try:
                    self.send_response(status)
                    self.send_header("content-length", str(len(outer.body)))
                    self.end_headers()
                    self.wfile.write(outer.body)
                except BrokenPipeError:  # the client gave up (its read timed out)
                    self.close_connection = True
                    return
                self.close_connection = outer.drop  # without saying so: a stale kept socket

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:  # (certificate, key) files
            import ssl
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    try:
        yield s
    finally:
        s.close()


def _task_client(server, token_value="tok-1"):
    token = runtime.TaskToken()
    token.value = token_value
    return runtime.runtime_client(server.address, insecure=True, certificates=None,
                                  token=token), token


def test_requests_use_flowers_paths_headers_and_the_tasks_token_on_one_connection(server):
    from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
        AcquireTaskRequest,
        PullTaskInputRequest,
        PullTaskInputResponse,
    )
    from flwr.supercore.constant import TASK_TOKEN_HEADER

    server.body = PullTaskInputResponse(task_id=7).SerializeToString()
    client, token = _task_client(server)
    try:
        assert [client.PullTaskInput(PullTaskInputRequest()).task_id for _ in range(3)] == [7] * 3
    finally:
        client.close()
    paths = {p for p, _, _ in server.seen}
    assert paths == {"/v1/runtime/pull-task-input"}
    headers = {k.lower(): v for k, v in server.seen[0][1].items()}
    assert headers[TASK_TOKEN_HEADER.lower()] == "tok-1"
    assert headers["content-type"] == "application/protobuf"
    assert any("version" in k for k in headers), headers  # Flower's runtime-version metadata
    assert len({port for _, _, port in server.seen}) == 1  # one kept-alive connection
    assert token.requests == 3
    # the executor's own client (no token) sends none
    acq = runtime.runtime_client(server.address, insecure=True, certificates=None)
    try:
        acq.AcquireTask(AcquireTaskRequest())
    finally:
        acq.close()
    assert TASK_TOKEN_HEADER.lower() not in {k.lower() for k in server.seen[-1][1]}


def test_a_task_request_without_a_token_is_never_sent(server):
    from flwr.proto.runtime_pb2 import PullTaskInputRequest  # pylint: disable=E0611

    client, _ = _task_client(server, token_value="")
    try:
        with pytest.raises(RuntimeError, match="without its token"):
            client.PullTaskInput(PullTaskInputRequest())
    finally:
        client.close()
    assert server.seen == []


def test_a_connection_the_server_dropped_is_replaced_not_failed(server):
    """Without Flower's retry around it: a kept socket the server closed while idle is not
    reused (it would fail the request)."""
    server.drop = True
    host, port = server.address.rsplit(":", 1)
    sender = runtime.KeptAlive(host, int(port))
    try:
        for _ in range(3):
            assert sender.post("/x", b"", {}, 5.0)[0] == 200
            threading.Event().wait(0.05)  # the server's close reaches the kept socket
    finally:
        sender.close()
    assert len(server.seen) == 3 and len({port for _, _, port in server.seen}) == 3


def test_flowers_retry_policy_applies_and_a_hard_error_is_raised(server):
    import httpx
    from flwr.proto.runtime_pb2 import PullTaskInputRequest  # pylint: disable=E0611

    server.statuses = [503, 200]  # Flower retries a 503 ...
    client, _ = _task_client(server)
    try:
        client.PullTaskInput(PullTaskInputRequest())
        assert len(server.seen) == 2
        server.statuses = [400]  # ... and gives up on a 400, as an httpx status error
        with pytest.raises(httpx.HTTPStatusError) as e:
            client.PullTaskInput(PullTaskInputRequest())
        assert e.value.response.status_code == 400
    finally:
        client.close()


def test_transport_failures_are_the_httpx_errors_flowers_retry_knows(server):
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens there
    with pytest.raises(httpx.ConnectError, match="/x"):
        runtime.KeptAlive("127.0.0.1", dead).post("/x", b"", {}, 1.0)
    server.hang = True
    host, port = server.address.rsplit(":", 1)
    with pytest.raises(httpx.ReadTimeout):
        runtime.KeptAlive(host, int(port)).post("/x", b"", {}, 0.2)


def _reply():
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 2, 3
    return Message(RecordDict({"a": ArrayRecord({"x": Array(np.arange(6.0))}),
                               "c": ConfigRecord({"k": 3})}), dst_node_id=3, message_type="train")


def _contents(message):
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
    )

    return get_object_tree(message), {i: o.deflate()
                                      for i, o in get_all_nested_objects(message).items()}


def test_pull_tree_asks_again_for_an_object_not_yet_there_and_inflates_the_message(monkeypatch):
    from flwr.app import Message
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    monkeypatch.setattr(runtime, "RETRY", (0.001, 0.002))
    message = _reply()
    tree, contents = _contents(message)
    misses, confirmed = {tree.object_id: 2}, []

    def pull(object_id):
        if misses.get(object_id, 0):
            misses[object_id] -= 1
            raise ObjectUnavailableError(object_id)
        return contents[object_id]

    got = runtime.pull_tree(tree, pull, confirmed.append, Message)
    assert confirmed == [tree.object_id] and misses[tree.object_id] == 0
    assert got.object_id == message.object_id
    assert got.content["a"]["x"].numpy().tolist() == list(range(6))
    with pytest.raises(TypeError, match="expected a ConfigRecord"):
        from flwr.app import ConfigRecord
        runtime.pull_tree(tree, contents.__getitem__, lambda _: None, ConfigRecord)


def test_pull_tree_gives_up_on_an_object_that_never_comes(monkeypatch):
    import flwr.supercore.constant as const
    from flwr.app import Message
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectUnavailableError

    monkeypatch.setattr(runtime, "RETRY", (0.001, 0.001))
    monkeypatch.setattr(const, "PULL_MAX_TRIES_PER_OBJECT", 4)
    tree, _ = _contents(_reply())
    tries = []

    def pull(object_id):
        tries.append(object_id)
        raise ObjectUnavailableError(object_id)

    with pytest.raises(ObjectPullError):
        runtime.pull_tree(tree, pull, lambda _: None, Message)
    assert len(tries) == 4


def test_push_message_sends_the_head_then_only_the_objects_asked_for():
    from flwr.app import Message
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    reply = _reply()
    tree, contents = _contents(reply)
    wanted = [i for i in contents if i != tree.object_id][:2]
    pushed, heads = {}, []

    class Client:
        def PushMessages(self, req):  # noqa: N802 - Flower's method name
            heads.append(req)
            return type("R", (), {"objects_to_push": wanted, "session_id": "s"})()

        def PushObject(self, req):  # noqa: N802
            pushed[req.object_id] = req.object_content
            return type("R", (), {"stored": True})()

    ctx = type("Ctx", (), {"node_id": 3, "run_id": 2})()
    runtime.push_message(Client(), reply, ctx)
    assert len(heads) == 1 and heads[0].message_object_trees[0].object_id == tree.object_id
    assert set(pushed) == set(wanted)
    assert all(pushed[i] == contents[i] for i in wanted)
    again = inflate_object_from_contents(tree.object_id, dict(contents), keep_object_contents=True)
    assert isinstance(again, Message)


def test_a_runtime_api_behind_tls_is_reached_with_its_ca_and_refused_with_another(tmp_path):
    import httpx
    from conftest import load_script
    from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
        PullTaskInputRequest,
        PullTaskInputResponse,
    )

    deploy = load_script("flower_deploy")
    creds = deploy.credentials(tmp_path / "a", 0)
    other = deploy.credentials(tmp_path / "b", 0)
    server = Server(tls=(creds["cert"], creds["key"]))
    try:
        server.body = PullTaskInputResponse(task_id=9).SerializeToString()
        token = runtime.TaskToken()
        token.value = "tok"
        client = runtime.runtime_client(server.address, insecure=False,
                                        certificates=creds["ca"].read_bytes(), token=token)
        try:
            assert client.PullTaskInput(PullTaskInputRequest()).task_id == 9
        finally:
            client.close()
        stranger = runtime.runtime_client(server.address, insecure=False,
                                          certificates=other["ca"].read_bytes(), token=token)
        try:  # Flower's retry policy gives up on a certificate error at once
            with pytest.raises(httpx.ConnectError, match="certificate"):
                stranger.PullTaskInput(PullTaskInputRequest())
        finally:
            stranger.close()
        assert len(server.seen) == 1
    finally:
        server.close()


def test_a_tls_client_without_its_ca_is_refused_by_name():
    with pytest.raises(ValueError, match="certificates"):
        runtime.runtime_client("127.0.0.1:9401", insecure=False, certificates=None)
