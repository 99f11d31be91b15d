"""A real Flower deployment on this machine: a SuperLink and SuperNodes as separate processes on
127.0.0.1, the fedcf app submitted with ``flwr run``, the result read back, everything shut down.

    python scripts/flower_deploy.py --nodes 2 --rounds 3 --json /tmp/deploy.json

By default every connection is TLS (a throw-away CA and a SuperLink certificate for
127.0.0.1/localhost, made here with ``cryptography``) and SuperNodes authenticate: the SuperLink
runs with ``--enable-supernode-auth``, each node's P-384 public key is registered with ``flwr
supernode register`` before it starts with its private key, and only registered nodes are let
in (``--intruders N`` starts unregistered nodes to show it). ``--insecure`` runs plain HTTP
instead (loopback only). Each process runs in its own process group under a deadline and is
killed with its children (the ``flwr-serverapp`` / ``flwr-clientapp`` processes) when the run
ends or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {seconds:g} s")


def _ps() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of each live process (Linux ``ps``)."""
    ps = subprocess.run(["ps", "-eo", "pid=,ppid=,pgid=,stat="], capture_output=True,
                        text=True).stdout
    return [(int(a), int(b), int(c)) for a, b, c, st in (line.split()[:4]
                                                        for line in ps.splitlines())
            if not st.startswith("Z")]


def members(groups) -> set[int]:
    """The live processes of the given process groups."""
    return {pid for pid, _, group in _ps() if group in groups}


def family_groups(roots) -> set[int]:
    """The process groups of ``roots`` and of all their live descendants: the SuperLink starts
    its SuperExec (which starts ``flwr-serverapp``) in a session of its own, out of the
    SuperLink's group, and only its parent link finds it."""
    table, family = _ps(), set(roots)
    while True:
        more = {pid for pid, parent, _ in table if parent in family} - family
        if not more:
            return set(roots) | {group for pid, _, group in table if pid in family}
        family |= more


def listening(groups) -> list[str]:
    """The TCP addresses that processes of the given process groups listen on (``ss``)."""
    pids = members(groups)
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    out = set()
    for line in ss.splitlines():
        owners = {int(x.split(",")[0]) for x in line.split("pid=")[1:]}
        if owners & pids:
            out.add(line.split()[3])
    return sorted(out)


