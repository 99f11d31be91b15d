"""The warm device process (fedcf.flower.warm): its checks, and how it runs a task, with the
SuperNode's runtime API played by fakes. A real SuperLink and SuperNodes answered by warm
processes: tests/test_flower.py::test_flower_deployment_superlink_and_supernodes."""

import json

import pytest

pytest.importorskip("flwr")

from fedcf.flower import warm  # noqa: E402


@pytest.mark.parametrize("kw, match", [
    ({"address": "127.0.0.1"}, "host:port"),
    ({"address": 9401}, "host:port"),
    ({"address": "127.0.0.1:port"}, "host:port"),
    ({"address": ":9401"}, "host:port"),
    ({"address": "127.0.0.1:70000"}, "host:port"),
    ({"address": "127.0.0.1:9401", "insecure": False}, "certificates"),
    ({"address": "127.0.0.1:9401", "poll": 0}, "poll"),
    ({"address": "127.0.0.1:9401", "poll": float("nan")}, "poll"),
])
def test_a_bad_setting_is_named(kw, match):
    address = kw.pop("address")
    with pytest.raises(ValueError, match=match):
        warm.WarmExecutor(address, **kw)


def test_a_task_request_without_its_token_is_not_sent():
    token = warm.TaskToken()
    with pytest.raises(RuntimeError, match="without its token"):
        token.header()
    token.value = "t1"
    assert token.header() == "t1" and token.requests == 1


def test_the_command_line_names_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        warm.main(["--runtime-api-address", "127.0.0.1:9401"])
    assert e.value.code == 2 and "--insecure" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        warm.main(["--runtime-api-address", "127.0.0.1:9401", "--root-certificates",
                   str(tmp_path / "nope.pem")])
    assert e.value.code == 2 and "nope.pem" in capsys.readouterr().err


class FakeRuntime:
    """The SuperNode's runtime API as a warm process sees it: tasks to hand out, and what came
    back (replies, task outputs), per token the request carried."""

    def __init__(self, tasks):
        self.tasks, self.replies, self.outputs, self.closed = list(tasks), [], [], 0

    def client(self, address, *, insecure, certificates, token=None):
        runtime = self

        class Client:
            def AcquireTask(self, req):  # noqa: N802 - Flower's method name
                from flwr.proto.runtime_pb2 import AcquireTaskResponse
                from flwr.proto.task_pb2 import Task
                if not runtime.tasks:
                    return AcquireTaskResponse()
                return AcquireTaskResponse(task=Task(task_id=1), token=runtime.tasks.pop(0))

            def SendTaskHeartbeat(self, req):  # noqa: N802
                return type("R", (), {"success": True})()

            def close(self):
                runtime.closed += 1

        c = Client()
        c.token = token
        return c


def _message(kind="train"):
    from flwr.app import Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 2, 3
    m = Message(RecordDict(), dst_node_id=3, message_type=kind)
    m.metadata.__dict__["_message_id"] = m.object_id
    return m


@pytest.fixture
def runtime(monkeypatch, tmp_path):
    """Fakes for the runtime API; every task's message is a train message; the device's cost
    log is a file of the test's."""
    from flwr.app import Context, RecordDict

    rt = FakeRuntime(["t1", "t2", "t3"])
    monkeypatch.setattr(warm, "runtime_client", rt.client)
    run = type("Run", (), {"fab_id": "fedcf/app", "fab_version": "1.0.0"})()
    fab = type("Fab", (), {"hash_str": "abc", "content": b""})()
    monkeypatch.setattr(warm, "pull_task_input", lambda client: (
        _message(), Context(run_id=2, node_id=3, node_config={}, state=RecordDict(),
                            run_config={}), run, fab))

    class Steps:  # flwr.supernode.runtime.run_clientapp's push steps
        @staticmethod
        def push_message(client, reply, context):
            rt.replies.append((client.token.value, reply))

        @staticmethod
        def push_task_output(client, context, status, details):
            rt.outputs.append((client.token.value, str(status), details))

    monkeypatch.setattr(warm, "_steps", lambda: Steps)
    monkeypatch.setenv("FEDCF_NODE_COST_LOG", str(tmp_path / "cost.jsonl"))
    rt.cost = tmp_path / "cost.jsonl"
    return rt


