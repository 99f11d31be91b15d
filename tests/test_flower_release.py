"""A restarted device ends its killed SuperNode's session itself (fedcf.flower.release), so the
SuperLink lets it in again at once instead of after Flower's heartbeat patience."""

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("flwr")

from conftest import load_script  # noqa: E402

from fedcf.flower import release  # noqa: E402


def test_the_node_id_is_read_from_the_last_line_that_names_it(tmp_path):
    log = tmp_path / "supernode.log"
    assert release.node_id_from_log(log) is None  # no log yet: nothing to release
    log.write_text("INFO : SuperNode ID: 12\nother\nINFO : SuperNode ID: 18446744073709551615\n")
    assert release.node_id_from_log(log) == 2 ** 64 - 1
    log.write_text("INFO : Starting\n")
    assert release.node_id_from_log(log) is None


@pytest.mark.parametrize("kw, match", [
    ({"node_id": -1}, "non-negative int"),
    ({"node_id": "7"}, "non-negative int"),
    ({"node_id": True}, "non-negative int"),
    ({"node_id": 2**64}, "below 2\\*\\*64"),
    ({"node_id": 7, "insecure": True, "root_certificates": "ca.crt"}, "not both"),
    ({"node_id": 7}, "not both or neither"),
])
def test_a_bad_argument_is_named_before_anything_is_sent(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        release.release_node("127.0.0.1:1", tmp_path / "key", **kw)


def test_an_unreadable_key_is_named(tmp_path):
    bad = tmp_path / "node.key"
    bad.write_text("not a key")
    for path in (bad, tmp_path / "missing.key"):
        with pytest.raises(ValueError, match=str(path.name)):
            release.release_node("127.0.0.1:1", path, 7, insecure=True)
    assert release.main(["--superlink", "127.0.0.1:1", "--auth-supernode-private-key",
                         str(bad), "--node-id", "7", "--insecure"]) == 2


def _start(procs, folder, name, args, env):
    log = open(folder / f"{name}.log", "w")
    procs.append(subprocess.Popen(["timeout", "-s", "KILL", "240", *args], stdout=log,
                                  stderr=subprocess.STDOUT, env=env, cwd=folder,
                                  start_new_session=True))
    return procs[-1], folder / f"{name}.log"


def _node_id(log, proc, seconds):
    """The node id once the SuperNode's log names it, or None if it exits or time runs out."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        found = release.node_id_from_log(log)
        if found is not None or proc.poll() is not None:
            return found
        time.sleep(0.25)
    return None


@pytest.mark.cluster
def test_a_killed_node_is_let_in_again_at_once_after_it_releases_its_session(tmp_path):
    """A real SuperLink with TLS and node authentication: a SuperNode killed with SIGKILL
    cannot come back while its session stays online (Flower refuses the activation); once the
    device has released that session with its own key, it is let in at once with the same
    node id. Another node's key cannot release it, and a second release finds nothing open."""
    deploy = load_script("flower_deploy")
    creds = deploy.credentials(tmp_path / "credentials", 2)  # node1's key is never registered
    link = deploy.free_port()
    env = {**os.environ, "FLWR_HOME": str(deploy.flwr_home(tmp_path, link, creds)),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    procs = []
    node = deploy.supernode_args(creds, 0, link, deploy.free_port(), "partition-id=0")
    address, ca = f"127.0.0.1:{link}", str(creds["ca"])
    try:
        superlink, _ = _start(procs, tmp_path, "superlink",
                              deploy.superlink_args(creds, link, tmp_path), env)
        deploy.wait_port(link, superlink, 60)
        subprocess.run([deploy.tool("flwr"), "supernode", "register",
                        str(creds["node0"]) + ".pub", "local"], env=env, cwd=tmp_path,
                       check=True, capture_output=True, timeout=60)
        first, log = _start(procs, tmp_path, "first", node, env)
        node_id = _node_id(log, first, 60)
        assert node_id is not None, log.read_text()[-2000:]
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        again, log = _start(procs, tmp_path, "again", node, env)  # Flower alone: refused
        assert _node_id(log, again, 60) is None and again.wait(30) != 0, log.read_text()[-2000:]
        with pytest.raises(PermissionError, match=str(node_id)):
            release.release_node(address, creds["node1"], node_id, root_certificates=ca)
        assert release.main(["--superlink", address, "--auth-supernode-private-key",
                             str(creds["node0"]), "--from-log", str(tmp_path / "first.log"),
                             "--root-certificates", ca]) == 0
        assert release.release_node(address, creds["node0"], node_id,
                                    root_certificates=ca) is False  # nothing left open
        t0 = time.monotonic()
        back, log = _start(procs, tmp_path, "back", node, env)
        assert _node_id(log, back, 30) == node_id, log.read_text()[-2000:]
        assert time.monotonic() - t0 < 30  # not Flower's two 30 s heartbeats
    finally:
        deploy.stop(procs)


def test_a_missing_ca_file_is_named(tmp_path):
    deploy = load_script("flower_deploy")
    creds = deploy.credentials(tmp_path, 1)
    with pytest.raises(ValueError, match="nope.pem"):
        release.release_node("127.0.0.1:1", creds["node0"], 7,
                             root_certificates=tmp_path / "nope.pem")
    with pytest.raises(ConnectionError, match="127.0.0.1:1"):  # nothing listens there
        release.release_node("127.0.0.1:1", creds["node0"], 7, insecure=True)
