"""A warm device: one long-lived process that answers every message a SuperNode receives.

Flower 1.42's SuperNode hands each message to a task executor. With its default
``--isolation subprocess`` that is a fresh ``flwr-clientapp`` process per message: Python,
Flower, NumPy, Numba and fedcf are imported, the app is installed and loaded, and the device's
ratings are parsed, every round (seconds of start-up and hundreds of MiB for a millisecond of
work). With ``--isolation process`` the SuperNode starts no executor and waits for one to
connect to its runtime API. This module is that executor for fedcf's app: it acquires the
node's tasks one at a time and runs each in this process with Flower's own task steps (pull
the message and context, run the ClientApp, push the reply and the context back), so the
imports, the compiled kernels, the installed app and the device's parsed data stay warm.

    flower-supernode --isolation process --host 127.0.0.1 --port 9401 ...
    python -m fedcf.flower.warm --runtime-api-address 127.0.0.1:9401 --insecure

Trade-off (also in the deployment guide): the ClientApp is no longer isolated from earlier
messages of the node — state kept in the process (the parsed ratings, the loaded app) survives
between messages and runs, and a crash of a handler that kills the process stops the node's
answers until the process is restarted (a supervisor's job, as for the SuperNode itself). The
run's context still travels through the SuperNode exactly as with a process per message, so a
restart of this process loses nothing the node keeps for the run. Only apps already installed
or sent by the SuperLink run here, as with Flower's executor.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path

from .runtime import TaskToken, pull_task_input, runtime_client

log = logging.getLogger(__name__)
POLL_SECONDS = (0.01, 0.25)  # no task: ask again after 10 ms, doubling up to 250 ms
STOP_GRACE = 10.0  # seconds a task may still take after SIGTERM/SIGINT


def _steps():
    """The task's steps: pull its input, push its reply and its outcome (``fedcf.flower.runtime``:
    Flower's steps without a thread pool per task or httpx per request)."""
    from . import runtime

    return runtime


