"""Pinned device keys: a server that substitutes a client's verifying key (to sit in the middle
of its key agreement and read its masks) or invents a client is refused by every device that
pins its federation's identity keys; honest runs are unchanged."""

import logging

import numpy as np
import pytest

pytest.importorskip("flwr")

from test_flower import SEC_PARAMS, FakeGrid, partitions, reference, run  # noqa: E402

from fedcf.flower.keys import load_identity, load_pinned, make_identity  # noqa: E402
from fedcf.flower.secure import FlowerHalves  # noqa: E402
from fedcf.flower.wire import record_arrays  # noqa: E402


def _pinned_nodes(tmp_path, n=3, pinned=None):
    """Node configs of ``n`` partitions, each with its own identity key, all pinning the
    public keys ``pinned`` selects (default: all of them)."""
    keys = [make_identity(tmp_path / f"id{k}") for k in range(n)]
    chosen = keys if pinned is None else [keys[k] for k in pinned]
    (tmp_path / "pinned.txt").write_text("# the federation\n" + "\n".join(chosen) + "\n")
    return [{**cfg, "identity-key": str(tmp_path / f"id{k}"),
             "pinned-keys": str(tmp_path / "pinned.txt")}
            for k, cfg in enumerate(partitions(n))]


def test_pinned_keys_leave_an_honest_round_as_it_was(tmp_path):
    """Every client key carries its node's endorsement, every device checks them, and the
    model is the in-process secure-aggregation model bit for bit."""
    grid = FakeGrid(_pinned_nodes(tmp_path))
    res, model = run(grid, tmp_path, SEC_PARAMS)
    ref, _ = reference(SEC_PARAMS)
    assert res["refusals"] == []
    np.testing.assert_array_equal(model.item_factors_, ref.item_factors_)
    ups = [r for m, r in grid.sent if m.metadata.message_type == "train.secagg"
           and m.content["config"]["step"] == "begin"]
    assert ups and all("endorse.data" in record_arrays(r.content["secagg"]) for r in ups)


def _substitute_key(monkeypatch):
    """A server that shows every node but the victim's own a verifying key of its making for
    one client (the victim node sees the true registry, so it cannot notice), with that
    client's advert re-signed by the server's key: what sitting in the middle of the client's
    key agreements starts with."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedcf.federated.aggregators.secagg_protocol import Advert
    from fedcf.flower.secure import _bundles, pack
    from fedcf.flower.wire import arrays

    def forged(self, adverts):
        victim = sorted(self.registry)[0]
        home = next(n for n, cl in self.asked.items() if victim in cl)
        mine = Ed25519PrivateKey.generate()
        fake_reg = {**self.registry, victim: mine.public_key().public_bytes_raw()}
        fake_adv = [Advert(a.client, a.c_pk, a.s_pk, mine.sign(self.session + a.c_pk + a.s_pk))
                    if a.client == victim else a for a in adverts]

        def table(reg, adv):
            ends = self.endorsements
            return arrays(**pack("keys", [(c,) for c in reg], list(reg.values())),
                          **pack("adverts", [(a.client,) for a in adv],
                                 [a.c_pk + a.s_pk + a.signature for a in adv]),
                          **(pack("endorse", [(c,) for c in ends], list(ends.values()))
                             if ends else {}))
        contents = {n: {"secagg": table(self.registry, adverts) if n == home else
                        table(fake_reg, fake_adv)} for n in self.live}
        return self._gather("share", contents, _bundles)

    monkeypatch.setattr(FlowerHalves, "share", forged)


@pytest.mark.parametrize("pin", [True, False])
def test_a_substituted_key_is_refused_by_pinned_devices(tmp_path, monkeypatch, caplog, pin):
    """Unpinned devices take the forged key (its advert's signature checks against the forged
    registry) and answer the share step — the opening the pins close; pinned devices find no
    endorsement for it and share nothing, so no round is aggregated and each refusing
    device's log names the rule."""
    _substitute_key(monkeypatch)
    nodes = _pinned_nodes(tmp_path) if pin else partitions(3)
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        res, _ = run(FakeGrid(nodes), tmp_path, SEC_PARAMS)
    at_share = [r for r in res["refusals"] if r["stage"].endswith("secagg share")]
    if pin:
        assert all(h["secagg_lost_round"] for h in res["history"])
        assert "device refused (pinned_keys)" in caplog.text
        assert at_share and all("pinned_keys" in r["reason"] for r in at_share)
    else:
        assert at_share == []  # every device shared with the forged key


def test_a_node_outside_the_pinned_list_cannot_join_the_sum(tmp_path, caplog):
    """A node whose identity the others do not pin (a server's own node, say) endorses its
    clients with a key nobody pinned: the pinned devices refuse the cohort's registry."""
    with caplog.at_level(logging.WARNING, "fedcf.device"):
        res, _ = run(FakeGrid(_pinned_nodes(tmp_path, pinned=[0, 1])), tmp_path, SEC_PARAMS)
    assert all(h["secagg_lost_round"] for h in res["history"])
    assert "no endorsement by a pinned device key" in caplog.text


def test_an_interrupted_identity_write_leaves_no_half_key(tmp_path, monkeypatch):
    import os

    def broken(fd, mode):
        os.close(fd)
        raise OSError("disk full")

    monkeypatch.setattr(os, "fdopen", broken)
    with pytest.raises(OSError, match="disk full"):
        make_identity(tmp_path / "id")
    assert not (tmp_path / "id").exists()


def test_identity_and_pinned_files_are_checked(tmp_path):
    key = make_identity(tmp_path / "id")
    assert len(bytes.fromhex(key)) == 32 and load_identity(tmp_path / "id")
    assert (tmp_path / "id").stat().st_mode & 0o077 == 0  # the node's own secret
    with pytest.raises(ValueError, match="exists already"):
        make_identity(tmp_path / "id")
    (tmp_path / "short").write_bytes(b"x" * 5)
    with pytest.raises(ValueError, match="holds 5 bytes"):
        load_identity(tmp_path / "short")
    with pytest.raises(ValueError, match="cannot be read"):
        load_identity(tmp_path / "none")
    (tmp_path / "p.txt").write_text(f"{key}\nnot-hex\n")
    with pytest.raises(ValueError, match="line 2"):
        load_pinned(tmp_path / "p.txt")
    (tmp_path / "e.txt").write_text("# nothing\n")
    with pytest.raises(ValueError, match="lists no key"):
        load_pinned(tmp_path / "e.txt")