def tool(name: str) -> str:
    """A Flower command beside this Python (a venv used without activating it), else PATH's."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def stop(procs, grace: float = 5.0) -> set[int]:
    """SIGTERM each process group of ``procs`` and of their descendants (``family_groups``),
    then SIGKILL what is left after ``grace`` seconds; return the groups once none of their
    processes is alive (children such as ``flwr-clientapp`` and the SuperLink's detached
    ``flwr-serverapp`` included), or after another ``grace`` seconds."""
    groups = family_groups({p.pid for p in procs})
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (any(p.poll() is None for p in procs)
                                               or members(groups)):
            time.sleep(0.1)
    return groups


def credentials(folder: Path, nodes: int) -> dict:
    """A CA, the SuperLink's TLS certificate for 127.0.0.1/localhost signed by it, and a P-384
    key pair per SuperNode (OpenSSH format, as ``flwr supernode register`` takes)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject, key, issuer, issuer_key, extensions):
        b = x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(
            key.public_key()).serial_number(x509.random_serial_number()).not_valid_before(
            now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(issuer_key, hashes.SHA256())

    def pem_key(key):
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key, srv_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedcf test CA")])
    ca = cert(ca_name, ca_key, ca_name, ca_key, [(x509.BasicConstraints(ca=True, path_length=None),
                                                  True)])
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                       x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    srv = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), srv_key,
               ca_name, ca_key, [(san, False)])
    out = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    out["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out["cert"].write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    out["key"].write_bytes(pem_key(srv_key))
    for k in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        (folder / f"node{k}").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption()))
        (folder / f"node{k}.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
        out[f"node{k}"] = folder / f"node{k}"
    return out


def device_files(folder, data: dict, nodes: int) -> tuple[list[str], str]:
    """Give each of ``nodes`` devices its own users' ratings of the dataset ``data`` names (a
    MovieLens ratings.csv in its own folder) and write the run's catalog: the SuperNodes'
    ``--node-config`` strings and the catalog's path. The server never names the devices'
    data; it sends the catalog (run config ``catalog-path``)."""
    from fedcf.flower.node import load_dataset

    folder = Path(folder)
    full = load_dataset(data)
    df = full.to_dataframe().rename(columns={"user": "userId", "item": "movieId"})
    configs = []
    for k in range(nodes):
        path = folder / f"device{k}" / "ratings.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        df[df.userId.isin(full.user_ids[k::nodes])].to_csv(path, index=False)
        configs.append(f'data-path="{path}"')
    catalog = folder / "catalog.txt"
    catalog.write_text("\n".join(str(i) for i in full.item_ids) + "\n")
    return configs, str(catalog)


SCENARIOS = ("restart", "stall", "liar", "overlap", "fabricated")


def hostile_warm(address: str) -> int:
    """A dishonest device's warm process: fedcf's, except that every upload it sends carries
    its clients' item deltas negated and scaled 1000-fold (``--scenario fabricated``)."""
    from dataclasses import replace

    from fedcf.flower import node, warm

    honest = node.encode_upload
    node.encode_upload = lambda out: honest(replace(out, d_Q=out.d_Q * -1e3))
    return warm.main(["--runtime-api-address", address, "--insecure"])


def hostile_files(folder, node_configs: list[str], scenario: str) -> list[str]:
    """The devices' files of a scenario with a dishonest device (``device_files``' honest ones
    changed): ``liar`` adds a registered device holding one user whose ratings are ±10⁶ (its
    claims to the directory follow from its file); ``fabricated`` adds one holding four times
    a device's users, made up (its warm process is ``hostile_warm``); ``overlap`` copies the
    first device's first user into the last device's file (both devices claim that user)."""
    import pandas as pd

    paths = [Path(c.split('"')[1]) for c in node_configs]
    first = pd.read_csv(paths[0])
    if scenario == "liar":
        items = first.movieId.unique()[:3]
        lie = pd.DataFrame({"userId": int(first.userId.max()) + 10**6, "movieId": items,
                            "rating": [1e6, -1e6, 1e6][:len(items)], "timestamp": 0})
        path = Path(folder) / f"device{len(paths)}" / "ratings.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        lie.to_csv(path, index=False)
        return node_configs + [f'data-path="{path}"']
    if scenario == "fabricated":  # 4x a device's users, plausible ratings, 20 each
        n = 4 * first.userId.nunique()
        rng = np.random.default_rng(0)
        users = np.repeat(np.arange(n) + int(first.userId.max()) + 10**6, 20)
        fake = pd.DataFrame({"userId": users, "movieId": rng.choice(
            first.movieId.unique(), len(users)), "rating": rng.integers(1, 6, len(users)),
            "timestamp": 0}).drop_duplicates(["userId", "movieId"])
        path = Path(folder) / f"device{len(paths)}" / "ratings.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        fake.to_csv(path, index=False)
        return node_configs + [f'data-path="{path}"']
    if scenario == "overlap":
        last = pd.read_csv(paths[-1])
        shared = first[first.userId == first.userId.iloc[0]]
        pd.concat([last, shared]).to_csv(paths[-1], index=False)
        return node_configs
    raise ValueError(f"no devices' files to change for scenario {scenario!r}")


def honest_users_rmse(data: dict, deployed, honest) -> dict:
    """ReconEval (half of each user's ratings as support) over every honest user, of the
    deployed model and of the honest in-process fit: a comparison on the same users whatever
    users a dishonest device added to the run."""
    from fedcf.eval.protocols import federated_recon_eval
    from fedcf.flower.node import load_dataset

    full = load_dataset(data)
    return {name: federated_recon_eval(m, full, seed=0, support_fraction=0.5)["rmse"]
            for name, m in (("deployed", deployed), ("honest_fit", honest))}


def node_costs(folder, nodes: int) -> list[dict]:
    """What each message cost the device that answered it, as the nodes logged it on their own
    machine (``fedcf.flower.app.node_cost``: nothing of it was sent to the server)."""
    out = []
    for k in range(nodes):
        path = Path(folder) / f"node{k}_cost.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        out += [{"node": k, **json.loads(line)} for line in lines if line.strip()]
    return out


def cost_summary(costs: list[dict], warm: dict | None) -> dict:
    """Per message type: messages, median handler and start-up seconds, largest peak memory;
    with a warm device process (``fedcf.flower.warm``), the medians of its whole tasks' wall
    and CPU seconds (pull, handler, reply) too. ``warm``: ``warm_train_cost``, the train handler's
    wall and CPU seconds in this process: what the same work costs with no Flower around it."""
    out = {}
    handled = [c for c in costs if "seconds" in c]
    for kind in sorted({c["message"] for c in handled}):
        mine = [c for c in handled if c["message"] == kind]
        starts = [c["startup_seconds"] for c in mine if c["startup_seconds"] is not None]
        tasks = [c for c in costs if "task_seconds" in c and c["message"] == kind]
        out[kind] = {"messages": len(mine),
                     "handler_seconds": float(np.median([c["seconds"] for c in mine])),
                     "startup_seconds": float(np.median(starts)) if starts else None,
                     "task_seconds": float(np.median([c["task_seconds"] for c in tasks]))
                     if tasks else None,
                     "task_cpu_seconds": float(np.median([c["task_cpu_seconds"] for c in tasks]))
                     if tasks else None,
                     "task_requests": float(np.median([c["requests"] for c in tasks]))
                     if tasks else None,
                     "peak_rss_mib": float(max(c["peak_rss_mib"] for c in mine))}
    if "train" in out:
        out["train"]["warm_process_seconds"] = None if warm is None else warm["wall"]
        out["train"]["warm_process_cpu_seconds"] = None if warm is None else warm["cpu"]
    return out


def warm_train_cost(device_file, catalog_file, params: dict, n_users: int, model) -> dict:
    """The train handler's work for ``n_users`` users of one device, in this (warm) process:
    what a message costs with no Flower around it. Medians of 5 after a warm-up: ``wall`` and
    ``cpu`` seconds (the CPU of every thread, Numba's included, as a node's task is counted)."""
    from fedcf import FedReconMF
    from fedcf.flower.node import node_data, train
    from fedcf.flower.settings import Settings
    from fedcf.flower.wire import arrays, client_params

    catalog = np.loadtxt(catalog_file, dtype=np.int64, ndmin=1)
    own = node_data({}, {"data-path": str(device_file)}, None, catalog)
    est = FedReconMF(**Settings(params=dict(params)).check().params)
    users = own.user_ids[:n_users]
    config = {"users": [int(u) for u in users], "clients": list(range(len(users))),
              "params": client_params(est), "mu": float(model.global_mean_)}
    glob = arrays(Q=model.item_factors_, b=model.item_biases_, ids=np.array([0, 1], np.uint64))
    wall, cpu = [], []
    for _ in range(6):
        t0, c0 = time.perf_counter(), time.process_time()
        train(node_data({}, {"data-path": str(device_file)}, None, catalog), config, glob)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"wall": float(np.median(wall[1:])), "cpu": float(np.median(cpu[1:]))}