class WarmExecutor:
    """Acquires the SuperNode's ClientApp tasks and runs them in this process.

    ``address``: the SuperNode's runtime API (its ``--host``:``--port``); ``insecure`` for a
    plain-HTTP runtime API, else ``certificates`` (PEM bytes of its CA)."""

    def __init__(self, address: str, *, insecure: bool = True,
                 certificates: bytes | None = None, poll: float = POLL_SECONDS[1]):
        host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"address must be 'host:port' of the SuperNode's runtime API (its "
                             f"--host and --port), got {address!r}")
        if not insecure and certificates is None:
            raise ValueError("a TLS runtime API needs certificates (the CA's PEM bytes); pass "
                             "insecure=True for a plain-HTTP one on loopback")
        if not (0 < float(poll) <= 10):
            raise ValueError(f"poll must be in (0, 10] seconds, got {poll!r}")
        self.address, self.insecure, self.certificates = address, insecure, certificates
        self.poll, self.tasks, self.failed = float(poll), 0, 0
        self._apps: dict[tuple, object] = {}  # (fab id, version, hash) -> loaded ClientApp
        self._stop = threading.Event()
        self._token, self._client = TaskToken(), None  # the tasks' HTTP client, made once
        self.busy = False  # a task is running

    def stop(self):
        """Finish the task at hand, then return from ``serve``."""
        self._stop.set()

    def serve(self, max_tasks: int | None = None, idle_seconds: float | None = None) -> int:
        """Run tasks until ``stop()`` (or SIGTERM/SIGINT from ``main``), ``max_tasks`` tasks, or
        ``idle_seconds`` without one; return the number run."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
        from flwr.supercore.constant import TaskType

        acquirer = runtime_client(self.address, insecure=self.insecure,
                                  certificates=self.certificates)
        last, wait = time.monotonic(), min(POLL_SECONDS[0], self.poll)
        try:
            while not self._stop.is_set() and (max_tasks is None or self.tasks < max_tasks):
                res = acquirer.AcquireTask(AcquireTaskRequest(
                    supported_task_types=[str(TaskType.CLIENT_APP)]))
                if res.HasField("task") and res.token:
                    self.run_task(res.token)
                    last, wait = time.monotonic(), min(POLL_SECONDS[0], self.poll)
                elif idle_seconds is not None and time.monotonic() - last > idle_seconds:
                    break
                else:  # soon again after a task (a round's next step), seldom when idle
                    self._stop.wait(wait)
                    wait = min(2 * wait, self.poll)
        finally:
            acquirer.close()
            if self._client is not None:
                self._client.close()
                self._client = None
        return self.tasks

    def _app(self, run, fab):
        """The run's ClientApp, installed and loaded once per app version."""
        key = (run.fab_id, run.fab_version, fab.hash_str)
        if key not in self._apps:
            from flwr.cli.install import install_from_fab
            from flwr.clientapp.utils import get_load_client_app_fn
            from flwr.common.config import get_project_dir

            if not Path(get_project_dir(*key)).exists():
                install_from_fab(fab.content, skip_prompt=True)
            self._apps[key] = get_load_client_app_fn("", None, multi_app=True)(*key)
        return self._apps[key]

    def run_task(self, token: str) -> bool:
        """One task, as ``flwr-clientapp`` runs it, in this process; True when it completed.
        A handler's exception becomes an error reply and a failed task, as in Flower."""
        self.busy = True
        try:
            return self._run_task(token)
        finally:
            self.busy = False

    def _run_task(self, token: str) -> bool:
        from flwr.common.constant import SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http

        from . import app as fedcf_app

        fedcf_app.WARM_PROCESS = True
        started, cpu = time.perf_counter(), time.process_time()
        if self._client is None:
            self._client = runtime_client(self.address, insecure=self.insecure,
                                          certificates=self.certificates, token=self._token)
        client, self._token.value, self._token.requests = self._client, token, 0
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        message = None
        try:
            message, context, reply, status, details = self._work(client)
            status = self._hand_back(client, context, reply, status, details)
        finally:
            heartbeat.stop()
            self._token.value = ""
        fedcf_app.write_cost({  # the whole task: pull, handler, reply, context
            "message": None if message is None else str(message.metadata.message_type),
            "task_seconds": time.perf_counter() - started,
            "task_cpu_seconds": time.process_time() - cpu, "status": str(status),
            "requests": self._token.requests})
        self.tasks += 1
        self.failed += status != SubStatus.COMPLETED
        return status == SubStatus.COMPLETED

    def _work(self, client):
        """Pull the task and run the app: (message, context, reply, status, details); a
        handler's exception becomes an error reply, as in ``flwr-clientapp``."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode, SubStatus

        message = context = None
        try:
            message, context, run, fab = pull_task_input(client)
            reply = self._app(run, fab)(message=message, context=context)
            return message, context, reply, SubStatus.COMPLETED, ""
        except Exception as e:  # noqa: BLE001 - reported to the SuperNode, as flwr-clientapp does
            details = f"{type(e)}:<'{e}'>"
            reply = None if message is None else Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details),
                reply_to=message)
            return message, context, reply, SubStatus.FAILED, details

    def _hand_back(self, client, context, reply, status, details):
        """Push the reply and the task's outcome; the task's status. A SuperNode that no longer
        takes them (this process stalled past the task, the node restarted) fails the task,
        not the process."""
        from flwr.common.constant import SubStatus

        try:
            if reply is not None and context is not None:
                _steps().push_message(client, reply, context)
            _steps().push_task_output(client, context, status, details)
            return status
        except Exception as e:  # noqa: BLE001 - the next task may still be served
            log.warning("fedcf.flower.warm: could not hand back a task (%s: %s)",
                        type(e).__name__, e)
            return SubStatus.FAILED


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedcf.flower.warm",
        description="Answer a SuperNode's messages (--isolation process) in one warm process.")
    ap.add_argument("--runtime-api-address", required=True,
                    help="the SuperNode's runtime API, host:port (its --host and --port)")
    tls = ap.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="plain HTTP (loopback only)")
    tls.add_argument("--root-certificates", help="PEM file of the runtime API's CA")
    ap.add_argument("--poll", type=float, default=POLL_SECONDS[1],
                    help="longest wait between asks when the node has no task (seconds)")
    ap.add_argument("--parent-pid", type=int, default=None,
                    help="exit when this process (e.g. the SuperNode) exits")
    args = ap.parse_args(argv)
    certificates = None
    if args.root_certificates:
        try:
            certificates = Path(args.root_certificates).read_bytes()
        except OSError as e:
            ap.error(f"--root-certificates {args.root_certificates!r} cannot be read ({e})")
    try:
        ex = WarmExecutor(args.runtime_api_address, insecure=args.insecure,
                          certificates=certificates, poll=args.poll)
    except ValueError as e:
        ap.error(str(e))
    if args.parent_pid is not None:
        from flwr.supercore.app_utils import start_parent_process_monitor
        start_parent_process_monitor(args.parent_pid)
    def on_signal(*_):  # between tasks (asking, waiting) stop now; else finish the task at
        ex.stop()       # hand, but give up on it after STOP_GRACE s (its SuperNode may be gone)
        if not ex.busy:
            raise SystemExit(0)
        import os
        threading.Timer(STOP_GRACE, os._exit, args=(1,)).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    ex.serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
