"""A round's messages out and their replies in, by a deadline that holds, without a fixed poll.

Flower 1.42's ``Grid.send_and_receive`` asks the SuperLink for replies every 3 s, so every
exchange waits for the next multiple of 3 s after its last reply came in. And pulling a reply
whose objects are still on their way — a node that froze while it pushed its reply — retries
inside that call for up to two hours (Flower's ``PULL_MAX_TIME``), past any deadline of the
round, and holds up every other reply behind it. On a deployed run (Flower's ``HttpGrid``)
``send_and_receive`` here asks again after 50 ms, doubling to 0.5 s while no reply comes, gives
an incomplete reply at most that long per poll and asks for it again at the next one, and stops
at the deadline: a reply still incomplete then is Flower's own error reply (its objects
unavailable), which the caller refuses like any other missing reply. Any other grid (Flower's
simulation, the tests' fakes) keeps its own ``send_and_receive``.
"""

from __future__ import annotations

import contextlib
import functools
import time

POLL_SECONDS = (0.05, 0.5)  # first wait after an empty pull, and the longest


@contextlib.contextmanager
def object_pulls_until(seconds: float):
    """Within the block, a deployed grid retries a reply's missing objects for at most
    ``seconds`` (from the start of each pull), at the poll's pace rather than Flower's
    1 s doubling to 10 s."""
    from flwr.superlink.grid import http_grid

    real = http_grid.pull_objects
    http_grid.pull_objects = functools.partial(
        real, max_time=max(float(seconds), 0.0), initial_backoff=POLL_SECONDS[0],
        backoff_cap=POLL_SECONDS[1])
    try:
        yield
    finally:
        http_grid.pull_objects = real


def _incomplete(reply) -> bool:
    """A reply the grid made up because the node's reply had objects still missing."""
    from flwr.common.constant import ErrorCode

    return reply.has_error() and reply.error.code == ErrorCode.MESSAGE_UNAVAILABLE


def send_and_receive(grid, messages, timeout: float) -> list:
    """Push ``messages`` and collect their replies until each has one or ``timeout`` seconds
    have passed (what Flower's ``Grid.send_and_receive`` promises). A reply whose objects are
    not all there is asked for again at the next poll (the SuperLink keeps it until it is
    received), so it holds up neither the others nor the deadline; if it is still incomplete
    at the deadline, the grid's error reply for it is returned."""
    from flwr.superlink.grid.http_grid import HttpGrid

    if not isinstance(grid, HttpGrid):
        return list(grid.send_and_receive(messages, timeout=timeout))
    ids = set(grid.push_messages(messages))
    end, wait, out, unfinished = time.monotonic() + timeout, POLL_SECONDS[0], [], {}
    while ids:
        left = end - time.monotonic()
        if left <= 0:
            break
        with object_pulls_until(min(left, POLL_SECONDS[1])):
            got = list(grid.pull_messages(ids))
        unfinished.update((m.metadata.reply_to_message_id, m) for m in got if _incomplete(m))
        done = [m for m in got if not _incomplete(m)]
        out += done
        ids -= {m.metadata.reply_to_message_id for m in done}
        if ids and not done:
            time.sleep(min(wait, max(end - time.monotonic(), 0.0)))
            wait = min(2 * wait, POLL_SECONDS[1])
        else:
            wait = POLL_SECONDS[0]
    return out + [unfinished[i] for i in sorted(ids & unfinished.keys())]
