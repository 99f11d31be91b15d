"""A real Ray cluster reached by address: ``ray start --head`` on 127.0.0.1 (its own session
directory, a bounded lifetime), ``fit`` against it from a separate driver process, then the head
is stopped — also when the test fails. And an address where no cluster runs is refused, naming
the address."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.cluster, pytest.mark.ray]

LIFETIME = 240  # seconds: the head is killed after this even if the test hangs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_cli() -> list[str]:
    # the `ray` script of the interpreter running the tests (not whatever is first on PATH)
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; "
            "sys.argv[0] = 'ray'; sys.exit(main())"]


TOKEN = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "fedcf" * 8}  # the test head's auth


@pytest.fixture
def head():
    """A Ray head on 127.0.0.1 with 2 CPUs and token authentication, in its own process group,
    stopped at the end."""
    port = _free_port()
    tmp = tempfile.mkdtemp(prefix="fr")  # short: Ray's unix sockets live under it
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **TOKEN,
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # loopback only (see conftest.py)
    proc = subprocess.Popen(
        ["timeout", str(LIFETIME), *_ray_cli(), "start", "--head", "--block",
         "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
         "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", tmp],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        subprocess.run(["pkill", "-KILL", "-f", tmp], check=False)  # anything left of it


DRIVER = textwrap.dedent("""
    import sys, numpy as np
    from fedcf import FedReconMF
    from fedcf.datasets import make_synthetic_ratings
    from fedcf.federated import RayExecutor
    pop = make_synthetic_ratings(300, 40, 4000, n_factors=3, random_state=2)
    kw = dict(n_factors=4, n_rounds=3, clients_per_round=30, random_state=0)
    ref = FedReconMF(**kw).fit(pop)
    m = FedReconMF(**kw, executor=RayExecutor(2, address=sys.argv[1])).fit(pop)
    assert np.array_equal(m.item_factors_, ref.item_factors_), "differs from the local run"
    import ray
    nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
    print("OK", nodes, ray.cluster_resources().get("CPU"))
""")


def _without_single_machine(token: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
           and not k.startswith("RAY_AUTH")}
    return {**env, **(TOKEN if token else {})}


def test_a_local_instance_started_by_fedcf_listens_on_loopback_only():
    """... and its workers run at the driver's priority (Ray's default is nice 15)."""
    code = ("import os\n"
            "from fedcf.federated.executors.ray_executor import connect\n"
            "ray = connect(None)\n"
            "print('NODE', ray.util.get_node_ip_address())\n"
            "print('NICE', ray.get(ray.remote(lambda: os.nice(0)).remote()))\n"
            "ray.shutdown()\n")
    env = {k: v for k, v in _without_single_machine().items() if k != "RAY_worker_niceness"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, env={**env, "RAY_USAGE_STATS_ENABLED": "0"})
    assert "NODE 127.0.0.1" in out.stdout, out.stderr[-2000:]
    assert "NICE 0" in out.stdout, out.stderr[-2000:]


def test_fit_on_a_head_node_reached_by_address(head):
    deadline = time.monotonic() + 60
    while True:  # the head answers once its GCS is up
        probe = subprocess.run([*_ray_cli(), "status", "--address", head],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, **TOKEN})
        if probe.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert probe.returncode == 0, probe.stderr[-2000:]
    # the driver's environment lacks conftest's single-machine setting: connect() sets it for
    # a loopback address (without it the driver waited ~10 minutes for the head), also when
    # the driver imported ray before fedcf (Ray reads the setting at import)
    for first in ("", "import ray\n"):
        out = subprocess.run([sys.executable, "-c", first + DRIVER, head], capture_output=True,
                             text=True, timeout=(LIFETIME - 60) / 2,
                             env=_without_single_machine())
        assert out.returncode == 0, (first, out.stderr[-3000:])
        assert "OK ['127.0.0.1'] 2.0" in out.stdout  # the head's node: loopback, its 2 CPUs
    # a driver without the cluster's token is told so, not to start a cluster
    code = ("from fedcf.federated.executors.ray_executor import connect\n"
            "try:\n    connect(__import__('sys').argv[1])\n"
            "except ConnectionError as e:\n    print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code, head], capture_output=True, text=True,
                         timeout=90, env=_without_single_machine(token=False))
    assert "REFUSED could not join the Ray cluster" in out.stdout, out.stderr[-2000:]
    assert "RAY_AUTH_MODE=token" in out.stdout and "ray start --head" not in out.stdout


@pytest.mark.parametrize("address,err,match", [
    ("127.0.0.1:{port}", ConnectionError, "could not reach a Ray cluster at address='127.0.0.1:"),
    ("no-port-here", ValueError, "address must look like 'host:port'"),
])
def test_an_unreachable_or_malformed_address_is_named(address, err, match):
    from fedcf import FedReconMF
    from fedcf.datasets import make_synthetic_ratings
    from fedcf.federated import RayExecutor

    pop = make_synthetic_ratings(50, 20, 500, random_state=0)
    ex = RayExecutor(address=address.format(port=_free_port()))
    t0 = time.monotonic()
    with pytest.raises(err, match=match):
        FedReconMF(n_rounds=1, executor=ex).fit(pop)
    assert time.monotonic() - t0 < 30


def test_scale_benchmark_writes_rows_for_both_executors_and_the_report_reads_them(tmp_path):
    from conftest import load_script

    out = tmp_path / "scale.json"
    rows = load_script("scale_benchmark").main([
        "--users", "3000", "--clients-per-round", "200", "--items", "300", "--factors", "4",
        "--rounds", "2", "--warmup", "1", "--timeout", "200", "--json", str(out)])
    assert [r["executor"] for r in rows] == ["local", "ray"]
    local, on_ray = rows
    assert local["ratings"] == on_ray["ratings"] and local["loss"] == on_ray["loss"]  # same model
    assert on_ray["shard_restarts"] == 0 and len(on_ray["worker_peak_mib"]) == 2
    assert on_ray["ray_overhead"] == on_ray["round_seconds"] / local["round_seconds"] - 1
    import json

    doc = load_script("report").scale_values(json.loads(out.read_text()))
    assert "| ray | 3,000 | 200 |" in doc["table"] and "overhead" in doc["breakdown"]