def release_session(superlink: str, creds: dict, k: int, log: Path) -> bool | None:
    """What a restarted device's supervisor does first: end the session its killed
    SuperNode ``k`` left open (its node id from that node's log, signed with its own key).
    None if the log named no id."""
    from fedcf.flower.release import node_id_from_log, release_node

    node_id = node_id_from_log(log)
    return None if node_id is None else release_node(superlink, creds[f"node{k}"], node_id,
                                                     root_certificates=creds["ca"])


def superlink_args(creds: dict | None, link: int, folder: Path) -> list[str]:
    """The SuperLink's command line: TLS and node authentication with ``creds``, else plain."""
    tls = ["--ssl-ca-certfile", str(creds["ca"]), "--ssl-certfile", str(creds["cert"]),
           "--ssl-keyfile", str(creds["key"]), "--enable-supernode-auth"] if creds \
        else ["--insecure"]
    return [tool("flower-superlink"), *tls, "--host", "127.0.0.1", "--port", str(link),
            "--database", str(folder / "state.db"), "--disable-runtime-dependency-installation"]


def supernode_args(creds: dict | None, k: int, link: int, port: int, node_config: str,
                   warm: bool = False) -> list[str]:
    """SuperNode ``k``'s command line: its key with ``creds``, else plain; with ``warm`` it
    starts no executor of its own (``--isolation process``: ``warm_args``'s process answers)."""
    tls = ["--root-certificates", str(creds["ca"]), "--auth-supernode-private-key",
           str(creds[f"node{k}"])] if creds else ["--insecure"]
    return [tool("flower-supernode"), *tls, "--superlink", f"127.0.0.1:{link}", "--host",
            "127.0.0.1", "--port", str(port), "--node-config", node_config,
            *(["--isolation", "process"] if warm else [])]


