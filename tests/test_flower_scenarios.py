"""How ``scripts/flower_deploy.py`` plays a scenario on the last node (``Deployment.step``), with
the processes played by a fake: what is signalled, restarted and recorded, and when. The real
runs: eval/results/flower_scenario_*.json; a real deployment:
tests/test_flower.py::test_flower_deployment_superlink_and_supernodes."""

import signal

import pytest

pytest.importorskip("flwr")

from conftest import load_script  # noqa: E402

deploy = load_script("flower_deploy")


class FakeProc:
    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code


class Played(deploy.Deployment):
    """A deployment whose last node's log has seen ``groups``, whose devices are fakes."""

    def __init__(self, tmp_path, groups=()):  # noqa: D107 - no processes, no SuperLink
        self.folder, self.victim, self.events, self.secure = tmp_path, 1, {}, True
        self.groups, self.calls = set(groups), []
        self.node_procs = {1: FakeProc()}

    def arrived(self, group):
        return group in self.groups

    def signal_device(self, k, sig):
        self.calls.append(("signal", k, sig))

    def restart_device(self, k, sig, release):
        self.calls.append(("restart", k, sig, release))


def test_a_kill_happens_once_when_its_group_arrives(tmp_path):
    d = Played(tmp_path)
    sc = deploy.Scenario(kill_at="round-1/consistency", kill_signal=signal.SIGTERM)
    d.step(sc, 1.0)
    assert d.calls == [] and d.events == {}
    d.groups.add("round-1/consistency")
    d.step(sc, 2.0)
    d.step(sc, 3.0)
    assert d.calls == [("signal", 1, signal.SIGTERM)]
    assert d.events == {"killed": {"group": "round-1/consistency", "seconds": 2.0}}


def test_a_stall_is_continued_after_its_seconds_and_only_then(tmp_path):
    d = Played(tmp_path, {"round-1"})
    sc = deploy.Scenario(stall_at="round-1", stall_seconds=40.0)
    d.step(sc, 10.0)
    d.step(sc, 49.0)
    assert d.calls == [("signal", 1, signal.SIGSTOP)]
    d.step(sc, 50.0)
    d.step(sc, 60.0)
    assert d.calls == [("signal", 1, signal.SIGSTOP), ("signal", 1, signal.SIGCONT)]
    assert d.events == {"stalled": {"group": "round-1", "seconds": 10.0},
                        "resumed": {"seconds": 50.0}}


@pytest.mark.parametrize("release", [True, False])
def test_a_restart_releases_first_then_retries_without_until_the_node_is_let_in(tmp_path,
                                                                                release):
    d = Played(tmp_path, {"round-1"})
    sc = deploy.Scenario(restart_at="round-1", release=release)
    d.step(sc, 5.0)
    assert d.calls == [("restart", 1, signal.SIGKILL, release)]
    assert d.events["restarted"] == {"group": "round-1", "seconds": 5.0, "attempts": 1}
    (tmp_path / "supernode1_restarted.log").write_text("starting\n")
    d.node_procs[1] = FakeProc(code=1)  # the SuperLink refused it: the supervisor tries again
    d.step(sc, 6.0)
    assert d.calls[-1] == ("restart", 1, signal.SIGKILL, False)
    assert d.events["restarted"]["attempts"] == 2
    d.node_procs[1] = FakeProc()
    (tmp_path / "supernode1_restarted.log").write_text("INFO : SuperNode ID: 42\n")
    d.step(sc, 9.0)
    d.step(sc, 10.0)
    assert d.events["rejoined"] == {"seconds": 9.0} and len(d.calls) == 2
