#!/usr/bin/env python
"""Mutation testing of the privacy code: break it on purpose, one mutant at a time, and check
that the privacy tests notice.

Each mutant is a one-line change to ``fedcf/federated/{dp,aggregators,accounting,phases,secagg,
secagg_protocol}.py`` of the kind a reviewer fears (noise dropped or halved, the clip skipping
the bias part, the accountant fed q/2 or 2σ, fixed-size sampling passed off as Poisson,
FoolsGold without its pardon, a secure-aggregation client revealing both secrets of one client,
mask seeds not from the OS, ...).
The script applies it in place, runs the privacy tests, and restores the file (also when
interrupted); a mutant *survives* when every test still passes. Run it on a clean checkout.

python scripts/mutants.py                      # all mutants, summary on stdout
python scripts/mutants.py --json eval/results/mutants.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FED = "fedcf/federated/"
TESTS = ["tests/test_privacy.py", "tests/test_secagg.py", "tests/test_attacks.py",
         "tests/test_aggregator_contract.py", "tests/test_phases.py",
         "tests/test_hyper_private.py", "tests/test_device.py"]

FLOWER_TESTS = ["tests/test_flower.py::test_a_node_answers_one_begin_per_round_and_model",
                "tests/test_flower.py::test_nodes_refuse_a_threshold_below_their_policy",
                "tests/test_flower.py::test_a_node_refuses_what_a_device_must_not_do",
                "tests/test_flower.py::test_a_node_takes_its_policy_from_its_own_config"]

EVAL_TESTS = ["tests/test_flower.py::test_a_device_reports_evaluation_sums_once_per_model_and_"
              "over_a_cohort_only"]

ES_TESTS = ["tests/test_early_stopping.py"]

# (name, file, original text, mutated text[, tests: else TESTS])
MUTANTS = [
    ("noise dropped", FED + "aggregators/dp.py",
     "dQ = secret.normal((n_items, K), std)", "dQ = np.zeros((n_items, K))"),
    ("bias noise dropped", FED + "aggregators/dp.py",
     "db = secret.normal(n_items, std) if c.biases else np.zeros(n_items)",
     "db = np.zeros(n_items)"),
    ("noise halved", FED + "aggregators/dp.py",
     "std = self.update_sigma_ * self.clip_ / self.denominator_",
     "std = 0.5 * self.update_sigma_ * self.clip_ / self.denominator_"),
    ("noise on touched rows only", FED + "aggregators/dp.py",
     "return dataclasses.replace(delta, items=np.arange(n_items), d_Q=dQ, d_b=db)",
     "return dataclasses.replace(delta, d_Q=dQ[delta.items], d_b=db[delta.items])"),
    ("accountant given q/2", FED + "aggregators/dp.py",
     "bound.mechanisms_ = [(float(r), float(sigma) * f) for r, f in plan]",
     "bound.mechanisms_ = [(float(r) / 2, float(sigma) * f) for r, f in plan]"),
    ("accountant given 2σ", FED + "aggregators/dp.py",
     "bound.mechanisms_ = [(float(r), float(sigma) * f) for r, f in plan]",
     "bound.mechanisms_ = [(float(r), 2 * float(sigma) * f) for r, f in plan]"),
    ("no clip", FED + "aggregators/weighted.py",
     "factor = np.where(w > 0, clip_scale(norms, clip), 0.0)",
     "factor = np.where(w > 0, 1.0, 0.0)"),
    ("denominator halved", FED + "aggregators/weighted.py",
     "    def denominator(self, totals: dict) -> float:\n        return self.fixed_denominator",
     "    def denominator(self, totals: dict) -> float:\n        return self.fixed_denominator / 2"),
    ("weight cap ignored", FED + "aggregators/weighted.py",
     "factor = factor * np.minimum(out.weights, weight_cap) / weight_cap",
     "factor = factor"),
    ("adaptive clip moves the wrong way", FED + "aggregators/dp.py",
     "(share - self.target_quantile)))", "(self.target_quantile - share)))"),
    ("adaptive clip: count noise left out of the update noise", FED + "aggregators/dp.py",
     "bound.update_sigma_ = (bound.sigma_ ** -2 - (2 * bound.count_std_) ** -2) ** -0.5",
     "bound.update_sigma_ = bound.sigma_"),
    ("FoolsGold without its pardon", FED + "aggregators/robust.py",
     "cs = np.where(v[j] > v[i], cs * v[i] / np.maximum(v[j], 1e-300), cs)", "cs = cs"),
    ("clip ignores the bias part", FED + "aggregators/weighted.py",
     'sq = np.einsum("ij,ij->i", dQ, dQ) + np.square(db)', 'sq = np.einsum("ij,ij->i", dQ, dQ)'),
    ("duplicate rows not merged", FED + "aggregators/weighted.py", "    if same.any():", "    if False:"),
    ("fixed-size sampling with jitter as Poisson", FED + "round/phases.py",
     "invited = pool[bernoulli_positions(len(pool), q, draw)]",
     "invited = np.sort(rng.choice(pool, size=min(len(pool), max(0, self.clients_per_round"
     " + int(rng.integers(-2, 3)))), replace=False))"),
    ("cohorts from the seed", FED + "round/phases.py",
     "draw = secret.uniform if self.secret else rng.random", "draw = rng.random"),
    ("epsilon one round short", FED + "aggregators/accounting.py",
     "        self.events.append([q, sigma, int(rounds)])",
     "        self.events.append([q, sigma, max(int(rounds) - 1, 0)])"),
    ("delta ignored", FED + "aggregators/accounting.py",
     "return float(compute_epsilon(orders, total, self.delta)[0])",
     "return float(compute_epsilon(orders, total, 0.1)[0])"),
    # hypergradient reports (reports.py): summed as the update is
    ("reports: DP noise dropped", FED + "aggregators/dp.py",
     "        return mean + dp_noise(len(mean), std, not self.insecure_seeded_noise,",
     "        return mean + 0 * dp_noise(len(mean), std, not self.insecure_seeded_noise,"),
    ("reports: DP clip skipped", FED + "aggregators/dp.py",
     "total = clipped(reports.jvp[ok], clip).sum(axis=0)",
     "total = reports.jvp[ok].sum(axis=0)"),
    ("reports: left out of the accountant", FED + "aggregators/dp_plan.py",
     "return [(q, 2.0 ** -0.5)], expected", "return [(q, 1.0)], expected"),
    ("reports: held-out cohorts fixed-size", FED + "algorithms/hyper.py",
     "poisson=dp, secret=aggregator.secret_sampling)",
     "poisson=False, secret=aggregator.secret_sampling)"),
    ("reports: secure mean taken in the clear", FED + "aggregators/secagg.py",
     "        return self.report_round(halves, job.session, enc, reports.clients, round_idx,\n"
     "                                 denominator)",
     "        return (reports.weights @ reports.jvp) / reports.weights.sum()"),
    ("reports: weighed by query size under DP", FED + "round/reports.py",
     "        r = np.ones(len(ok)) if self.max_weight is None else \\",
     "        r = reports.weights / 40.0 if self.max_weight is None else \\"),
    # secure aggregation: the protocol's promises
    ("secagg: a client reveals both secrets of a dropped client", FED + "aggregators/secagg_protocol.py",
     "for v in sorted(set(u3) & set(self._held))})",
     "for v in self._u2})"),
    ("secagg: a client answers the unmasking round twice", FED + "aggregators/secagg_protocol.py",
     "        if self._answered:", "        if False:"),
    ("secagg: unmasking without t signatures", FED + "aggregators/secagg_protocol.py",
     "        if len(good & set(u3)) < self.t:", "        if False:"),
    ("secagg: mask seeds not from the OS", FED + "aggregators/secagg_protocol.py",
     "self._s_seed, self._b_seed = os.urandom(SEED_BYTES), os.urandom(SEED_BYTES)",
     "self._s_seed, self._b_seed = bytes(SEED_BYTES), bytes(SEED_BYTES)"),
    ("secagg: masks from a NumPy generator, not AES-CTR", FED + "aggregators/secagg_masks.py",
     '    enc.update_into(_zeros(4 * size), memoryview(out).cast("B"))\n    return out[:size]',
     "    return np.random.default_rng(list(seed_key)).integers(0, 2**32, size, "
     "dtype=np.uint64).astype(np.uint32)"),
    ("secagg: Shamir coefficients not random", FED + "aggregators/shamir.py",
     "    coef = field_elements((t - 1, len(const)))",
     "    coef = np.zeros((t - 1, len(const)), np.int64)", TESTS + ["tests/test_shamir.py"]),
    ("secagg: Shamir coefficients from a seeded generator", FED + "aggregators/shamir.py",
     "    coef = field_elements((t - 1, len(const)))",
     "    coef = np.random.default_rng(0).integers(0, P, (t - 1, len(const)))",
     TESTS + ["tests/test_shamir.py"]),
    ("secagg: a threshold of half the cohort accepted", FED + "aggregators/secagg.py",
     "return t if h / 2 < t <= h and m >= self.min_cohort else None",
     "return t if t <= h and m >= self.min_cohort else None"),
    ("secagg: min_cohort ignored", FED + "aggregators/secagg.py",
     "return t if h / 2 < t <= h and m >= self.min_cohort else None",
     "return t if h / 2 < t <= h else None"),
    ("secagg: clipping not counted", FED + "round/client_steps.py",
     "out[:, -1] = np.count_nonzero(out[:, :-1] != rows, axis=1)", "out[:, -1] = 0"),
    ("secagg: the self-mask key independent of b_u", FED + "aggregators/secagg_protocol.py",
     "add_mask(y, self_mask_key(self._b_seed, self.session), +1, scratch)",
     "add_mask(y, self_mask_key(bytes(SEED_BYTES), self.session), +1, scratch)"),
    ("secagg: the pair key independent of the X25519 secret",
     FED + "aggregators/secagg_protocol.py",
     "    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_pk))",
     "    shared = bytes(32)"),
    ("secagg: consistency signatures not verified", FED + "aggregators/secagg_protocol.py",
     '            self._verify(sig.client, sig.signature, msg, "consistency signature")',
     "            pass"),
    ("secagg: a share reflected to its sender accepted", FED + "aggregators/secagg_protocol.py",
     "            if plain[:16] != _ints([v, self.id]):", "            if False:"),
    ("dp: the adaptive clip count released without noise", FED + "aggregators/dp.py",
     "        share = (self.unclipped_ + noise) / (self.q * self.context.n_eligible) + 0.5",
     "        share = self.unclipped_ / (self.q * self.context.n_eligible) + 0.5"),
    ("dp: the clients' loss sent inside the masked sum", FED + "aggregators/secagg_client.py",
     "        if self.clip is not None:  # under DP the loss is outside ε: not sent (the round's",
     "        if False:"),
    ("dp: the clip count's device noise share dropped", FED + "aggregators/secagg_client.py",
     "                NoiseShare(1, self.count_noise_std, self.secret_noise, (*self.seed, 0xC1),",
     "                NoiseShare(1, 0.0, self.secret_noise, (*self.seed, 0xC1),"),
    ("dp: rounds released before a crash not composed", FED + "round/loop.py",
     "            self.compose_orphans(run, done)", "            pass"),
    ("dp: epsilon against the server taken with amplification", FED + "round/loop.py",
     "            acc.compose(1.0, sigma, k)", "            acc.compose(0.05, sigma, k)"),
    # the device's own policy against a server that deviates
    ("device: a cohort below its minimum shared with", FED + "round/device.py",
     "        if advertised < self.min_cohort:", "        if False:"),
    ("device: a threshold below 2h/3 accepted", FED + "round/device.py",
     "        if t < self.least_threshold(holders):", "        if False:"),
    ("device: a second answer to a round or model", FED + "round/device.py",
     '            why = "one_answer" if seen & set(keys) else \\',
     '            why = None if seen & set(keys) else \\'),
    ("device: a noise share below its sigma accepted", FED + "round/device.py",
     "        if enc.noise_std < need * (1 - 1e-9):", "        if False:"),
    ("device: too few survivors unmasked", FED + "round/device.py",
     "        if survivors < self.min_cohort:", "        if False:"),
    # the Flower node's device steps (their own, faster test selection)
    ("flower: a node forgets what it answered", "fedcf/flower/secure.py",
     "        keep_device(state, device)\n", "        pass\n", FLOWER_TESTS),
    ("flower: a node takes a seeded noise share", "fedcf/flower/secure.py",
     "    if enc.noise_std > 0 and not enc.secret_noise:\n        raise NodeProtocolError(\"the "
     "server asked for seeded noise shares; a device draws its \"\n"
     "                                \"share of the DP noise from its own secure randomness\")"
     "\n    return dataclasses.replace(enc, secret_noise=True, seed=tuple(enc.seed))\n\n\n"
     "def read_report_encoding",
     "    return enc\n\n\ndef read_report_encoding", FLOWER_TESTS),
    ("flower: a node's policy taken from the message", "fedcf/flower/secure.py",
     "        device = node_device(state, node_config)",
     "        device = node_device(state, config)", FLOWER_TESTS),
    ("flower: pinned keys not checked", "fedcf/flower/secure.py",
     '            if (node_config or {}).get("pinned-keys"):  # only keys its federation vouched for',
     "            if False:", ["tests/test_flower_keys.py"]),
    ("flower: pinned list ignored (any endorsing key taken)", "fedcf/flower/keys.py",
     "len(e) != ENDORSEMENT_BYTES or bytes(e[:32]) not in pinned:",
     "len(e) != ENDORSEMENT_BYTES:", ["tests/test_flower_keys.py"]),
    ("flower: evaluation sums over fewer users than min_cohort", FED + "round/device.py",
     "        if int(keep.sum()) < self.policy.min_cohort:", "        if False:", EVAL_TESTS),
    ("flower: a user's evaluation sums given twice on one model", FED + "round/device.py",
     "        keep = np.array([key not in self.answered.get(c, ()) for c in clients.tolist()], bool)",
     "        keep = np.ones(len(clients), bool)", EVAL_TESTS),
    ("early stopping: held-out losses sent in the clear under DP", FED + "algorithms/fedrecon.py",
     "and (agg.secure or self._dp_release()):", "and agg.secure:", ES_TESTS),
    ("early stopping: \"auto\" holds users out under secure aggregation",
     FED + "algorithms/early_stopping.py", "eligible >= AUTO_MIN_USERS and not agg.secure",
     "eligible >= AUTO_MIN_USERS", ES_TESTS),
]


def run_mutant(name, rel, old, new, tests) -> dict:
    path = ROOT / rel
    original = path.read_text()
    if original.count(old) != 1:
        raise SystemExit(f"mutant {name!r}: the text to change is not found once in {rel} (the "
                         "code moved: update MUTANTS)")
    t0 = time.perf_counter()
    try:
        path.write_text(original.replace(old, new))
        res = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                              *tests], cwd=ROOT, capture_output=True, text=True)
    finally:
        path.write_text(original)
    last = (res.stdout.strip().splitlines() or [""])[-1]
    return {"mutant": name, "file": rel, "killed": res.returncode != 0, "summary": last,
            "seconds": time.perf_counter() - t0, **({} if tests == TESTS else {"tests": tests})}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--only", help="run the mutants whose name contains this text")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or args.only in m[0]]
    rows = []
    for m in chosen:
        rows.append(run_mutant(*m[:4], m[4] if len(m) > 4 else TESTS))
        r = rows[-1]
        print(f"{'killed  ' if r['killed'] else 'SURVIVED'} {r['mutant']:45s} {r['summary']}",
              flush=True)
    survived = [r["mutant"] for r in rows if not r["killed"]]
    print(f"{len(rows) - len(survived)} of {len(rows)} mutants killed"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    if args.json:
        from fedcf.provenance import run_meta, write_json

        write_json(args.json, {"meta": run_meta("mutants.py", argv), "tests": TESTS,
                               "rows": rows})
    return rows


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "mutants.py")