def warm_args(port: int) -> list[str]:
    """The warm device process (``fedcf.flower.warm``) of the SuperNode whose runtime API is
    on 127.0.0.1:``port`` (plain HTTP on loopback: it never leaves the device)."""
    return [sys.executable, "-m", "fedcf.flower.warm", "--runtime-api-address",
            f"127.0.0.1:{port}", "--insecure"]


def flwr_home(folder: Path, link: int, creds: dict | None) -> Path:
    """FLWR_HOME with the ``flwr`` connection ``local`` to the SuperLink."""
    home = folder / "flwr_home"
    home.mkdir(parents=True, exist_ok=True)
    tls = f'root-certificates = "{creds["ca"]}"\n' if creds else "insecure = true\n"
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{link}"\n'
        + tls)
    return home


def prepare(folder, *, nodes: int, run_config: dict, node_configs: list[str],
            warm: bool = False) -> str:
    """Write everything a deployment needs into ``folder`` (certificates and node keys, the
    devices' files, the catalog, the app, FLWR_HOME) and return the shell commands that start
    it and run the app, for an operator to run by hand."""
    import shlex

    from fedcf.flower import write_app

    folder = Path(folder).resolve()
    creds = credentials(folder / "credentials", nodes)
    home, link = flwr_home(folder, 9093, creds), 9093
    app = write_app(folder / "app", **{**run_config, "min-nodes": nodes,
                                       "result-path": str(folder / "result.json")})
    line = " ".join
    cmds = [f"export FLWR_HOME={shlex.quote(str(home))}",
            line(map(shlex.quote, superlink_args(creds, link, folder))) + " &", "sleep 5"]
    cmds += [line(map(shlex.quote, [tool("flwr"), "supernode", "register",
                                    str(creds[f"node{k}"]) + ".pub", "local"]))
             for k in range(nodes)]
    for k in range(nodes):
        cmds.append(line(map(shlex.quote, supernode_args(creds, k, link, 9401 + k,
                                                         node_configs[k], warm))) + " &")
        if warm:  # the node's one warm process, once its runtime API listens
            cmds += ["sleep 3", line(map(shlex.quote, warm_args(9401 + k))) + " &"]
    cmds += [f"{shlex.quote(tool('flwr'))} run {shlex.quote(str(app))} local --stream"]
    return "\n".join(cmds)


@dataclass
class Scenario:
    """What happens to the last node while the run trains (each triggered by the arrival of a
    message group in its log, e.g. ``round-1`` or a secure-aggregation step): ``kill_at``
    kills it (``kill_signal``); ``restart_at`` kills it and starts it again at once with the
    same key and data (it keeps its node id, not its state), again every 2 s while the
    SuperLink refuses it — with ``release`` the device first ends its killed session itself
    (``fedcf.flower.release``); ``stall_at`` stops it (SIGSTOP) and continues it
    ``stall_seconds`` later."""

    kill_at: str | None = None
    kill_signal: int = signal.SIGKILL
    restart_at: str | None = None
    stall_at: str | None = None
    stall_seconds: float = 0.0
    release: bool = True


