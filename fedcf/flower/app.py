"""The Flower ClientApp and ServerApp of fedcf, and a writer for the Flower app project that
``flwr run`` takes.

``client_app`` answers five message types: query (the node's directory entry), train (FedRecon
client work for the users named in the message), train.secagg (one step of the secure-
aggregation protocol for those users, ``secure.node_step``), train.tangents (their
hypergradient reports, ``node.tangent_reports``) and evaluate (federated ReconEval). A failure
on the node (no data, a user it does not hold, bad data) becomes an error reply whose reason
the server logs; the round goes on without that node. ``server_app`` runs ``server.serve`` with
the run config.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from .node import check_fresh, describe, evaluate, named, node_data, tangent_reports, train
from .rows import NodeRows
from .secure import node_step
from .server import serve
from .settings import Settings
from .wire import ERROR_CODE, arrays, flwr

app = flwr()
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import ServerApp  # noqa: E402


def _answer(msg, work):
    """The reply to ``msg``: ``work()``'s records, or an error reply naming what went wrong.
    What the message cost this device is written to the node's own log (``node_cost``),
    never sent."""
    started = time.perf_counter()
    try:
        return app.Message(content=app.RecordDict(work()), reply_to=msg)
    except (ValueError, TypeError, KeyError, IndexError, OSError, RuntimeError) as e:
        return app.Message(error=app.Error(ERROR_CODE, f"{type(e).__name__}: {e}"), reply_to=msg)
    finally:
        node_cost(msg, time.perf_counter() - started)


COST_LOG = "FEDCF_NODE_COST_LOG"  # environment variable: the device's own cost log


def node_cost(msg, seconds: float) -> dict | None:
    """When the node's environment names a file in ``FEDCF_NODE_COST_LOG``, append to it (one
    JSON line) what answering ``msg`` cost this device: the handler's seconds (loading the
    node's data included), how old the process was when the message arrived (with Flower's
    subprocess isolation: the start-up it paid; None in a warm process, ``fedcf.flower.warm``,
    which logs each task's whole seconds instead), its CPU seconds and peak memory so far. The
    log stays on the device; nothing of it is sent."""
    import resource

    age = None if WARM_PROCESS else process_age()
    return write_cost({
        "message": str(msg.metadata.message_type), "seconds": seconds,
        "startup_seconds": None if age is None else max(age - seconds, 0.0),
        "cpu_seconds": time.process_time(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


WARM_PROCESS = False  # set by fedcf.flower.warm: this process answers message after message


def write_cost(record: dict) -> dict | None:
    """Append ``record`` as one JSON line to the device's own cost log (``FEDCF_NODE_COST_LOG``)
    when its environment names one; return it, or None without a log."""
    path = os.environ.get(COST_LOG)
    if not path:
        return None
    try:
        with open(path, "a") as fh:  # one short line per write: appends do not interleave
            fh.write(json.dumps(record) + "\n")
    except OSError as e:  # the device's log is not the message's business
        print(f"fedcf: cannot write the node cost log {path!r}: {e}", file=sys.stderr)
    return record


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc), or None elsewhere."""
    try:
        start = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def make_client_app(mods=(), data: dict | None = None, policy: dict | None = None) -> ClientApp:
    """A ClientApp.

    ``mods``: Flower client mods (e.g. one that records the messages);
    ``data``: defaults for the run config's data keys (``dataset``, ``data-path``, ``synthetic-*``), for
    a simulation started from Python, where there is no run config;
    ``policy``: the devices' own rules where a node config does not set them (its keys, e.g.
    ``{"min-cohort": 2}``): part of the program the devices run, never of a message — for a
    simulation started from Python, whose nodes have no node config of their own."""
    capp = ClientApp(mods=list(mods))
    defaults, rules = dict(data or {}), dict(policy or {})

    def device_config(context) -> dict:
        return {**rules, **dict(context.node_config)}

    def own(context, msg=None):
        catalog = named(msg.content["catalog"], "catalog")["items"] if msg is not None and \
            "catalog" in msg.content else None
        return node_data({**defaults, **dict(context.run_config)}, context.node_config,
                         context.state, catalog)

    @capp.query()
    def query(msg, context):
        return _answer(msg, lambda: {"users": describe(own(context, msg),
                                                       msg.content.get("config"),
                                                       "catalog" in msg.content)})

    def fresh(msg, context):  # a stalled node works the current round only
        if "global" in msg.content:
            check_fresh(context.state, msg.content["global"])

    @capp.train()
    def fit(msg, context):
        return _answer(msg, lambda: fresh(msg, context) or train(
            own(context), msg.content["config"], msg.content["global"],
            NodeRows(msg.content, context.state)))

    @capp.train("secagg")
    def secagg(msg, context):  # secure aggregation: one protocol step (secure.node_step)
        return _answer(msg, lambda: fresh(msg, context) or {"secagg": arrays(**node_step(
            own(context), msg.content, context.state, device_config(context)))})

    @capp.train("tangents")
    def tangents(msg, context):  # learned hyperparameters: the users' hypergradient reports
        return _answer(msg, lambda: fresh(msg, context) or tangent_reports(
            own(context), msg.content["config"], msg.content["global"],
            msg.content["tangents"], NodeRows(msg.content, context.state)))

    @capp.evaluate()
    def recon(msg, context):
        return _answer(msg, lambda: {"recon": app.MetricRecord(
            evaluate(own(context), msg.content["config"], msg.content["global"],
                     context.state, device_config(context)))})

    return capp


def make_server_app(settings: Settings | None = None, on_result=None) -> ServerApp:
    """A ServerApp running ``serve``: with ``settings``, those; else from the run config.
    ``on_result(result)`` is called with the run's result (for the simulation script)."""
    sapp = ServerApp()

    @sapp.main()
    def main(grid, context):
        result = serve(grid, settings or Settings.from_run_config(context.run_config))
        if on_result is not None:
            on_result(result)

    return sapp


client_app = make_client_app()
server_app = make_server_app()

PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedcf-flower-app"
version = "1.0.0"
description = "FedRecon (fedcf) as a Flower app"
dependencies = ["fedcf[flower]"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedcf"

[tool.flwr.app.components]
serverapp = "fedcf_flower_app:server_app"
clientapp = "fedcf_flower_app:client_app"

[tool.flwr.app.config]
{config}
"""


def write_app(directory, **run_config) -> Path:
    """Write the Flower app project that ``flwr run DIRECTORY CONNECTION`` takes: a
    pyproject.toml with the run config (keys as in ``Settings`` and ``node.load_dataset``;
    values str, int, float or bool) and a module that re-exports fedcf's apps."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for key, value in run_config.items():
        value = value.item() if isinstance(value, np.generic) else value  # NumPy scalars
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value!r}")
        elif isinstance(value, str):
            lines.append(f"{key} = {_toml_str(value)}")
        else:
            raise TypeError(f"run config {key!r} must be str, int, float or bool, got "
                            f"{type(value).__name__}")
    (directory / "pyproject.toml").write_text(PYPROJECT.format(config="\n".join(lines)))
    (directory / "fedcf_flower_app.py").write_text(
        '"""fedcf\'s Flower apps (see fedcf.flower)."""\n\n'
        "from fedcf.flower.app import client_app, server_app\n\n"
        '__all__ = ["client_app", "server_app"]\n')
    return directory


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