def test_tasks_run_in_this_process_with_the_app_loaded_once(runtime, monkeypatch, tmp_path):
    import flwr.clientapp.utils
    import flwr.common.config
    from flwr.app import Message, RecordDict

    loads, seen = [], []

    def app(message, context):
        seen.append(message.metadata.message_type)
        return Message(RecordDict(), reply_to=message)

    def loader(*a, **k):
        return lambda *key: loads.append(key) or app

    monkeypatch.setattr(flwr.clientapp.utils, "get_load_client_app_fn", loader)
    monkeypatch.setattr(flwr.common.config, "get_project_dir", lambda *key: tmp_path)
    ex = warm.WarmExecutor("127.0.0.1:9401", poll=0.001)
    assert ex.serve(max_tasks=3) == 3 and ex.failed == 0
    assert seen == ["train"] * 3 and loads == [("fedcf/app", "1.0.0", "abc")]
    assert [t for t, _ in runtime.replies] == ["t1", "t2", "t3"]
    assert [o[:2] for o in runtime.outputs] == [(t, "completed") for t in ("t1", "t2", "t3")]
    assert runtime.closed == 2  # the tasks' one client and the acquirer's
    costs = [json.loads(line) for line in runtime.cost.read_text().splitlines()]
    assert [c["message"] for c in costs] == ["train"] * 3
    assert all(c["task_seconds"] > 0 and c["status"] == "completed" for c in costs)


def test_a_handler_that_raises_sends_an_error_reply_and_the_process_goes_on(runtime):
    calls = []

    def app(message, context):
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("boom")
        from flwr.app import Message, RecordDict
        return Message(RecordDict(), reply_to=message)

    ex = warm.WarmExecutor("127.0.0.1:9401", poll=0.001)
    ex._apps[("fedcf/app", "1.0.0", "abc")] = app
    assert ex.serve(max_tasks=2) == 2 and ex.failed == 1
    first = runtime.replies[0][1]
    assert first.has_error() and "boom" in first.error.reason
    assert runtime.outputs[0][1] == "failed" and "ZeroDivisionError" in runtime.outputs[0][2]
    assert runtime.outputs[1][1] == "completed" and not runtime.replies[1][1].has_error()


def test_serve_returns_when_idle_or_stopped(runtime):
    runtime.tasks.clear()
    ex = warm.WarmExecutor("127.0.0.1:9401", poll=0.001)
    assert ex.serve(idle_seconds=0.05) == 0 and runtime.closed == 1
    ex.stop()
    assert ex.serve() == 0  # stopped before it began


def test_sigterm_stops_a_warm_process_that_is_waiting_for_its_supernode():
    """A warm process whose SuperNode is gone keeps asking (the node may come back); SIGTERM
    between tasks ends it at once with exit code 0 (it does not wait out HTTP retries)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    proc = subprocess.Popen([sys.executable, "-m", "fedcf.flower.warm", "--runtime-api-address",
                             f"127.0.0.1:{port}", "--insecure"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            out = os.read(proc.stdout.fileno(), 4096) if proc.stdout else b""
            if b"retrying" in out or b"Connection" in out:
                break
        assert proc.poll() is None, "the warm process gave up on its own"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_reply_the_supernode_no_longer_takes_fails_the_task_not_the_process(runtime, caplog,
                                                                               monkeypatch):
    """After a stall the SuperNode may have dropped the task: the push of its reply raises
    (Flower: "the push session may have expired"). The task is failed and logged; the next
    task is served."""
    from flwr.app import Message, RecordDict

    pushes = []
    steps = warm._steps()
    real = steps.push_message

    def push_message(client, reply, context):
        pushes.append(client.token.value)
        if len(pushes) == 1:
            raise RuntimeError("Failed to push object: the push session may have expired")
        return real(client, reply, context)

    monkeypatch.setattr(steps, "push_message", push_message)
    ex = warm.WarmExecutor("127.0.0.1:9401", poll=0.001)
    ex._apps[("fedcf/app", "1.0.0", "abc")] = lambda message, context: Message(
        RecordDict(), reply_to=message)
    with caplog.at_level("WARNING", logger="fedcf.flower.warm"):
        assert ex.serve(max_tasks=2) == 2
    assert ex.failed == 1 and pushes == ["t1", "t2"]
    assert "could not hand back" in caplog.text and "push session" in caplog.text
    assert [t for t, _ in runtime.replies] == ["t2"]