class Deployment:
    """A SuperLink and its SuperNodes as processes on 127.0.0.1 in ``folder`` (one log per
    process there), each started under ``timeout`` so that none outlives the deadline, and
    a device's SuperNode and warm process signalled together."""

    def __init__(self, folder, *, nodes, run_config, deadline, secure, intruders, node_configs,
                 warm, hostile):
        from fedcf.flower import write_app

        self.folder, self.nodes, self.deadline = Path(folder), nodes, deadline
        self.secure, self.intruders, self.warm, self.hostile = secure, intruders, warm, hostile
        self.node_configs = node_configs
        self.link = free_port()
        self.creds = credentials(self.folder / "credentials", nodes + intruders) if secure \
            else None
        self.env = {**os.environ,
                    "FLWR_HOME": str(flwr_home(self.folder, self.link, self.creds)),
                    "PYTHONUNBUFFERED": "1",  # Flower's own children too
                    "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                             os.environ.get("PATH", "")])}
        self.result_path = self.folder / "result.json"
        self.app = write_app(self.folder / "app", **{**run_config, "min-nodes": nodes,
                                                     "result-path": str(self.result_path)})
        self.procs, self.outside, self.t0 = [], set(), time.monotonic()
        self.node_procs, self.warm_procs, self.node_args, self.events = {}, {}, {}, {}
        self.victim = nodes - 1

    def start(self, name, args, extra_env=None):
        log = open(self.folder / f"{name}.log", "w")
        limit = ["timeout", "-s", "KILL", str(int(self.deadline) + 30)]
        self.procs.append(subprocess.Popen(limit + args, stdout=log, stderr=subprocess.STDOUT,
                                           env={**self.env, **(extra_env or {})},
                                           cwd=self.folder, start_new_session=True))
        return self.procs[-1]

    def device(self, k) -> list:
        """Device ``k``'s processes: its SuperNode and (with ``warm``) its warm process."""
        return [p for p in (self.node_procs[k], self.warm_procs.get(k)) if p is not None]

    def start_device(self, k, suffix=""):
        """SuperNode ``k`` (and its warm process): started, or started again after a kill."""
        cost_log = {"FEDCF_NODE_COST_LOG": str(self.folder / f"node{k}_cost.jsonl")}
        args, port = self.node_args[k]
        self.node_procs[k] = self.start(f"supernode{k}{suffix}", args, cost_log)
        if self.warm and k < self.nodes:
            wait_port(port, self.node_procs[k], 60)
            args = [sys.executable, str(Path(__file__).resolve()), "--hostile-warm",
                    f"127.0.0.1:{port}"] if k == self.hostile else warm_args(port)
            self.warm_procs[k] = self.start(f"warm{k}{suffix}", args, cost_log)

    def signal_device(self, k, sig):
        for p in self.device(k):
            if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
                self.outside.add(p.pid)
            elif sig == signal.SIGCONT:
                self.outside.discard(p.pid)
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:  # gone already
                pass

    def restart_device(self, k, sig, release: bool):
        self.signal_device(k, sig)
        for p in self.device(k):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:  # as a supervisor does: then SIGKILL
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        if self.secure and release:  # the device ends its killed session with its own key
            try:
                done = release_session(f"127.0.0.1:{self.link}", self.creds, k,
                                       self.folder / f"supernode{k}.log")
            except (PermissionError, ConnectionError, ValueError) as exc:
                done = f"refused: {exc}"  # started anyway: the SuperLink times the session out
            self.events["restarted"]["released"] = done
        try:
            self.start_device(k, "_restarted")
        except RuntimeError:  # refused before its runtime API listened: the next attempt
            pass

    def register(self, k):
        """Node ``k``'s key registered through the Control API (intruders' never are)."""
        reg = subprocess.run([tool("flwr"), "supernode", "register",
                              str(self.creds[f"node{k}"]) + ".pub", "local"], env=self.env,
                             cwd=self.folder, capture_output=True, text=True, timeout=60)
        if reg.returncode != 0:
            raise RuntimeError(f"flwr supernode register failed: {reg.stdout}{reg.stderr}")

    def launch(self):
        """The SuperLink, every node (registered ones and intruders), then ``flwr run``."""
        sl = self.start("superlink", superlink_args(self.creds, self.link, self.folder))
        wait_port(self.link, sl, 60)
        for k in range(self.nodes + self.intruders):
            if self.secure and k < self.nodes:
                self.register(k)
            port = free_port()
            config = self.node_configs[k % self.nodes] if self.node_configs else \
                f"partition-id={k % self.nodes} num-partitions={self.nodes}"
            self.node_args[k] = (supernode_args(self.creds, k, self.link, port, config,
                                                self.warm), port)
            self.start_device(k)
            if k >= self.nodes:
                self.outside.add(self.node_procs[k].pid)
        run = subprocess.run([tool("flwr"), "run", str(self.app), "local"], env=self.env,
                             cwd=self.folder, capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            raise RuntimeError(f"flwr run failed ({run.returncode}): {run.stdout}{run.stderr}")
        return run

    def arrived(self, group) -> bool:
        return f"ROUND {group}]" in (self.folder / f"supernode{self.victim}.log").read_text()

    def step(self, sc: Scenario, now: float):
        """One look at the run: the scenario's next event, if its moment has come."""
        ev, v = self.events, self.victim
        if sc.kill_at and "killed" not in ev and self.arrived(sc.kill_at):
            self.signal_device(v, sc.kill_signal)
            ev["killed"] = {"group": sc.kill_at, "seconds": now}
        if sc.restart_at and "restarted" not in ev and self.arrived(sc.restart_at):
            ev["restarted"] = {"group": sc.restart_at, "seconds": now, "attempts": 1}
            self.restart_device(v, sc.kill_signal, sc.release)
        elif "restarted" in ev and "rejoined" not in ev and \
                self.node_procs[v].poll() is not None:
            # its supervisor's part: the SuperLink refuses a node id whose killed session
            # it still counts as online (Flower: until two missed 30 s heartbeats)
            time.sleep(2)
            self.restart_device(v, signal.SIGKILL, False)
            ev["restarted"]["attempts"] += 1
        elif "restarted" in ev and "rejoined" not in ev and "SuperNode ID" in \
                (self.folder / f"supernode{v}_restarted.log").read_text():
            ev["rejoined"] = {"seconds": now}  # the SuperLink let it in again
        if sc.stall_at and "stalled" not in ev and self.arrived(sc.stall_at):
            self.signal_device(v, signal.SIGSTOP)
            ev["stalled"] = {"group": sc.stall_at, "seconds": now}
        if "stalled" in ev and "resumed" not in ev and \
                now - ev["stalled"]["seconds"] >= sc.stall_seconds:
            self.signal_device(v, signal.SIGCONT)
            ev["resumed"] = {"seconds": now}

    def watch(self, sc: Scenario) -> dict:
        """Play the scenario until the ServerApp writes its result; a process that exits
        early (not one the scenario stopped) or the deadline ends the run with an error."""
        while not self.result_path.exists():
            now = time.monotonic() - self.t0
            self.step(sc, now)
            if now > self.deadline:
                raise TimeoutError(f"no result after {self.deadline:g} s; logs in {self.folder}")
            rejoining = {p.pid for p in self.device(self.victim)} \
                if "restarted" in self.events and "rejoined" not in self.events else set()
            gone = [p for p in self.procs
                    if p.pid not in self.outside | rejoining and p.poll() is not None]
            if gone:
                raise RuntimeError(f"a Flower process exited early ({gone[0].args[4:6]}, code "
                                   f"{gone[0].returncode}); logs in {self.folder}")
            time.sleep(1)
        return json.loads(self.result_path.read_text())

    def listening(self) -> list[str]:
        return listening(family_groups({p.pid for p in self.procs}))

    def close(self) -> set[int]:
        """Stop every process (a stopped device is continued first, so that it can be
        stopped); the process groups stopped."""
        for k in self.node_procs:
            self.signal_device(k, signal.SIGCONT)
        return stop(self.procs)


def deploy(folder, *, nodes: int = 2, run_config: dict, deadline: float = 300.0,
           secure: bool = True, intruders: int = 0, node_configs: list[str] | None = None,
           warm: bool = False, hostile: int | None = None, scenario: Scenario | None = None
           ) -> dict:
    """Start the SuperLink and ``nodes`` SuperNodes, ``flwr run`` the app with ``run_config``,
    wait for its result file; always stop every process. With ``secure`` (the default) every
    connection is TLS and only registered SuperNodes get in; ``intruders`` more nodes start
    with keys nobody registered. ``node_configs``: each SuperNode's ``--node-config`` (e.g.
    ``device_files``'s: a device holding its own data; an intruder gets node 0's); by default
    node k holds partition k of the run's dataset (the simulation harness). ``warm``: each
    SuperNode's messages are answered by one long-lived ``fedcf.flower.warm`` process (its
    own process group, started after the node) instead of a fresh process per message.
    ``hostile``: the node whose warm process is ``hostile_warm``'s (with ``warm``).
    ``scenario``: what happens to the last node (``Scenario``). Returns the ServerApp's result
    plus the addresses the processes listened on and the seconds taken."""
    sc = scenario or Scenario()
    d = Deployment(folder, nodes=nodes, run_config=run_config, deadline=deadline,
                   secure=secure, intruders=intruders, node_configs=node_configs, warm=warm,
                   hostile=hostile)
    try:
        run = d.launch()
        addresses = d.listening()
        result = d.watch(sc)
        addresses = sorted(set(addresses) | set(d.listening()))
    finally:
        groups = d.close()
    turned_away = sum("Failed to activate SuperNode" in
                      (d.folder / f"supernode{k}.log").read_text()
                      for k in range(nodes, nodes + intruders))
    killed = d.events.pop("killed", None)
    result.update(node_costs=node_costs(d.folder, nodes), listening=addresses,
                  deploy_seconds=time.monotonic() - d.t0, killed_node_at=killed,
                  intruders_turned_away=turned_away, device_events=d.events,
                  left_running=sorted(members(groups)),
                  detached_groups_stopped=len(groups - {p.pid for p in d.procs}),
                  flwr_run_output=run.stdout.strip().splitlines()[-1:])
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients-per-round", type=int, default=20)
    ap.add_argument("--dataset", default="synthetic", choices=["synthetic", "ml-100k", "file"])
    ap.add_argument("--data-path", default="")
    ap.add_argument("--deadline", type=float, default=300.0)
    ap.add_argument("--folder", default=None)
    ap.add_argument("--insecure", action="store_true", help="plain HTTP, no node authentication")
    ap.add_argument("--intruders", type=int, default=0,
                    help="also start this many SuperNodes whose keys are not registered")
    ap.add_argument("--secure-aggregation", action="store_true",
                    help="train under SecureAggregation (the nodes mask; the server sums)")
    ap.add_argument("--precision", type=int, default=None,
                    help="with --secure-aggregation: SecureAggregation's precision (compact "
                    "words of value_bound·2^-p steps; default: 4-byte words)")
    ap.add_argument("--kill-after-masking", action="store_true",
                    help="with --secure-aggregation: kill the last node once it has sent its "
                    "masked vectors in the last round")
    ap.add_argument("--reply-timeout", type=float, default=600.0)
    ap.add_argument("--device-data", action="store_true",
                    help="each SuperNode holds its own users' ratings in its own file (the "
                    "server sends the catalog); by default each loads the run's dataset and "
                    "keeps a partition")
    ap.add_argument("--prepare", action="store_true",
                    help="write the certificates, node keys, devices' files, catalog and app "
                    "into --folder and print the commands that start the deployment, then exit")
    ap.add_argument("--warm", action="store_true",
                    help="each SuperNode's messages are answered by one long-lived process "
                    "(fedcf.flower.warm, --isolation process) instead of a process per message")
    ap.add_argument("--scenario", choices=SCENARIOS, default=None,
                    help="a device that misbehaves (with --device-data): restart (the last "
                    "node killed in round 1 and started again), stall (the last node frozen "
                    "in round 1 for twice the reply timeout), liar (an extra registered device "
                    "whose one user rates ±10⁶), overlap (the last device also claims the "
                    "first device's first user)")
    ap.add_argument("--no-release", action="store_true",
                    help="with --scenario restart: the restarted device does not end its killed "
                    "session first (it waits for the SuperLink to time the session out)")
    ap.add_argument("--hostile-warm", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.hostile_warm:
        return {"hostile_warm_exit": hostile_warm(args.hostile_warm)}
    if args.scenario and not args.device_data:
        ap.error("--scenario needs --device-data (the devices' own files)")
    if args.scenario == "fabricated" and not args.warm:
        ap.error("--scenario fabricated needs --warm (the dishonest device is a warm process)")
    from fedcf import FedReconMF
    from fedcf.federated import DevicePolicy
    from fedcf.flower import fit_in_process
    from fedcf.provenance import report_result, run_meta

    folder = Path(args.folder or tempfile.mkdtemp(prefix="fedcf_deploy_"))
    params = {"n_factors": 20, "n_rounds": args.rounds, "clients_per_round":
              args.clients_per_round, "client_update": {"name": "sgd", "learning_rate": 0.1},
              "random_state": 0}
    if args.secure_aggregation:  # t > m/2 leaves room for a node of three to be lost
        params["aggregator"] = {"name": "secure", "threshold": 0.5, "value_bound": 10.0,
                                **({} if args.precision is None else
                                   {"precision": args.precision})}
    if args.scenario == "fabricated":  # the defence this threat needs (with the node cap)
        params["aggregator"] = {"name": "median", "row_clip": 1.0}
    data = {"dataset": args.dataset, "data-path": args.data_path, "synthetic-users": 200,
            "synthetic-items": 60, "synthetic-ratings": 4000}
    config = {**data, "fedcf-params": json.dumps(params), "eval-fraction": 0.1,
              "model-path": str(folder / "model.npz"), "reply-timeout": args.reply_timeout}
    kill = f"round-{args.rounds - 1}/consistency" if args.kill_after_masking else None
    node_configs = None
    if args.device_data:  # the run config names no dataset: the devices hold the ratings
        node_configs, catalog = device_files(folder / "devices", data, args.nodes)
        config = {**{k: v for k, v in config.items() if k not in data},
                  "catalog-path": catalog}
    if args.secure_aggregation:  # each device's own policy accepts that threshold
        node_configs = [f"{c} threshold=0.5" for c in node_configs or [
            f"partition-id={k} num-partitions={args.nodes}" for k in range(args.nodes)]]
    nodes = args.nodes
    if args.scenario in ("liar", "overlap", "fabricated"):
        node_configs = hostile_files(folder / "devices", node_configs, args.scenario)
        nodes = len(node_configs)
    if args.prepare:
        if not args.device_data:
            ap.error("--prepare writes the devices' files: add --device-data")
        print(prepare(folder, nodes=args.nodes, run_config=config, node_configs=node_configs,
                      warm=args.warm))
        return {"prepared": str(folder)}
    print(f"starting a SuperLink and {nodes} SuperNodes in {folder} (logs there) ...",
          file=sys.stderr, flush=True)
    scenario = Scenario(kill_at=kill,
                        restart_at="round-1" if args.scenario == "restart" else None,
                        stall_at="round-1" if args.scenario == "stall" else None,
                        stall_seconds=2 * args.reply_timeout, release=not args.no_release)
    out = deploy(folder, nodes=nodes, run_config=config, deadline=args.deadline,
                 secure=not args.insecure, intruders=args.intruders, node_configs=node_configs,
                 warm=args.warm, hostile=nodes - 1 if args.scenario == "fabricated" else None,
                 scenario=scenario)
    ref, ref_eval, _ = fit_in_process(  # the simulated devices take the nodes' policy
        params, data, 0.1, device_policy=DevicePolicy(threshold=0.5)
        if args.secure_aggregation else None)
    model = FedReconMF.load(out["model_path"])
    hist = out.pop("history")
    out = {"meta": run_meta("flower_deploy.py", argv, packages=("flwr",)), "dataset":
           args.dataset, "nodes": args.nodes, "tls_and_node_auth": not args.insecure,
           "intruders": args.intruders, "secure_aggregation": args.secure_aggregation,
           "precision": args.precision,
           "device_data": args.device_data, "warm": args.warm, "scenario": args.scenario,
           "release": not args.no_release,
           **out, "local_recon_eval": ref_eval,
           "identical_item_factors": bool(np.array_equal(model.item_factors_,
                                                         ref.item_factors_)),
           "rmse_vs_honest": out["recon_eval"]["rmse"] / ref_eval["rmse"] - 1,
           "honest_users_rmse": honest_users_rmse(data, model, ref),
           "clients_used_per_round": [r["clients_used"] for r in hist],
           "clients_sampled_per_round": [r["clients_sampled"] for r in hist],
           "round_seconds": [r["seconds"] for r in hist],
           "messages_per_round": [r["flower_messages"] for r in hist],
           "bytes_up_per_round": [r["flower_bytes_up"] for r in hist],
           "bytes_down_per_round": [r["flower_bytes_down"] for r in hist],
           "secagg": [{k: r[k] for k in r if k.startswith("secagg")} for r in hist]
           if args.secure_aggregation else None}
    warm = warm_train_cost(folder / "devices" / "device0" / "ratings.csv", catalog, params,
                           max(args.clients_per_round // args.nodes, 1), model) \
        if args.device_data else None
    out["device_cost"] = cost_summary(out.pop("node_costs"), warm)
    out.pop("model_path")
    return report_result(out, args.json)


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(main, "flower_deploy.py", strict=True)
