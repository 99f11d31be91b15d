"""fedcf.flower.transport: a deployed round's exchange polls briskly and keeps its deadline even
when a reply's objects never arrive (a node frozen while it pushed its reply). Flower's grid is
played by a subclass of its HttpGrid that talks to no SuperLink; the real one:
tests/test_flower.py::test_flower_deployment_superlink_and_supernodes."""

import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

from flwr.supercore.inflatable.inflatable_utils import (  # noqa: E402
    ObjectPullError,
    ObjectUnavailableError,
)
from flwr.superlink.grid import http_grid  # noqa: E402

from fedcf.flower import transport  # noqa: E402


def reply(to, error=False):
    from flwr.common.constant import ErrorCode

    code = ErrorCode.MESSAGE_UNAVAILABLE if error else None
    return SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=to),
                           error=SimpleNamespace(code=code), has_error=lambda: error)


class Grid(http_grid.HttpGrid):
    """Replies to messages "m0", "m1", ...: ``ready[k]`` is the pull at which message k's reply
    is there (None: never; "frozen": listed from the first pull, its objects never arrive;
    ("frozen", n): its objects arrive at pull n)."""

    def __init__(self, ready):  # noqa: D107 - no connection
        self.ready, self.pulls = ready, 0

    def push_messages(self, messages):
        return [f"m{k}" for k in range(len(messages))]

    def pull_messages(self, message_ids):
        self.pulls += 1
        out = []
        for mid in sorted(message_ids):
            when = self.ready[int(mid[1:])]
            if isinstance(when, tuple) and self.pulls >= when[1]:
                when = 1  # the node came back and finished pushing
            if when == "frozen" or isinstance(when, tuple):  # Flower's own pull loop
                def unavailable(object_id):
                    raise ObjectUnavailableError(object_id)
                try:
                    http_grid.pull_objects(object_ids=["obj"], pull_object_fn=unavailable)
                except ObjectPullError:
                    out.append(reply(mid, error=True))  # what HttpGrid answers then
            elif when is not None and self.pulls >= when:
                out.append(reply(mid))
        return out


def test_replies_are_asked_for_again_briskly_not_every_three_seconds(monkeypatch):
    waits = []
    monkeypatch.setattr(transport.time, "sleep", waits.append)
    grid = Grid([3, 2])
    got = transport.send_and_receive(grid, ["a", "b"], timeout=60)
    assert sorted(r.metadata.reply_to_message_id for r in got) == ["m0", "m1"]
    assert grid.pulls == 3 and waits == [transport.POLL_SECONDS[0]]  # a reply resets the pace
    grid = Grid([6])
    transport.send_and_receive(grid, ["a"], timeout=60)
    assert waits[1:] == [0.05, 0.1, 0.2, 0.4, 0.5]  # doubling to the longest wait


def test_a_node_that_never_answers_costs_the_deadline_and_no_more():
    grid = Grid([1, None])
    t0 = time.monotonic()
    got = transport.send_and_receive(grid, ["a", "b"], timeout=0.5)
    assert [r.metadata.reply_to_message_id for r in got] == ["m0"]
    assert time.monotonic() - t0 < 5


def test_a_reply_frozen_mid_push_is_given_up_at_the_deadline():
    """Without the bound Flower retries the missing object for up to two hours."""
    grid, out = Grid(["frozen", 2]), []
    worker = threading.Thread(target=lambda: out.extend(
        transport.send_and_receive(grid, ["a", "b"], timeout=3.0)), daemon=True)
    t0 = time.monotonic()
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the exchange outlived its deadline by a minute"
    assert time.monotonic() - t0 < 30
    assert {(r.metadata.reply_to_message_id, r.has_error()) for r in out} == {("m0", True),
                                                                              ("m1", False)}
    assert http_grid.pull_objects.__name__ == "pull_objects"  # Flower's own function restored


def test_any_other_grid_keeps_its_own_exchange():
    class Simulated:
        def send_and_receive(self, messages, *, timeout=None):
            return [("sent", tuple(messages), timeout)]

    assert transport.send_and_receive(Simulated(), ["a"], 7.0) == [("sent", ("a",), 7.0)]


def test_a_frozen_reply_holds_up_neither_the_others_nor_itself_once_it_comes(monkeypatch):
    """Each poll gives an incomplete reply a short try; the others are taken meanwhile, and
    the incomplete one too once its objects arrive."""
    monkeypatch.setattr(transport.time, "sleep", lambda s: None)
    grid = Grid([("frozen", 4), 2])
    got = transport.send_and_receive(grid, ["a", "b"], timeout=60)
    assert sorted((r.metadata.reply_to_message_id, r.has_error()) for r in got) == [
        ("m0", False), ("m1", False)]
    assert grid.pulls == 4
